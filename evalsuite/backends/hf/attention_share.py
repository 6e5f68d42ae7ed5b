"""ATTENTION_ALLOCATION for the hf backend: the attention a few query rows pay to spans of key
positions, per layer and head, without ever holding an n x n attention map.

How one prompt is measured:
- the prompt goes through the model `PREFILL_ROWS` tokens at a time over a KV cache, so the
  model's own attention (eager included) never scores more than a slice x prompt block, and
  tokens after the last query row are never run (causal attention cannot see them);
- every attention call goes through a thin function registered with transformers'
  `AttentionInterface` (as `evalsuite.backends.hf.quant` does). It sees the layer's queries and keys with
  RoPE applied, takes the query rows asked for, then runs the model's own attention unchanged;
- for those rows the keys are walked in chunks with an online softmax (running max, running sum
  and running per-span sums, rescaled whenever the max grows), so each span's value is exactly
  the sum over the span of softmax(q·kᵀ·scaling), in float32, in memory rows x chunk;
- DIFF layers become the differential map of each DIFF head, (w_first - λ·w_second) / norm: in
  DiffLlama (V1) the component heads i and i + H/2 with one λ per layer, in DIFF V2 the heads 2i
  and 2i + 1 with λ = sigmoid(lambda_proj(x)) per query row and head (x: the layer's attention
  input at that row); norm is by default 1 - λ (the paper's normalisation: every row then sums
  to 1). A span sum of that map is the same combination of the two span sums, since both are
  linear. Which heads pair up and how λ is computed is `diff_attention`'s, the one place that
  knows DIFF layers;
- a forward stops after the deepest selected layer: later layers cannot change earlier ones;
- a hybrid whose config names each layer's block (`layers_block_type`, Phi-4-mini-flash) is read at
  its attention layers; a sliding-window layer that keeps only its last keys passes its window and
  the position of its first key (`sliding_window`, `first_key_position` in the call's keywords).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from evalsuite.backends.common.tokens import TokenRules
from evalsuite.errors import UserError, first_line
from evalsuite.modeling import compat
from evalsuite.types import AttentionMass

from . import diff_attention
from .quant import attending_layers

NAME_PREFIX = "evalsuite_rows_"  # + the model's own implementation, which the wrapper delegates to
PREFILL_ROWS = 1024  # prompt tokens per forward pass
KEY_CHUNK_BYTES = 64 << 20  # float32 scores held at once per layer
DIFF_NORMS = {"lambda": "1 - lambda", "lambda_init": "1 - lambda_init", "none": "1"}
FLAT_LAMBDA = 1e-6  # |1 - λ| below this: the differential rows sum to ~0 and no share exists


# ---- the arithmetic ------------------------------------------------------------------------------


def span_masses(rows: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, spans: Sequence[tuple[int, int]],
                scaling: float, chunk_bytes: int | None = None, window: int | None = None,
                first_key: int = 0) -> torch.Tensor:
    """Causal softmax attention of query `rows` (H, R, d) over `keys` (KV heads, K, d), summed
    over each span [start, end): (H, R, spans) float32. Row r sits at `positions[r]` and sees
    keys 0 .. positions[r], or with a sliding `window` the last `window` of them (itself included);
    keys[j] sits at position first_key + j (a sliding-window cache keeps only the last keys); head h
    reads key head h // (H / KV heads), as transformers' repeat_kv."""
    heads, n_rows, dim = rows.shape
    kv_heads = keys.shape[0]
    device = rows.device
    grouped = rows.float().reshape(kv_heads, heads // kv_heads * n_rows, dim)  # no copy of the keys per group
    starts = torch.tensor([s for s, _ in spans], device=device)
    ends = torch.tensor([e for _, e in spans], device=device)
    running_max = torch.full((heads, n_rows), -torch.inf, device=device)
    total = torch.zeros((heads, n_rows), device=device)
    per_span = torch.zeros((heads, n_rows, len(spans)), device=device)
    chunk = max(1, (chunk_bytes or KEY_CHUNK_BYTES) // (4 * heads * n_rows))
    for start in range(first_key, int(positions.max()) + 1, chunk):
        key_positions = torch.arange(start, min(start + chunk, int(positions.max()) + 1), device=device)
        scores = torch.matmul(grouped, keys[:, key_positions - first_key].float().transpose(-1, -2))
        scores = scores.view(heads, n_rows, -1) * scaling
        hidden = key_positions[None, None, :] > positions[None, :, None]
        if window is not None:
            hidden |= positions[None, :, None] - key_positions[None, None, :] >= window
        scores = scores.masked_fill(hidden, -torch.inf)
        # a row that sees no key of this chunk yet (a window starts later) keeps a max of -inf: it
        # is taken as 0 there, so every weight so far is exp(-inf) = 0 and nothing is NaN
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        finite_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        shrink = torch.exp(running_max - finite_max)
        weights = torch.exp(scores - finite_max[..., None])
        inside = ((key_positions[:, None] >= starts) & (key_positions[:, None] < ends)).float()
        total = total * shrink + weights.sum(dim=-1)
        per_span = per_span * shrink[..., None] + torch.matmul(weights, inside)
        running_max = new_max
    return per_span / total[..., None]


def _check_divisor(divisor: torch.Tensor, norm: str) -> None:
    smallest = float(divisor.abs().min())
    if smallest < FLAT_LAMBDA:  # dividing would turn float32 rounding into the share
        raise UserError(f"a DIFF layer has 1 - λ = {smallest:.2g}: its rows sum to about 0, so they have no share "
                        f"under diff_norm={norm}; use -T diff_norm=none")


def differential_heads(masses: torch.Tensor, lam: float, lambda_init: float, norm: str) -> torch.Tensor:
    """DiffLlama's component heads (H, ...) -> DIFF heads (H/2, ...): (w_i - λ·w_{i+H/2}) / normalisation."""
    divisor = torch.tensor({"lambda_init": 1 - lambda_init, "lambda": 1 - lam, "none": 1.0}[norm])
    _check_divisor(divisor, norm)
    half = torch.arange(masses.shape[0] // 2)
    return diff_attention.differential(masses, half, half + len(half), lam) / divisor


def pair_heads(masses: torch.Tensor, lam: torch.Tensor, norm: str) -> torch.Tensor:
    """DIFF V2's component heads (2h, R, spans) -> DIFF heads (h, R, spans): (w_2i - λ·w_2i+1) /
    normalisation, with λ one per query row and DIFF head, (R, h)."""
    if norm == "lambda_init":
        raise UserError("DIFF V2 has no λ_init; use -T diff_norm=lambda (each row's own 1 - λ) or none")
    pairs = torch.arange(lam.shape[1])
    combined = diff_attention.differential(masses, 2 * pairs, 2 * pairs + 1, lam)
    if norm == "none":
        return combined
    divisor = (1 - lam).transpose(0, 1)[..., None]  # (h, R, 1)
    _check_divisor(divisor, norm)
    return combined / divisor


# ---- collecting the rows during the forward passes ---------------------------------------------------


class _DeepestLayerDone(Exception):
    """Raised inside the forward once the deepest selected layer has been read."""


class RowCollector:
    """Per selected layer, the span masses of the query rows, filled as the forward passes
    reach them (a row may sit in any prefill slice)."""

    def __init__(self, queries: Sequence[int], spans: Sequence[tuple[int, int]], layers: Sequence[int],
                 original: str, device: torch.device):
        self.queries = torch.tensor(list(queries), device=device)
        self.spans = list(spans)
        self.layers = set(layers)
        self.deepest = max(layers)
        self.original = original  # the model's own attention implementation
        self.masses: dict[int, torch.Tensor] = {}
        self.filled: dict[int, torch.Tensor] = {}
        self.lambdas: dict[int, tuple[float, float]] = {}  # DiffLlama: (λ, λ_init) per layer
        self.pair_weights: dict[int, torch.Tensor] = {}  # DIFF V2: λ per query row and DIFF head
        self.inputs: dict[int, torch.Tensor] = {}  # DIFF V2: the attention input of the pass in progress
        self.seen: set[int] = set()

    def new_forward(self) -> None:
        self.seen = set()

    def observe(self, module: Any, query: torch.Tensor, key: torch.Tensor, scaling: float | None,
                window: int | None = None, first_key: int = 0) -> None:
        """One attention call; a sliding-window layer passes its window and the position of its first key."""
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise UserError(f"{type(module).__name__} has no layer_idx; cannot attribute its attention rows")
        if layer in self.seen:  # transformers' DiffLlama attends twice per layer with the same queries and keys
            return
        self.seen.add(layer)
        if layer in self.layers:
            self._take(layer, module, query, key, query.shape[-1] ** -0.5 if scaling is None else scaling,
                       window, first_key)
        if layer == self.deepest:
            raise _DeepestLayerDone

    def _take(self, layer: int, module: Any, query: torch.Tensor, key: torch.Tensor, scaling: float,
              window: int | None, first_key: int) -> None:
        assert query.shape[0] == 1, "one prompt per forward"
        offset = first_key + key.shape[2] - query.shape[2]  # the query rows are the last ones the keys cover
        here = (self.queries >= offset) & (self.queries < first_key + key.shape[2])
        heads = query.shape[1]
        if layer not in self.masses:
            self.masses[layer] = torch.zeros((heads, len(self.queries), len(self.spans)), device=query.device)
            self.filled[layer] = torch.zeros(len(self.queries), dtype=torch.bool, device=query.device)
        if diff_attention.is_v1(module):
            lam = diff_attention.v1_lambda(module, query.dtype)
            self.lambdas[layer] = (float(lam.detach()), float(module.lambda_init))
        if not bool(here.any()):
            return
        rows = query[0][:, self.queries[here] - offset]
        self.masses[layer][:, here] = span_masses(rows, key[0], self.queries[here], self.spans, scaling,
                                                  window=window, first_key=first_key)
        self.filled[layer] |= here
        if diff_attention.is_v2(module):
            if layer not in self.inputs:
                raise UserError(f"{type(module).__name__} layer {layer}: its input was not seen, so its λ is unknown")
            weights = self.pair_weights.setdefault(layer, torch.zeros((len(self.queries), heads // 2),
                                                                      device=query.device))
            weights[here] = module.pair_weight(self.inputs[layer][0, self.queries[here] - offset]).float()

    def keep_input(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward pre-hook on DIFF V2 attention layers: λ of a row needs the layer's input there."""
        self.inputs[module.layer_idx] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    def result(self, layers: Sequence[int], norm: str, model_name: str) -> AttentionMass:
        missing = [layer for layer in layers if layer not in self.filled or not bool(self.filled[layer].all())]
        if missing:
            raise UserError(f"{model_name}: layers {missing} never ran through transformers' AttentionInterface, "
                            "so their attention rows cannot be read (needs Llama, DiffLlama or a model that uses it)")
        per_layer, lambdas = [], []
        for layer in layers:
            masses = self.masses[layer]
            if layer in self.lambdas:
                masses = differential_heads(masses, *self.lambdas[layer], norm)
                lambdas.append(self.lambdas[layer][0])
            elif layer in self.pair_weights:  # V2: λ varies by row and head; its mean is reported
                masses = pair_heads(masses, self.pair_weights[layer], norm)
                lambdas.append(float(self.pair_weights[layer].mean()))
            per_layer.append(masses.double().cpu())
        differential = bool(lambdas)
        return AttentionMass(
            layers=tuple(layers), mass=torch.stack(per_layer).numpy(),
            attention_map="differential" if differential else "softmax",
            normalisation=DIFF_NORMS[norm] if differential else "",
            lambdas=tuple(lambdas),
        )


# ---- routing the model's attention through the collector -------------------------------------------

_active: RowCollector | None = None


def _module_eager(module: Any) -> Callable[..., Any]:
    """The eager attention function of the module's own modeling file (transformers' default; for a
    subclass such as the one-pass DiffLlama, the first modeling file up its classes that has one)."""
    found = (getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None) for cls in type(module).__mro__)
    eager = next((function for function in found if function is not None), None)
    if eager is None:
        raise UserError(f"{type(module).__name__}: no eager attention function to run after reading its rows")
    return eager


def rows_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any,
                   **kwargs: Any) -> Any:
    """The registered attention function: read the rows, then attend exactly as the model would."""
    collector = _active
    if collector is None:
        raise UserError(f"{type(module).__name__} runs evalsuite's row-reading attention outside a measurement")
    collector.observe(module, query, key, kwargs.get("scaling"), kwargs.get("sliding_window"),
                      kwargs.get("first_key_position", 0))
    own = _module_eager(module) if collector.original == "eager" else compat.attention_function(collector.original)
    return own(module, query, key, value, attention_mask, *args, **kwargs)


def _register(original: str) -> str:
    """The wrapper's name for a model running `original`, with the same mask format as `original`."""
    name = NAME_PREFIX + original
    if not compat.has_mask_function(original):
        raise UserError(f"attention allocation cannot read rows through attention implementation {original!r}")
    compat.register_attention(name, rows_attention, masks_like=original)
    diff_attention.register_wrapper(name, original)  # a DiffLlama layer attends as under `original`
    return name


@contextlib.contextmanager
def routed(model: Any, collector: RowCollector) -> Iterator[None]:
    """Every attention call of `model` goes through `collector` inside the block."""
    global _active
    assert _active is None, "one measurement at a time"
    try:
        model.set_attn_implementation(_register(collector.original))
    except (ValueError, KeyError) as exc:  # a model that takes no custom attention function
        model.set_attn_implementation(collector.original)
        raise UserError(f"cannot read attention rows of {type(model).__name__}: "
                        f"{first_line(exc)}") from None
    _active = collector
    hooks = [module.register_forward_pre_hook(collector.keep_input, with_kwargs=True)
             for module in model.modules() if diff_attention.is_v2(module)]
    try:
        yield
    finally:
        _active = None
        for hook in hooks:
            hook.remove()
        model.set_attn_implementation(collector.original)


# ---- the capability ----------------------------------------------------------------------------------


class AttentionShare:
    """Part of HFModel: ATTENTION_ALLOCATION."""

    def __init__(self, model: Any, tokens: TokenRules, device: torch.device, name: str):
        self.model = model
        self.tokens = tokens
        self.device = device
        self.name = name

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` as a whole prompt (as `TokenRules.encode` makes them) and each
        token's character span in `text`."""
        tokenizer = self.tokens.tokenizer
        if not getattr(tokenizer, "is_fast", False):
            raise UserError(f"{self.name}: attention allocation needs a fast tokenizer (character offsets of tokens)")
        encoded = tokenizer(text, add_special_tokens=not self.tokens.chat_template, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [(int(s), int(e)) for s, e in encoded["offset_mapping"]]

    def attention_layers(self) -> int:
        return int(self.model.config.get_text_config().num_hidden_layers)

    @torch.inference_mode()
    def attention_mass(self, ids: Sequence[int], queries: Sequence[int], spans: Sequence[tuple[int, int]],
                       layers: Sequence[int] | None = None, differential_norm: str = "lambda") -> AttentionMass:
        selected = self._check_request(ids, queries, spans, layers, differential_norm)
        collector = RowCollector(queries, spans, selected, compat.attention_implementation(self.model.config),
                                 self.device)
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with routed(self.model, collector):
            self._prefill(tokens[:, : max(queries) + 1], collector)
        return collector.result(selected, differential_norm, self.name)

    def _prefill(self, tokens: torch.Tensor, collector: RowCollector) -> None:
        """The prompt a slice at a time over one KV cache; each pass ends at the deepest selected layer."""
        cache = compat.empty_cache(self.model.config)
        for start in range(0, tokens.shape[1], PREFILL_ROWS):
            collector.new_forward()
            try:
                self.model(input_ids=tokens[:, start : start + PREFILL_ROWS], use_cache=True, logits_to_keep=1,
                           **compat.cache_argument(cache))
            except _DeepestLayerDone:
                continue

    def _check_request(self, ids: Sequence[int], queries: Sequence[int], spans: Sequence[tuple[int, int]],
                       layers: Sequence[int] | None, norm: str) -> list[int]:
        """The selected layers as indices 0 .. L-1 (negative ones count from the end), after the
        request's other parts are checked."""
        count = self.attention_layers()
        attending = attending_layers(self.model)  # a hybrid's Mamba layers have no attention to read
        wanted = attending if layers is None else [layer % count if -count <= layer < count else layer
                                                   for layer in layers]
        if not wanted or any(not 0 <= layer < count for layer in wanted):
            raise UserError(f"{self.name} has layers 0..{count - 1}; cannot select layers {list(layers or [])}")
        recurrent = [layer for layer in wanted if layer not in attending]
        if recurrent:
            raise UserError(f"{self.name}: layers {recurrent} are Mamba layers, which have no attention; its "
                            f"attention layers are {','.join(map(str, attending))}")
        if norm not in DIFF_NORMS:
            raise UserError(f"differential normalisation must be one of {', '.join(DIFF_NORMS)}, got {norm!r}")
        if norm == "lambda_init" and any(diff_attention.is_v2(module) for module in self.model.modules()):
            raise UserError(f"{self.name} is a DIFF V2 model, which has no λ_init; use -T diff_norm=lambda "
                            "(each row's own 1 - λ) or none")
        if not queries or any(not 0 <= q < len(ids) for q in queries):
            raise UserError(f"query positions must lie in the prompt's {len(ids)} tokens, got {list(queries)}")
        if not spans or any(not 0 <= s <= e <= len(ids) for s, e in spans):
            raise UserError(f"key spans must be ranges within the prompt's {len(ids)} tokens, got {list(spans)}")
        return sorted(set(wanted))
