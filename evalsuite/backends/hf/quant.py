"""Absmax quantization of the pre-softmax attention logits (paper §3.7), as an
attention function registered with transformers' `AttentionInterface`.

Where exactly the quantizer sits, for every call of a layer's attention:

    x  = (Q Kᵀ) · scaling                 the model's own scaling (1/√d for Llama)
    s  = max|x| / (2^(b−1) − 1)           max over the *unmasked* logits only
    x̂  = round(x / s) · s                 round half to even (torch.round)
    A  = softmax(x̂ + mask)                the causal/padding mask after quantization
    out = A · V

so only the logits are quantized: Q, K, V, the softmax and everything outside
attention keep the model's precision. Masked logits never enter the max, so
padding, and the batch a sequence shares, cannot change its quantization.
The arithmetic of the logits, the quantizer and the softmax is float32 whatever
the model's dtype.

Granularity (not published; per-tensor by default, as the paper's text reads):
- `tensor`: one scale per sequence per attention call: all heads, query rows
  and keys. A DIFF layer's attention call holds both maps of every DIFF head
  (DiffLlama's component heads i and i + H/2, DIFF V2's query heads 2i and
  2i + 1), so both maps share it. The hf backend's one-pass DiffLlama
  (`diff_attention.py`) makes that call once per layer, with the value of
  width 2d; transformers' DiffLlama makes it twice (same logits, same scale);
- `head`: one scale per (sequence, head);
- `row`: one scale per (sequence, head, query row).

A call sees the query rows it is given: a teacher-forced forward (log-likelihood
scoring, as in zero-shot benchmarks) sees the whole sequence, while incremental
decoding with a KV cache sees only the new rows.

16 bits means no quantization: the model keeps its own attention
implementation, so results are bit for bit those of the unquantized model.

Memory stays bounded for long inputs: query rows are processed in chunks whose
float32 logits fit in `chunk_bytes`; `tensor` and `head` granularities take two
passes over the chunks (the max first, then quantize and attend).

A model whose attention does not go through transformers' attention interface
cannot be quantized this way; that is detected with a two-token probe forward
and reported as an error instead of silently running unquantized.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from evalsuite.errors import UserError
from evalsuite.modeling import compat

NAME = "evalsuite_absmax"  # the attention implementation name registered with transformers
GRANULARITIES = ("tensor", "head", "row")
FULL_BITS = 16  # 16 bits = unquantized, as in the paper's sweep
MIN_BITS = 2  # absmax needs at least one level either side of zero
_HOOK = "_evalsuite_attention"  # attribute carrying the settings on every submodule
_CHUNK_BYTES = 256 << 20


def check_bits(bits: int) -> int:
    if not MIN_BITS <= bits <= FULL_BITS:
        raise ValueError(f"attention bits must be between {MIN_BITS} and {FULL_BITS} (16 = unquantized), got {bits}")
    return bits


def parse_attn_quant(text: str) -> int:
    """`none` -> 16, `absmax:8` -> 8; anything else is a ValueError with the accepted forms."""
    text = text.strip().lower()
    if text in ("none", "", "absmax:16"):
        return FULL_BITS
    method, _, bits = text.partition(":")
    if method != "absmax" or not bits.isdigit():
        raise ValueError(f"-M attn_quant must be none or absmax:<bits> (e.g. absmax:8), got {text!r}")
    return check_bits(int(bits))


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"attention quantization granularity must be one of {', '.join(GRANULARITIES)}, "
                         f"got {granularity!r}")
    return granularity


@dataclass(frozen=True)
class AttnQuant:
    """How the attention logits are quantized; bits=16 leaves them alone."""

    bits: int = FULL_BITS
    granularity: str = "tensor"
    chunk_bytes: int = _CHUNK_BYTES  # float32 logits held at once per attention call

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_granularity(self.granularity)
        if self.chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")

    @property
    def active(self) -> bool:
        return self.bits < FULL_BITS

    @property
    def levels(self) -> int:
        return 2 ** (self.bits - 1) - 1

    def describe(self) -> str:
        return f"absmax:{self.bits}" if self.active else "none"


class LogitObserver(Protocol):
    """Sees the float32 pre-softmax logits chunk by chunk (the outliers task)."""

    def call(self, module: Any) -> None: ...  # a new attention call of `module` begins

    def chunk(self, logits: Any, valid: Any) -> None: ...  # (B, H, rows, K) logits and their mask


@dataclass(frozen=True)
class Hook:
    """What the attention function does for the modules that carry it."""

    quant: AttnQuant
    observer: LogitObserver | None = None


_probe_seen: set[int] | None = None  # module ids seen by a routing probe in progress


# ---- the quantizer ---------------------------------------------------------------------------


def masked_absmax(x: Any, valid: Any, dims: tuple[int, ...]) -> Any:
    """max |x| over `dims`, counting only entries where `valid` is true (0 where none is)."""
    return x.abs().masked_fill(~valid, 0.0).amax(dim=dims, keepdim=True)


def fake_quantize(x: Any, absmax: Any, bits: int) -> Any:
    """round(x / s) · s with s = absmax / (2^(b−1) − 1); an all-zero slice stays zero."""
    import torch

    levels = 2 ** (bits - 1) - 1
    scale = (absmax / levels).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(x / scale).clamp_(-levels, levels) * scale


# ---- the attention function ------------------------------------------------------------------


def _repeat_heads(x: Any, groups: int) -> Any:
    if groups == 1:
        return x
    batch, kv_heads, length, dim = x.shape
    return x[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, kv_heads * groups, length, dim)


def _valid_rows(mask: Any, causal: bool, start: int, stop: int, q_len: int, k_len: int, device: Any) -> Any:
    """Boolean (B|1, 1|H, rows, K): which logits of query rows [start, stop) take part."""
    import torch

    if mask is None:
        if not causal or q_len == 1:
            return torch.ones((1, 1, stop - start, k_len), dtype=torch.bool, device=device)
        # no mask given means plain causal attention; the queries are the last q_len positions
        rows = torch.arange(start, stop, device=device)[:, None] + (k_len - q_len)
        return (torch.arange(k_len, device=device)[None, :] <= rows)[None, None]
    if mask.dtype != torch.bool:
        raise UserError(f"{NAME} expects a boolean attention mask, got {mask.dtype}")
    mask = mask[..., :k_len]
    return mask if mask.shape[-2] == 1 else mask[..., start:stop, :]


def absmax_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                     dropout: float = 0.0, **kwargs: Any) -> tuple[Any, None]:
    """Attention with absmax-quantized logits; the signature of transformers' attention functions."""
    import torch

    hook: Hook | None = getattr(module, _HOOK, None)
    if hook is None:
        raise UserError(f"{type(module).__name__} runs {NAME} attention without quantization settings; "
                        "enable it through evalsuite.backends.hf.quant")
    if _probe_seen is not None:
        _probe_seen.add(id(module))
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise UserError(f"attention logit quantization does not support attention {unsupported}")
    if dropout and module.training:
        raise UserError("attention logit quantization is for evaluation; attention dropout is not supported")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_heads(key, groups), _repeat_heads(value, groups)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    keys = key.float().transpose(-1, -2)
    rows = max(1, hook.quant.chunk_bytes // (4 * batch * heads * k_len))
    spans = [(start, min(start + rows, q_len)) for start in range(0, q_len, rows)]

    def logits(start: int, stop: int) -> tuple[Any, Any]:
        x = torch.matmul(query[:, :, start:stop].float(), keys) * scaling
        return x, _valid_rows(attention_mask, causal, start, stop, q_len, k_len, x.device)

    quant = hook.quant
    absmax = None
    if quant.active and quant.granularity != "row":  # first pass: the scale needs every row
        absmax = torch.zeros((batch, heads, 1, 1), dtype=torch.float32, device=query.device)
        for start, stop in spans:
            absmax = torch.maximum(absmax, masked_absmax(*logits(start, stop), dims=(2, 3)))
        if quant.granularity == "tensor":
            absmax = absmax.amax(dim=1, keepdim=True)
    observer = hook.observer if _probe_seen is None else None  # a routing probe is not data
    if observer is not None:
        observer.call(module)
    out = value.new_empty((batch, q_len, heads, value.shape[-1]))
    lowest = torch.finfo(torch.float32).min  # finite, so a fully masked (padding) row stays finite, as in eager
    for start, stop in spans:
        x, valid = logits(start, stop)
        if observer is not None:
            observer.chunk(x, valid)
        if quant.active:
            x = fake_quantize(x, absmax if absmax is not None else masked_absmax(x, valid, dims=(3,)), quant.bits)
        probs = torch.softmax(x.masked_fill(~valid, lowest), dim=-1).to(value.dtype)
        out[:, start:stop] = torch.matmul(probs, value).transpose(1, 2)
    return out, None


# ---- routing a model through it --------------------------------------------------------------

_registered = False


def register() -> None:
    """Register the attention function, and transformers' boolean (sdpa) masks for it, once."""
    global _registered
    if _registered:
        return
    compat.register_attention(NAME, absmax_attention, masks_like="sdpa")
    _registered = True


def attach(model: Any, hook: Hook | None) -> None:
    """Give every submodule (the attention layers among them) these settings; None removes them."""
    for submodule in model.modules():
        if hook is None:
            submodule.__dict__.pop(_HOOK, None)
        else:
            submodule.__dict__[_HOOK] = hook


def _expected_layers(model: Any) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "layers_block_type", None) is not None:
        return len(attending_layers(model))
    return getattr(config, "num_hidden_layers", None)


def attending_layers(model: Any) -> list[int]:
    """The decoder layers whose mixer is attention: every layer, except in a hybrid whose config names
    each layer's block (`layers_block_type`: mamba, attention or shared_attention, as Phi-4-mini-flash's)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = getattr(config, "layers_block_type", None)
    if kinds is None:
        return list(range(int(config.num_hidden_layers)))
    return [layer for layer, kind in enumerate(kinds) if kind != "mamba"]


def _verify_routing(model: Any) -> None:
    """A two-token forward must call our function in every layer, or quantizing is impossible."""
    import torch

    global _probe_seen
    if getattr(model, "_evalsuite_routing_verified", False):
        return
    name = type(model).__name__
    _probe_seen = set()
    try:
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=model.device), use_cache=False)
        seen = len(_probe_seen)
    finally:
        _probe_seen = None
    layers = _expected_layers(model)
    if seen == 0:
        raise UserError(f"{name} does not run its attention through transformers' AttentionInterface, so its "
                        "attention logits cannot be quantized (-M attn_quant / -T bits need Llama, DiffLlama or "
                        "another model that uses the interface)")
    if layers is not None and seen < layers:
        raise UserError(f"only {seen} of {name}'s {layers} attention layers use transformers' AttentionInterface; "
                        "refusing to report partly quantized results")
    model._evalsuite_routing_verified = True


def active_hook(model: Any) -> Hook | None:
    """The quantization and observer a model runs with now, or None when it runs as loaded."""
    return getattr(model, _HOOK, None)


def current(model: Any) -> AttnQuant:
    """The quantization a model runs with now (16 bits when never enabled)."""
    hook = getattr(model, _HOOK, None)
    return hook.quant if hook is not None else AttnQuant()


def _route(model: Any, hook: Hook | None, implementation: str) -> None:
    attach(model, hook)
    model.set_attn_implementation(implementation)


def enable(model: Any, quant: AttnQuant, observer: LogitObserver | None = None) -> None:
    """Route `model` through the quantizing attention (for good; see `using` for a scope)."""
    if not quant.active and observer is None:
        disable(model)
        return
    register()
    model.__dict__.setdefault("_evalsuite_original_attn", compat.attention_implementation(model.config))
    try:
        _route(model, Hook(quant, observer), NAME)
        _verify_routing(model)
    except (UserError, ValueError, KeyError) as exc:
        disable(model)
        raise UserError(str(exc).strip().splitlines()[0]) from None


def disable(model: Any) -> None:
    """Back to the model's own attention implementation, exactly."""
    if "_evalsuite_original_attn" in model.__dict__:
        _route(model, None, model.__dict__.pop("_evalsuite_original_attn"))


@contextlib.contextmanager
def using(model: Any, quant: AttnQuant, observer: LogitObserver | None = None) -> Iterator[None]:
    """`quant` (and an observer of the logits) for the duration of the block, then the previous state."""
    previous = getattr(model, _HOOK, None)
    enable(model, quant, observer)
    try:
        yield
    finally:
        if previous is None:
            disable(model)
        else:
            attach(model, previous)
            model.set_attn_implementation(NAME)
