"""TOKEN_NLL for the hf backend: the teacher-forced negative log-likelihood of every token of
a window, in memory linear in the window, never a (sequence x vocabulary) logits tensor.

How one window is scored:
- the decoder (the model without its head, `get_decoder()`) runs over the window to hidden
  states. With sdpa or flash attention it runs the whole window at once: causal attention
  without a mask takes their memory-efficient kernels, linear in the window. Eager attention
  would hold a window x window score map per head, so it goes `-M prefill_chunk` columns at a
  time over a KV cache (slices are not used otherwise: a slice needs an explicit slice x seen
  mask, which sends CPU sdpa to its math path and is slower and larger than one pass);
- the hidden states go through the head (lm_head) a few positions at a time, at most
  `LOGIT_CHUNK_BYTES` of float32 logits at once, and only the target token's log-probability
  is kept: nll = logsumexp(logits) - logits[target], computed in float32;
- one window per pass, without padding: no mask, no position shift, and the same values
  whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from evalsuite.errors import UserError
from evalsuite.modeling import compat

from .loading import HFOptions

LOGIT_CHUNK_BYTES = 64 << 20  # float32 logits held at once


class TokenNLL:
    """Part of HFModel: TOKEN_NLL."""

    def __init__(self, model: Any, options: HFOptions, device: torch.device):
        self.model = model
        self.options = options
        self.device = device

    @torch.inference_mode()
    def token_nll(self, windows: Sequence[Sequence[int]]) -> list[list[float]]:
        """For each window of token ids, -log p(window[i] | window[:i]) for i = 1 .. len - 1
        (natural log, float32 arithmetic): one teacher-forced pass per window.

        One window per pass, whatever the batch size: kernels chosen for another batch shape
        round differently (about 1e-6 here), and results must not depend on --batch-size; a
        long window fills the device on its own."""
        refuse_transformed_logits(self.model)
        out = []
        for window in windows:
            ids = torch.tensor([list(window)], dtype=torch.long, device=self.device)
            out.append(self._window_nll(ids)[0].tolist() if len(window) >= 2 else [])
        return out

    def _window_nll(self, ids: torch.Tensor) -> torch.Tensor:
        """(1, width - 1) float32 NLLs of a (1, width) window, on the CPU. The window is fed whole,
        its last token included though it predicts nothing, so one pass computes exactly what the
        plain forward pass computes; only a slice holding nothing but the last token is skipped."""
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        width = ids.shape[1]
        eager = compat.attention_implementation(self.model.config) == "eager"  # the one implementation quadratic in memory
        slice_width = self.options.prefill_chunk if eager else width
        one_pass = width <= slice_width  # no later slice needs the keys and values: keep no cache
        cache = None if one_pass else compat.empty_cache(self.model.config)
        pieces = []
        for start in range(0, width - 1, slice_width):
            end = min(start + slice_width, width)
            hidden = decoder(input_ids=ids[:, start:end], use_cache=not one_pass,
                             **compat.cache_argument(cache)).last_hidden_state
            targets = ids[:, start + 1 : end + 1]
            pieces.append(head_nll(head, hidden[:, : targets.shape[1]], targets))
        return torch.cat(pieces, dim=1)


def head_nll(head: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(head(hidden))[target] per position, a few positions of logits at a time."""
    rows, positions = targets.shape
    vocabulary = head.weight.shape[0]
    step = max(1, LOGIT_CHUNK_BYTES // (4 * rows * vocabulary))
    out = []
    for start in range(0, positions, step):
        logits = head(hidden[:, start : start + step]).float()
        target = targets[:, start : start + step, None]
        out.append(torch.logsumexp(logits, dim=-1) - logits.gather(-1, target)[..., 0])
    return torch.cat(out, dim=1).cpu()


def refuse_transformed_logits(model: Any) -> None:
    """Models whose forward changes the head's output (Gemma's soft-capping, Cohere's logit
    scale) would be scored wrongly by lm_head alone: refuse them rather than guess."""
    config = model.config.get_text_config()
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    if softcap or (scale is not None and scale != 1):
        raise UserError(f"token_nll: {type(model).__name__} transforms its logits after lm_head "
                        "(soft-capping or a logit scale), which token_nll does not reproduce")
