"""The `hf` backend: any transformers causal LM (Llama, DiffLlama, GGUF files...).

Generation is our own greedy loop rather than `model.generate`: prefill asks
for the last position's logits only, requests are batched longest first with
left padding, and each row stops at its own stop string, so a batch costs as
many decode steps as its longest answer, not `max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..adapter import GenerationRequest, Loglikelihood, LoglikelihoodRequest
from ..errors import UserError
from ..params import build_params

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HASH_LIMIT = 512 * 1024 * 1024  # weights larger than this are fingerprinted by size and mtime
_LOAD_IN = ("none", "8bit", "4bit")


@dataclass(frozen=True)
class HFOptions:
    """Backend options, set with `-M key=value`."""

    name = "hf model"
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    attn_implementation: str = "sdpa"
    chat_template: bool = False
    trust_remote_code: bool = False
    max_context: int = 0  # 0: the model config's max_position_embeddings
    max_batch_tokens: int = 32768  # padded tokens per forward pass, caps --batch-size for long prompts
    prefix_cache: bool = True  # encode a shared prefix once and reuse its KV cache (same results)
    attn_quant: str = "none"  # none | absmax:<bits>: quantize the pre-softmax attention logits (evalsuite.quant)
    attn_quant_granularity: str = "tensor"  # tensor | head | row: what one absmax scale covers
    load_in: str = "none"  # none | 8bit | 4bit: bitsandbytes weight quantization (CUDA only)

    def __post_init__(self) -> None:
        from ..quant import check_granularity, parse_attn_quant

        parse_attn_quant(self.attn_quant)
        check_granularity(self.attn_quant_granularity)
        if self.load_in not in _LOAD_IN:
            raise ValueError(f"-M load_in must be one of {', '.join(_LOAD_IN)}, got {self.load_in!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"-M dtype must be auto or one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2", "flex_attention"):
            raise ValueError(f"-M attn_implementation {self.attn_implementation!r} is not supported")
        if self.max_context < 0 or self.max_batch_tokens <= 0:
            raise ValueError("-M max_context must be >= 0 and -M max_batch_tokens > 0")


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device} requested but no CUDA device is available")
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:N") from None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _weights_fingerprint(files: list[Path]) -> dict[str, Any]:
    total = sum(f.stat().st_size for f in files)
    if total <= _HASH_LIMIT:
        digest = hashlib.sha256()
        for f in sorted(files):
            digest.update(_sha256_file(f).encode())
        return {"weights_sha256": digest.hexdigest(), "weights_bytes": total}
    return {"weights_bytes": total, "weights_mtime": max(int(f.stat().st_mtime) for f in files)}


def _weight_quantization(load_in: str, device: torch.device) -> dict[str, Any]:
    """from_pretrained arguments for -M load_in=8bit|4bit (bitsandbytes, CUDA only)."""
    if load_in == "none":
        return {}
    from importlib.util import find_spec

    if device.type != "cuda":
        raise UserError(f"-M load_in={load_in} needs a CUDA device (bitsandbytes); this run is on {device.type}")
    if find_spec("bitsandbytes") is None:
        raise UserError(f"-M load_in={load_in} needs the bitsandbytes package: pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_8bit=True) if load_in == "8bit" else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": config, "device_map": {"": device}}


def _apply_attn_quant(model: Any, options: HFOptions) -> None:
    from ..quant import AttnQuant, enable, parse_attn_quant

    quant = AttnQuant(parse_attn_quant(options.attn_quant), options.attn_quant_granularity)
    if quant.active:
        enable(model, quant)


def _locate(spec: str, gguf: bool) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name) for a spec; clear errors for missing paths."""
    path = Path(spec).expanduser()
    if gguf:
        if not path.is_file():
            raise UserError(f"GGUF file not found: {spec}")
        return str(path.resolve().parent), path.name
    if path.exists():
        if not path.is_dir():
            raise UserError(f"checkpoint {spec} is not a folder")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UserError(f"checkpoint folder {spec} is not readable")
        if not (path / "config.json").is_file():
            raise UserError(f"checkpoint folder {spec} has no config.json")
        return str(path.resolve()), None
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise UserError(f"checkpoint folder not found: {spec}")
    return spec, None


class HFModel:
    """A transformers causal LM behind the model adapter interface."""

    def __init__(self, model: Any, tokenizer: Any, options: HFOptions, source: dict[str, Any], batch_size: int):
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.source = source
        self.batch_size = max(1, batch_size)
        self.device = next(model.parameters()).device
        self.chat_template = options.chat_template
        self.name = source["label"]
        config_max = getattr(model.config, "max_position_embeddings", 0) or 0
        self.max_context = options.max_context or config_max or 2048
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.eos_ids = self._eos_ids()
        self.capabilities: frozenset[str] = frozenset({"attention_quantization", "activation_probe"})
        self._prefix: _Prefix | None = None  # the current shared prefix's cache, kept across calls
        self._cacheable = True
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise UserError(f"-M chat_template=true but {self.name} has no chat template")

    # ---- loading -------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        spec: str,
        raw_options: dict[str, str],
        *,
        device: str = "auto",
        batch_size: int = 8,
        gguf: bool = False,
        label: str | None = None,
    ) -> HFModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own progress bar is the one that matters
        options = build_params(HFOptions, raw_options, flag="-M")
        folder, gguf_file = _locate(spec, gguf)
        torch_device = _resolve_device(device)
        dtype = _DTYPES.get(options.dtype) or (torch.bfloat16 if torch_device.type == "cuda" else torch.float32)
        kwargs: dict[str, Any] = {"trust_remote_code": options.trust_remote_code}
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
        weights = _weight_quantization(options.load_in, torch_device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation=options.attn_implementation, **kwargs, **weights
            )
        except Exception as exc:  # safetensors, gguf, tokenizers... each has its own error types for a bad file
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"could not load {spec}: {first_line}") from None
        if options.load_in == "none":  # bitsandbytes models are placed at load and cannot be moved
            model.to(torch_device)
        model.eval()
        _apply_attn_quant(model, options)
        name = label or (Path(gguf_file).stem if gguf_file else Path(folder).name)
        source = {"label": name, "spec": spec, "path": folder, "gguf_file": gguf_file}
        return cls(model, tokenizer, options, source, batch_size)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return ids

    def fingerprint(self) -> dict[str, Any]:
        import transformers

        config_json = json.dumps(self.model.config.to_dict(), sort_keys=True, default=str)
        folder = Path(self.source["path"])
        if self.source["gguf_file"]:
            weights = [folder / self.source["gguf_file"]]
        else:
            weights = [p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin", ".pt")] if folder.is_dir() else []
        vocab = json.dumps(self.tokenizer.get_vocab(), sort_keys=True)
        return {
            "backend": "hf",
            "name": self.name,
            "spec": self.source["spec"],
            "path": self.source["path"],
            "gguf_file": self.source["gguf_file"],
            "architecture": type(self.model).__name__,
            "config_sha256": hashlib.sha256(config_json.encode()).hexdigest(),
            "tokenizer_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
            **_weights_fingerprint(weights),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": self.device.type,
            "attn_implementation": self.model.config._attn_implementation,
            "chat_template": self.chat_template,
            "max_context": self.max_context,
            "quantization": self._quantization(),
            "transformers": transformers.__version__,
        }

    def _quantization(self) -> dict[str, Any] | None:
        """What -M attn_quant / load_in changed, as loaded (a -T bits sweep is part of the task)."""
        from ..quant import parse_attn_quant

        out: dict[str, Any] = {}
        if parse_attn_quant(self.options.attn_quant) < 16:
            out["attn_logits"] = self.options.attn_quant
            out["attn_granularity"] = self.options.attn_quant_granularity
        if self.options.load_in != "none":
            out["weights"] = f"bitsandbytes-{self.options.load_in}"
        return out or None

    # ---- tokens --------------------------------------------------------------------------

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids; the tokenizer's special tokens (BOS) only on the first piece of a
        plain prompt. Chat-templated text already carries its own special tokens."""
        specials = first and not self.chat_template
        return self.tokenizer(text, add_special_tokens=specials)["input_ids"]

    def encode_pair(self, prefix: str, text: str) -> list[int]:
        """prefix + text, each piece encoded on its own so that the prefix's ids (and
        its KV cache) are the same for every request that shares it."""
        if not prefix:
            return self.encode(text)
        return self.encode(prefix) + self.encode(text, first=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        if not self.chat_template:
            return user + assistant_prefix
        messages = [{"role": "user", "content": user}]
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return rendered + assistant_prefix

    # ---- batching ------------------------------------------------------------------------

    def _batches(self, lengths: Sequence[int]) -> Iterator[list[int]]:
        """Indices grouped into batches, longest first, under the padded-token budget."""
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        batch: list[int] = []
        for i in order:
            width = lengths[batch[0]] if batch else lengths[i]
            if batch and (len(batch) >= self.batch_size or width * (len(batch) + 1) > self.options.max_batch_tokens):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    # ---- prefix cache --------------------------------------------------------------------

    def _groups(self, requests: Sequence[Any]) -> list[tuple[str | None, list[int]]]:
        """Request indices grouped by shared prefix, in order of first appearance, so the
        current prefix's cache serves its requests before the next prefix replaces it.
        Without the cache: one group, each request encoded whole."""
        if not self.options.prefix_cache:
            return [(None, list(range(len(requests))))]
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.prefix, []).append(i)
        return list(groups.items())

    def _rows_for(self, prefix: str | None, requests: Sequence[Any], texts: list[str],
                  extra: Sequence[int] | None = None) -> tuple[_Prefix | None, list[list[int]]]:
        """Token rows for one group: the parts after the prefix when its cached encoding can
        serve them (every part non-empty and, when `extra` tokens follow, prefix + part +
        extra within max_context), else whole prompts encoded as `encode_pair` does."""
        attention = self._attention_state() if prefix and self._cacheable else None
        if attention is not None:
            parts = [self.encode(t, first=False) for t in texts]
            if all(parts):
                state = self._prefix_for(prefix, attention)
                longest = max(len(p) + e for p, e in zip(parts, extra or [0] * len(parts)))
                if state is not None and (extra is None or state.length + longest <= self.max_context):
                    return state, parts
        return None, [self.encode_pair(r.prefix, t) for r, t in zip(requests, texts)]

    def _attention_state(self) -> Any:
        """What the cached keys and values depend on besides the tokens: the attention-logit
        quantization in force. None when a cache cannot reproduce a whole-prompt pass: a
        quantization scale shared by query rows (tensor, head) sees other rows in a pass that
        starts after the prefix, and an observer of the logits would see the prefix only once."""
        from .. import quant

        hook = getattr(self.model, quant._HOOK, None)
        if hook is None:
            return quant.AttnQuant()
        if hook.observer is not None or (hook.quant.active and hook.quant.granularity != "row"):
            return None
        return hook.quant

    def _prefix_for(self, prefix: str, attention: Any) -> _Prefix | None:
        """The cached encoding of `prefix`, computed once and kept until another prefix comes."""
        if self._prefix is not None and self._prefix.text == prefix and self._prefix.attention == attention:
            return self._prefix
        self._prefix = None  # free the old cache first: one prefix in memory at a time
        state = self._encode_prefix(prefix, attention)
        from transformers.cache_utils import DynamicLayer

        if not all(type(layer) is DynamicLayer for layer in state.cache.layers):
            self._cacheable = False  # sliding-window or recurrent layers: cannot crop or widen safely
            return None
        self._prefix = state
        return state

    @torch.inference_mode()
    def _encode_prefix(self, prefix: str, attention: Any) -> _Prefix:
        """One batch-1 pass over the prefix (in max_batch_tokens pieces), keeping its KV cache."""
        ids = self.encode(prefix)
        cache = None
        step = self.options.max_batch_tokens
        for start in range(0, len(ids), step):
            piece = torch.tensor([ids[start : start + step]], dtype=torch.long, device=self.device)
            positions = torch.arange(start, start + piece.shape[1], device=self.device)[None]
            cache = self.model(input_ids=piece, position_ids=positions, past_key_values=cache, use_cache=True,
                               logits_to_keep=1).past_key_values
        return _Prefix(prefix, len(ids), cache, attention)

    def _forward(self, rows: list[list[int]], prefix: _Prefix | None, keep: int, use_cache: bool
                 ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Left-padded rows through the model, after the cached prefix when one is given.
        Positions continue from the prefix, so each row sees exactly the tokens (and
        positions) it would see as one whole prompt."""
        ids, mask = self._left_pad(rows)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if prefix is not None:
            cache = prefix.for_batch(len(rows))
            positions = positions + prefix.length
            mask = torch.cat([mask.new_ones((len(rows), prefix.length)), mask], dim=1)
            use_cache = True
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=use_cache, logits_to_keep=keep)
        return out, mask, positions

    # ---- generation ----------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        outputs: list[str] = [""] * len(requests)
        for prefix, indices in self._groups(requests):
            group = [requests[i] for i in indices]
            state, rows = self._rows_for(prefix, group, [r.prompt for r in group])
            width = state.length if state else 0
            for batch in self._batches([width + len(r) for r in rows]):
                try:
                    texts = self._generate_batch([rows[i] for i in batch], [group[i] for i in batch], state)
                finally:
                    if state is not None:
                        state.restore()
                for i, text in zip(batch, texts):
                    outputs[indices[i]] = text
        return outputs

    @torch.inference_mode()
    def _generate_batch(self, rows: list[list[int]], requests: list[GenerationRequest], prefix: _Prefix | None
                        ) -> list[str]:
        out, mask, positions = self._forward(rows, prefix, keep=1, use_cache=True)
        cache = out.past_key_values
        states = [_Row(r, ChoiceTrie(r.choices, lambda c: self.encode(c, first=False)) if r.choices else None)
                  for r in requests]
        logits = out.logits[:, -1]
        while True:
            feed = [self._advance(s, logits[i]) if s.active else self.pad_id for i, s in enumerate(states)]
            if not any(s.active for s in states):
                break
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            positions = positions[:, -1:] + 1
            token_ids = torch.tensor(feed, dtype=torch.long, device=self.device)[:, None]
            out = self.model(input_ids=token_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1]
        return [s.text for s in states]

    def _advance(self, row: _Row, logits: torch.Tensor) -> int:
        """One greedy step for `row`: the token to feed next; marks the row done when its
        answer is complete (a stop string, EOS, max_new_tokens, or a whole choice)."""
        if row.trie is None:
            token = int(logits.argmax())
            row.tokens.append(token)
            row.text, row.active = self._continue(row.tokens, row.request, token)
            return token
        token, child = row.trie.pick(row.node, logits)
        if token is None:
            return row.finish(row.node[END])
        settled = ChoiceTrie.settled(child)
        if settled is not None:  # one choice left: its remaining tokens are forced, no need to run them
            return row.finish(settled)
        row.node = child
        return token

    def _continue(self, tokens: list[int], request: GenerationRequest, last: int) -> tuple[str, bool]:
        """Decoded text so far, cut at the first stop string, and whether to go on."""
        if last in self.eos_ids:
            tokens = tokens[:-1]
            return self.tokenizer.decode(tokens, skip_special_tokens=True), False
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cuts = [text.find(s) for s in request.stop if s and s in text]
        if cuts:
            return text[: min(cuts)], False
        return text, len(tokens) < request.max_new_tokens

    # ---- log-likelihood ------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        results: list[Loglikelihood | None] = [None] * len(requests)
        for prefix, indices in self._groups(requests):
            group = [requests[i] for i in indices]
            continuations = [self.encode(r.continuation, first=False) for r in group]
            for r, continuation in zip(group, continuations):
                if not continuation:
                    raise UserError(f"empty continuation after tokenization: {r.continuation!r}")
            state, contexts = self._rows_for(prefix, group, [r.context for r in group],
                                             extra=[len(c) for c in continuations])
            pairs = list(zip(contexts, continuations))
            width = state.length if state else 0
            for batch in self._batches([width + len(c) + len(k) for c, k in pairs]):
                try:
                    scored = self._loglikelihood_batch([pairs[i] for i in batch], state)
                finally:
                    if state is not None:
                        state.restore()
                for i, result in zip(batch, scored):
                    results[indices[i]] = result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _loglikelihood_batch(self, pairs: list[tuple[list[int], list[int]]], prefix: _Prefix | None
                             ) -> list[Loglikelihood]:
        # Left padding puts every continuation at the end of its row, so the logits we
        # need are the last (longest continuation + 1) positions only.
        rows = [c + k if prefix else (c + k)[-self.max_context :] for c, k in pairs]
        keep = max(len(k) for _, k in pairs) + 1
        logits = self._forward(rows, prefix, keep=keep, use_cache=False)[0].logits
        results = []
        for row, (_, cont) in enumerate(pairs):
            n = len(cont)
            row_logits = logits[row, -n - 1 : -1].float().log_softmax(-1)
            target = torch.tensor(cont, device=row_logits.device)
            logprob = row_logits.gather(-1, target[:, None]).sum().item()
            greedy = bool((row_logits.argmax(-1) == target).all())
            results.append(Loglikelihood(logprob=logprob, is_greedy=greedy, tokens=n))
        return results


END = -1  # trie key that marks a complete choice (token ids are never negative)


class ChoiceTrie:
    """The allowed answers of a request as a trie over their token ids.

    Constrained greedy decoding walks it: at each node the next token is the
    argmax over that node's children only. Where one choice ends and a longer
    one continues (a choice that is a token prefix of another), the shorter
    one is taken unless the model's unrestricted argmax continues it."""

    def __init__(self, choices: Sequence[str], encode: Any):
        self.choices = tuple(choices)
        self.root: dict[int, Any] = {}
        for index, choice in enumerate(self.choices):
            node = self.root
            for token in encode(choice):
                node = node.setdefault(token, {})
            node.setdefault(END, index)  # duplicates: the first one wins

    def pick(self, node: dict[int, Any], logits: torch.Tensor) -> tuple[int | None, dict[int, Any]]:
        """(token, child) for the best allowed next token, or (None, node) when the answer ends here."""
        children = [t for t in node if t != END]
        if END in node and (not children or int(logits.argmax()) not in node):
            return None, node
        allowed = torch.tensor(children, dtype=torch.long, device=logits.device)
        token = children[int(logits[allowed].argmax())]
        return token, node[token]

    @staticmethod
    def settled(node: dict[int, Any]) -> int | None:
        """The choice index when only one answer remains below `node`, else None."""
        while END not in node and len(node) == 1:
            node = next(iter(node.values()))
        return node[END] if len(node) == 1 and END in node else None


class _Row:
    """The decoding state of one request in a batch."""

    def __init__(self, request: GenerationRequest, trie: ChoiceTrie | None):
        self.request = request
        self.trie = trie
        self.tokens: list[int] = []
        self.text = ""
        self.active = trie is not None or request.max_new_tokens > 0
        self.node = trie.root if trie else {}
        if trie is not None and ChoiceTrie.settled(trie.root) is not None:
            self.finish(ChoiceTrie.settled(trie.root))

    def finish(self, index: int) -> int:
        assert self.trie is not None
        self.text, self.active = self.trie.choices[index], False
        return 0  # the token fed for a finished row is never looked at


@dataclass
class _Prefix:
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
        from transformers import DynamicCache

        layers = [(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v, *_ in self.cache]
        wide = DynamicCache(ddp_cache_data=[(k[:, :, :0], v[:, :, :0]) for k, v in layers])
        for layer, (keys, values) in zip(wide.layers, layers):
            layer.keys, layer.values = keys, values  # views: the model's first update copies them, once
        return wide

    def restore(self) -> None:
        """Drop what a single-row batch appended, back to the prefix alone."""
        extra = self.cache.get_seq_length() - self.length
        if extra > 0:
            self.cache.crop(-extra)


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(HFOptions)]


def load(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
         label: str | None = None) -> HFModel:
    """The `hf` backend's loader: a transformers folder or hub id."""
    return HFModel.load(rest, dict(options), device=device, batch_size=batch_size, label=label)


def load_gguf(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
              label: str | None = None) -> HFModel:
    """The `gguf` backend's loader: a GGUF file, dequantized by transformers."""
    return HFModel.load(rest, dict(options), device=device, batch_size=batch_size, gguf=True, label=label)
