"""Phi-4-mini-flash's differential attention: `attn` (`Phi4FlashAttention`: the fused biased `Wqkv`,
`out_proj`) and `attn.inner_cross_attn` (`Phi4FlashDiffAttention`: λ, λ_init, the sub-layer norm).

The attention runs as one call of the model's attention function (transformers' AttentionInterface)
per layer: the query heads ordered [even heads | odd heads], the keys likewise, each key head
carrying its pair's value [v_2j | v_2j+1] (2d wide). So DIFF head i pairs component heads i and
i + H/2 of that call, which is how evalsuite's DIFF seam (`backends/hf/diff_attention.py`) reads a
layer with `lambda_q1 .. lambda_k2` and `lambda_init`: the module the call receives is
`inner_cross_attn`, and logit quantization and the attention-allocation reader see the real maps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.modeling import compat

# the eager attention function the attention calls fall back to, where evalsuite's readers look for it
eager_attention_forward = compat.llama_modeling().eager_attention_forward


def allowed_keys(first_key: int, keys: int, first_query: int, queries: int, window: int | None,
                 padding: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Boolean (batch | 1, 1, queries, keys): causal, within the window, not a padding column. A
    padding query also sees itself, so no row is empty (an empty row is NaN under SDPA)."""
    key_columns = torch.arange(first_key, first_key + keys, device=device)
    query_columns = torch.arange(first_query, first_query + queries, device=device)[:, None]
    allowed = key_columns[None, :] <= query_columns
    if window is not None:
        allowed &= query_columns - key_columns[None, :] < window
    allowed = allowed[None, None]
    if padding is not None:
        real = padding[:, None, None, padding.shape[1] - keys:].bool()
        allowed = (allowed & real) | (key_columns[None, :] == query_columns)[None, None]
    return allowed


def as_mask(allowed: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask in the format the attention implementation takes (additive for eager)."""
    if compat.boolean_masks(implementation):
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


def lambda_init_of(layer_idx: int) -> float:
    """λ_init = 0.8 - 0.6 exp(-0.3 · layer_idx), the layer counted from 0 (the model's `lambda_init_fn(depth)`)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class Phi4FlashRMSNorm(nn.Module):
    """RMSNorm in float32, weight applied in the input's dtype (the model's `subln`)."""

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class Phi4FlashDiffAttention(nn.Module):
    """`attn.inner_cross_attn`: λ's four vectors, λ_init, the sub-layer norm; runs the attention call.
    It is the module the attention function receives, so it carries what such functions read
    (layer_idx, num_key_value_groups, is_causal, config)."""

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.is_causal = True
        self.lambda_init = lambda_init_of(layer_idx)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32)))
        self.subln = Phi4FlashRMSNorm(2 * self.head_dim, eps=1e-5)

    def lambda_full(self, dtype: torch.dtype) -> torch.Tensor:
        first = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1).float()).to(dtype)
        second = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1).float()).to(dtype)
        return first - second + self.lambda_init

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor,
                window: int | None = None, first_key: int = 0) -> torch.Tensor:
        """query (batch, H, q, d), key and value (batch, KV, k, d) in the checkpoint's head order ->
        (batch, q, H * d): the DIFF heads' normed outputs, each 2d wide, side by side. `allowed`: the
        boolean mask; `window` and `first_key` (the position of key 0) say what it was made from."""
        query = torch.cat([query[:, 0::2], query[:, 1::2]], dim=1)  # DIFF head i: heads i and i + H/2
        key = torch.cat([key[:, 0::2], key[:, 1::2]], dim=1)
        pair_value = torch.cat([value[:, 0::2], value[:, 1::2]], dim=-1)  # (batch, KV/2, k, 2d)
        value = torch.cat([pair_value, pair_value], dim=1)
        implementation = compat.attention_implementation(self.config)
        mask = as_mask(allowed, implementation, query.dtype)
        if implementation == "sdpa":  # torch's fused SDPA kernels need the value as wide as the query:
            query, key = (F.pad(t, (0, self.head_dim)) for t in (query, key))  # zeros change no score
        attend = compat.attention_function(implementation, eager_attention_forward)
        # the window and the position of the first key are for readers of the rows (evalsuite's
        # attention allocation): the mask already holds them, and transformers' functions ignore them
        output, _ = attend(self, query, key, value, mask, scaling=self.head_dim ** -0.5, dropout=0.0,
                           sliding_window=window, first_key_position=first_key)
        first, second = output.chunk(2, dim=2)  # (batch, q, H/2, 2d) each
        combined = self.subln(first - self.lambda_full(query.dtype) * second) * (1 - self.lambda_init)
        return combined.reshape(*combined.shape[:2], -1)


class Phi4FlashAttention(nn.Module):
    """`attn` of an attention layer: the fused biased `Wqkv` (queries only in the cross-decoder)
    and `out_proj`."""

    def __init__(self, config: Any, layer_idx: int, cross: bool):
        super().__init__()
        self.layer_idx = layer_idx
        self.cross = cross
        self.num_heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        width = self.num_heads * self.head_dim
        self.Wqkv = nn.Linear(config.hidden_size, width if cross else width + 2 * self.kv_heads * self.head_dim,
                              bias=True)
        self.out_proj = nn.Linear(width, config.hidden_size, bias=True)
        self.inner_cross_attn = Phi4FlashDiffAttention(config, layer_idx)
        self.window = config.window(layer_idx)

    def forward(self, hidden_states: torch.Tensor, padding: torch.Tensor | None, state: Any,
                shared: tuple[torch.Tensor, torch.Tensor, int] | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, int] | None]:
        """(output, the keys and values the cross-decoder reuses) after the layer's own or shared K/V."""
        batch, time, _ = hidden_states.shape
        projected = self.Wqkv(hidden_states)
        width = self.num_heads * self.head_dim
        query = projected[..., :width].view(batch, time, self.num_heads, self.head_dim).transpose(1, 2)
        if self.cross:
            assert shared is not None, "the cross-decoder follows the layer whose keys and values it reuses"
            key, value, first = shared
        else:
            kv = projected[..., width:].view(batch, time, 2 * self.kv_heads, self.head_dim).transpose(1, 2)
            key, value, first = state.update(kv[:, : self.kv_heads], kv[:, self.kv_heads:])
            shared = (key, value, first)
        first_query = first + key.shape[2] - time
        allowed = allowed_keys(first, key.shape[2], first_query, time, self.window, padding, hidden_states.device)
        return self.out_proj(self.inner_cross_attn(query, key, value, allowed, self.window, first)), shared
