"""DIFF attention in one place: how DiffLlama (V1) and DIFF V2 layers pair their softmax maps,
their λ, and a DiffLlama attention that scores each map once.

Transformers' DiffLlama attends twice per layer, once per half of the values: both calls score
the same queries against the same keys, so the logits and the softmax of every map are computed
twice and a DiffLlama layer costs two Llama attentions. The DIFF equations need one map per
component head against the whole value of width 2d: one score and one softmax per map, and an
output twice as wide, 1.5x a Llama layer's attention work instead of 2x.

`OnePassDiffLlamaAttention` does that: the projections, rotary embedding, cache and the DIFF
combination are transformers' own lines, and the attention runs once, through the model's
attention function (the config's attention implementation), with the value of width 2d. It is what the
hf backend runs for DiffLlama checkpoints (`-M diff_attention=one_pass`, the default;
`-M diff_attention=transformers` keeps transformers' module). The attention functions that compute
the logits themselves take a wider value as it is and so see one call per layer: transformers'
eager attention, evalsuite's logit quantizer (`quant.py`, which the outliers observer rides), and
the row reader of `attention_share.py` over eager. SDPA on a CPU or a CUDA device gets one call
too, with the query and key widened by zeros to 2d: torch's flash kernels (CPU and CUDA) refuse a
value wider than the query (SDPA would fall back to its math kernel, an n x n map per head), and
zeros change no score, so the widened call runs on the flash or memory-efficient kernel. Without
autograd that call's inputs are built in place, for speed, with the same bits as the plain
operations run under autograd: the rotary embedding is written straight into the zero-widened
buffers (transformers' arithmetic in its order), and a single row under SDPA itself attends as two
rows on a CPU, one per half of the component heads, so that both read one paired value instead
of a copy per key head. Other fused kernels keep transformers' two calls (FlashAttention needs
equal widths; flex attention is not wired); docs/attention.md has what was measured.
"""

from __future__ import annotations

from typing import Any

import torch

from evalsuite.errors import UserError
from evalsuite.modeling import compat
from evalsuite.modeling.wide_attention import (  # noqa: F401  (the seam's names: the call with a 2d-wide value)
    EQUAL_WIDTH_KERNELS,
    PADDED_DEVICES,
    attend_wide,
    delegate_of,
    pads_query,
    register_wrapper,
    scores_once,
)

MODES = ("one_pass", "transformers")
_V1_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "lambda_init")


# ---- what a DIFF layer is --------------------------------------------------------------------------


def is_v1(module: Any) -> bool:
    """A DiffLlama layer: two softmax maps per DIFF head (component heads i and i + H/2), one λ."""
    return all(hasattr(module, name) for name in _V1_LAMBDAS)


def is_v2(module: Any) -> bool:
    """A DIFF V2 layer: component heads 2i and 2i + 1 per DIFF head, λ per token and head."""
    return callable(getattr(module, "pair_weight", None)) and hasattr(module, "lambda_proj")


def v1_lambda(module: Any, dtype: torch.dtype) -> torch.Tensor:
    """λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, exactly as DiffLlamaAttention computes it
    (the exponentials in float32, then the queries' dtype)."""
    first = torch.exp(torch.sum(module.lambda_q1 * module.lambda_k1, dim=-1, dtype=torch.float32)).to(dtype)
    second = torch.exp(torch.sum(module.lambda_q2 * module.lambda_k2, dim=-1, dtype=torch.float32)).to(dtype)
    return first - second + module.lambda_init


def component_pairs(module: Any, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second): the component heads of each DIFF head, in DIFF head order."""
    half = torch.arange(heads // 2)
    if is_v2(module):
        return 2 * half, 2 * half + 1
    return half, half + heads // 2


def differential(maps: torch.Tensor, first: torch.Tensor, second: torch.Tensor, lam: Any) -> torch.Tensor:
    """Component maps (H, R, ...) -> DIFF maps (H/2, R, ...): map_first - λ·map_second, with λ a
    number (V1) or one per query row and DIFF head, (R, H/2) (V2)."""
    if isinstance(lam, torch.Tensor) and lam.dim() == 2:
        lam = lam.transpose(0, 1).reshape(*lam.shape[::-1], *([1] * (maps.dim() - 2))).to(maps.dtype)
    return maps[first.to(maps.device)] - lam * maps[second.to(maps.device)]


# ---- DiffLlama with one attention call per layer -------------------------------------------------------


def paired_value(value: torch.Tensor) -> torch.Tensor:
    """(B, KV, T, d) -> (B, KV/2, T, 2d): value head g of each half side by side, [first half's
    head g, second half's head g], the value that transformers' two calls give a map of both
    halves' key heads g and g + KV/2."""
    first, second = torch.chunk(value, 2, dim=1)
    return torch.cat([first, second], dim=-1)


def wide_value(value: torch.Tensor) -> torch.Tensor:
    """(B, KV, T, d) -> (B, KV, T, 2d): the value each key head carries in transformers' two calls
    side by side (KV head g: the halves' heads g mod KV/2 of each half, as `repeat(1, 2, 1, 1)` of
    each half gives them), so one call's output is the two calls' outputs concatenated."""
    return paired_value(value).repeat(1, 2, 1, 1)


def zero_widened(states: torch.Tensor) -> torch.Tensor:
    """A contiguous (B, H, T, 2d) buffer for (B, H, T, d) states, its second half zeros and its
    first half left to write: SDPA's zero-widened query or key without `F.pad`'s fill of the whole
    buffer and copy of the states."""
    width = states.shape[-1]
    wide = states.new_empty(*states.shape[:-1], 2 * width)
    wide[..., width:].zero_()
    return wide


def rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Transformers' rotary embedding of (B, H, T, d) states, `states * cos + rotate_half(states) * sin`
    (cos and sin (B, T, d)), written into `out` where given: `apply_rotary_pos_emb`'s operations in
    its order, so the same bits, allocating only `rotate_half`'s tensors. Not under autograd."""
    embedded = torch.mul(states, cos.unsqueeze(1), out=out)
    return embedded.add_(compat.diffllama_modeling().rotate_half(states).mul_(sin.unsqueeze(1)))


def halves_as_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A one-row call's (1, H, T, w) query, (1, KV, T, w) key and (1, KV/2, T, w) paired value as a
    call of two rows, row r the component heads (and key heads) of half r, both rows attending to
    the same paired value: the query and key are views, the value an expanded view, so the
    value is not copied per key head as `wide_value` copies it. Query head j of row r attends
    to the key and value that head r·H/2 + j has in the one-row call."""
    query = query.unflatten(1, (2, -1)).flatten(0, 1)
    key = key.unflatten(1, (2, -1)).flatten(0, 1)
    return query, key, value.expand(2, -1, -1, -1)


class OnePassDiffLlamaAttention(compat.diffllama_modeling().DiffLlamaAttention):  # type: ignore[misc]
    """DiffLlamaAttention whose two maps each attend once, to the value of width 2d."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        kv_cache = compat.passed_cache(kwargs)
        implementation = compat.attention_implementation(self.config)
        padded = pads_query(implementation, hidden_states.device)
        if not (padded or scores_once(implementation)):
            return super().forward(hidden_states, position_embeddings, attention_mask,
                                   **compat.cache_argument(kv_cache), **kwargs)
        diffllama = compat.diffllama_modeling()
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        attend = compat.attention_function(implementation, diffllama.eager_attention_forward)
        if padded and not torch.is_grad_enabled():  # its buffers are written in place: no autograd
            first, second, weights = self.attend_padded(attend, implementation == "sdpa", query, key, value,
                                                        (cos, sin), attention_mask, kv_cache, kwargs)
        else:
            query, key = diffllama.apply_rotary_pos_emb(query, key, cos, sin)
            if kv_cache is not None:
                key, value = compat.update_cache(kv_cache, key, value, self.layer_idx, kwargs)
            if padded:  # the scale stays 1/sqrt(d): it is passed, not read from the padded width
                query, key = (torch.nn.functional.pad(t, (0, self.head_dim)) for t in (query, key))
            output, weights = attend(self, query, key, wide_value(value), attention_mask, dropout=0.0,
                                     scaling=self.scaling, **kwargs)
            first, second = torch.chunk(output, 2, dim=2)
        return self.o_proj(self.combine(first, second, query.dtype).reshape(*input_shape, -1)), weights

    def attend_padded(self, attend: Any, plain_sdpa: bool, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, rotary_embedding: tuple[torch.Tensor, torch.Tensor],
                      attention_mask: torch.Tensor | None, kv_cache: Any,
                      kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """SDPA's one call with query and key widened by zeros: the (B, T, H/2, 2d) outputs of the
        first and of the second component heads, and the weights. A one-row call on a CPU under SDPA
        itself runs as two rows (`halves_as_rows`; CUDA's kernels are not checked with its expanded
        value); a wrapper sees the heads as they are (it may read them)."""
        query, key, value = self.padded_inputs(query, key, value, *rotary_embedding, kv_cache, kwargs)
        if plain_sdpa and query.shape[0] == 1 and query.is_cpu:
            rows, weights = attend(self, *halves_as_rows(query, key, value), attention_mask, dropout=0.0,
                                   scaling=self.scaling, **kwargs)
            return rows[:1], rows[1:], weights  # (2, T, H/2, 2d): row r holds half r's heads
        output, weights = attend(self, query, key, value.repeat(1, 2, 1, 1), attention_mask, dropout=0.0,
                                 scaling=self.scaling, **kwargs)
        return (*torch.chunk(output, 2, dim=2), weights)

    def padded_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, kv_cache: Any,
                      kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SDPA's query and key, rotary-embedded and widened by zeros to 2d, and the paired value.
        The embedding is written straight into the wide buffers; a cache holds keys of width d,
        so there the key is embedded, cached and then widened."""
        wide_query = zero_widened(query)
        rotary(query, cos, sin, out=wide_query[..., :self.head_dim])
        if kv_cache is None:
            wide_key = zero_widened(key)
            rotary(key, cos, sin, out=wide_key[..., :self.head_dim])
        else:
            key, value = compat.update_cache(kv_cache, rotary(key, cos, sin), value, self.layer_idx, kwargs)
            wide_key = zero_widened(key)
            wide_key[..., :self.head_dim].copy_(key)
        return wide_query, wide_key, paired_value(value)

    def combine(self, first: torch.Tensor, second: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The (B, T, H/2, 2d) outputs of the first and second component heads -> the DIFF heads', as
        DiffLlama combines them (without autograd, in place: the same bits, two tensors fewer)."""
        scaled = second * v1_lambda(self, dtype)
        if torch.is_grad_enabled():
            return (1 - self.lambda_init) * self.groupnorm(first - scaled)
        return self.groupnorm(torch.sub(first, scaled, out=scaled)).mul_(1 - self.lambda_init)


def install(model: Any, mode: str) -> int:
    """Run the model's DiffLlama layers as `mode` says; the number of layers changed."""
    if mode not in MODES:
        raise UserError(f"-M diff_attention must be one of {', '.join(MODES)}, got {mode!r}")
    original = compat.diffllama_modeling().DiffLlamaAttention
    changed = 0
    for module in model.modules():
        if mode == "one_pass" and type(module) is original:
            module.__class__ = OnePassDiffLlamaAttention
            changed += 1
        elif mode == "transformers" and type(module) is OnePassDiffLlamaAttention:
            module.__class__ = original
            changed += 1
    return changed


def mode_of(model: Any) -> str | None:
    """`one_pass` or `transformers` for a model with DiffLlama layers, None for any other."""
    for module in model.modules():
        if isinstance(module, OnePassDiffLlamaAttention):
            return "one_pass"
        if isinstance(module, compat.diffllama_modeling().DiffLlamaAttention):
            return "transformers"
    return None
