"""The prefix KV cache: a shared prefix (many-shot demonstrations) encoded once and reused
by every request that shares it, exactly as if each prompt were encoded whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evalsuite.backends.common.tokens import PREFIX_TAIL, TokenRules
from evalsuite.modeling import compat

from .loading import HFOptions


class PrefixCache:
    """Part of HFModel: requests grouped by their shared prefix, and one prefix's KV cache,
    kept across calls until another prefix replaces it."""

    def __init__(self, model: Any, tokens: TokenRules, options: HFOptions, device: torch.device, max_context: int):
        self.model = model
        self.tokens = tokens
        self.options = options
        self.device = device
        self.max_context = max_context
        self.current: Prefix | None = None  # the current shared prefix's cache
        self.usable = True  # False once a cache turned out not to be croppable (sliding-window layers...)
        self.prefilled_tokens = 0  # prefix tokens run through the model

    def groups(self, requests: Sequence[Any]) -> list[tuple[str | None, list[int]]]:
        """Request indices grouped by shared prefix, in order of first appearance, so the
        current prefix's cache serves its requests before the next prefix replaces it.
        Without the cache: one group, each request encoded whole."""
        if not self.options.prefix_cache:
            return [(None, list(range(len(requests))))]
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.prefix, []).append(i)
        return list(groups.items())

    def rows_for(self, prefix: str | None, requests: Sequence[Any], texts: list[str],
                 extra: Sequence[int] | None = None) -> tuple[Prefix | None, list[list[int]]]:
        """Token rows for one group: the parts after the prefix when its cached encoding can
        serve them (every part non-empty and, when `extra` tokens follow, prefix + part +
        extra within max_context), else whole prompts encoded as `encode_pair` does."""
        attention = self.attention_state() if prefix and self.usable else None
        if prefix and attention is not None:
            parts = [self.tokens.encode_after(prefix[-PREFIX_TAIL:], t, first=False) for t in texts]
            if all(parts):
                state = self.prefix_for(prefix, attention)
                longest = max(len(p) + e for p, e in zip(parts, extra or [0] * len(parts)))
                if state is not None and (extra is None or state.length + longest <= self.max_context):
                    return state, parts
        return None, [self.tokens.encode_pair(r.prefix, t) for r, t in zip(requests, texts)]

    def attention_state(self) -> Any:
        """What the cached keys and values depend on besides the tokens: the attention-logit
        quantization in force. None when a cache cannot reproduce a whole-prompt pass: a
        quantization scale shared by query rows (tensor, head) sees other rows in a pass that
        starts after the prefix, and an observer of the logits would see the prefix only once."""
        from . import quant

        hook = quant.active_hook(self.model)
        if hook is None:
            return quant.AttnQuant()
        if hook.observer is not None or (hook.quant.active and hook.quant.granularity != "row"):
            return None
        return hook.quant

    def prefix_for(self, prefix: str, attention: Any) -> Prefix | None:
        """The cached encoding of `prefix`, computed once and kept until another prefix comes."""
        if self.current is not None and self.current.text == prefix and self.current.attention == attention:
            return self.current
        self.current = None  # free the old cache first: one prefix in memory at a time
        state = self.encode_prefix(prefix, attention)
        if not compat.is_plain_cache(state.cache):
            self.usable = False  # sliding-window or recurrent layers: cannot crop or widen safely
            return None
        self.current = state
        return state

    @torch.inference_mode()
    def encode_prefix(self, prefix: str, attention: Any) -> Prefix:
        """One batch-1 pass over the prefix (in max_batch_tokens pieces), keeping its KV cache."""
        ids = self.tokens.encode(prefix)
        cache = None
        step = self.options.max_batch_tokens
        for start in range(0, len(ids), step):
            piece = torch.tensor([ids[start : start + step]], dtype=torch.long, device=self.device)
            self.prefilled_tokens += piece.shape[1]
            positions = torch.arange(start, start + piece.shape[1], device=self.device)[None]
            cache = compat.returned_cache(self.model(input_ids=piece, position_ids=positions, use_cache=True,
                                                     logits_to_keep=1, **compat.cache_argument(cache)))
        return Prefix(prefix, len(ids), cache, attention)


@dataclass
class Prefix:
    """A shared prefix encoded once: its length and its KV cache (batch 1)."""

    text: str
    length: int
    cache: Any
    attention: Any  # the attention quantization it was computed under

    def for_batch(self, size: int) -> Any:
        """The cache to continue from: the shared one itself for a single row (cropped back
        by `restore`), else a copy widened to `size` rows for this batch only."""
        if size == 1:
            return self.cache
        layers = [(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v in compat.cache_tensors(self.cache)]
        wide = compat.new_cache((k[:, :, :0], v[:, :, :0]) for k, v in layers)
        compat.set_cache_tensors(wide, layers)  # views: the model's first update copies them, once
        return wide

    def restore(self) -> None:
        """Drop what a single-row batch appended, back to the prefix alone."""
        extra = self.cache.get_seq_length() - self.length
        if extra > 0:
            self.cache.crop(-extra)
