"""Differential Transformer V2 in the transformers layout: `DiffLlamaV2Config`, `DiffLlamaV2ForCausalLM`.

V2 (the DIFF authors, January 2026) keeps Llama's blocks and changes the attention:

- q_proj gives 2h query heads of width d, k_proj and v_proj give h_kv heads (GQA);
- one ordinary causal attention call over the 2h query heads; the two heads of pair i are
  the adjacent heads 2i and 2i+1, so with GQA groups of two or more query heads they fall
  in the same group and share key and value. The authors' layout is that one (the DIFF V2
  README, microsoft/unilm `Diff-Transformer/Diff-Transformer-V2/README.md`: the two heads
  subtracted "are in the same GQA group, which means they share the same key and value.
  This is crucial to performance"), and they match a baseline of h heads by keeping its h
  heads as output heads, doubling the query heads, keeping its KV heads and its o_proj.
  The shipped toy-diff2 is matched so. The class also accepts as many KV heads as query
  heads, where each head has its own key and value: the layout the authors call wrong;
- a weight per token and output head, `lam = sigmoid(lambda_proj(x))` (bias-free, d_model -> h);
- `out_i = attn_2i - lam_i * attn_2i+1`; no per-head norm, no (1 - lambda_init) factor;
  o_proj maps h*d back to d_model.

`num_attention_heads` is h, the number of output (differential) heads; `head_dim` is d.
Rotary embeddings rotate halves as Llama does, or adjacent pairs (GPT-J style, the public
module's convention) when `rope_interleaved` is true. Parameter names are Llama's plus
`self_attn.lambda_proj.weight`, so a Llama folder's tooling reads a V2 folder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import LlamaConfig

from evalsuite.modeling import compat, llama_stack
from evalsuite.modeling.llama_stack import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel

_llama = compat.llama_modeling()  # Llama's rotary pieces V2 keeps
# the module's own eager attention, where evalsuite's attention readers look for it (attention_share)
eager_attention_forward = _llama.eager_attention_forward


@strict
class DiffLlamaV2Config(LlamaConfig):
    """Llama's fields; `num_attention_heads` counts output heads (2x as many query heads)."""

    model_type = "diffllama_v2"
    rope_interleaved: bool = False

    def validate_architecture(self) -> None:
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        if (2 * heads) % kv_heads:
            raise ValueError(f"2 x num_attention_heads ({2 * heads}) query heads must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): rotation of adjacent pairs."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding on (batch, heads, time, d) tensors. Llama's cos/sin hold each
    frequency twice, as [f0..f(d/2-1), f0..f(d/2-1)]; the interleaved rotation wants
    [f0, f0, f1, f1, ...], so it takes the first half and repeats each entry."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if not interleaved:
        return q * cos + _llama.rotate_half(q) * sin, k * cos + _llama.rotate_half(k) * sin
    half = cos.shape[-1] // 2
    cos = cos[..., :half].repeat_interleave(2, dim=-1)
    sin = sin[..., :half].repeat_interleave(2, dim=-1)
    return q * cos + rotate_pairs(q) * sin, k * cos + rotate_pairs(k) * sin


class DiffLlamaV2Attention(nn.Module):
    """One attention call over 2h query heads, then `attn_2i - lam_i * attn_2i+1` per pair."""

    def __init__(self, config: DiffLlamaV2Config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        # LlamaConfig's __post_init__ has filled both in (from hidden_size and the head count)
        assert config.head_dim is not None and config.num_key_value_heads is not None
        self.num_heads, self.head_dim, kv_heads = config.num_attention_heads, config.head_dim, config.num_key_value_heads
        self.num_key_value_groups = 2 * self.num_heads // kv_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        bias, width = config.attention_bias, config.hidden_size
        self.q_proj = nn.Linear(width, 2 * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, width, bias=bias)
        self.lambda_proj = nn.Linear(width, self.num_heads, bias=False)

    def forward(self, hidden_states: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        kv_cache = compat.passed_cache(kwargs)
        query, key, value = llama_stack.project_heads(self, hidden_states)
        assert position_embeddings is not None, "the model passes rotary embeddings to every layer"
        cos, sin = position_embeddings
        query, key = apply_rotary(query, key, cos, sin, self.config.rope_interleaved)
        if kv_cache is not None:
            key, value = compat.update_cache(kv_cache, key, value, self.layer_idx, kwargs)
        attend: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] = compat.attention_function(
            compat.attention_implementation(self.config), eager_attention_forward)
        output, weights = attend(self, query, key, value, attention_mask, scaling=self.scaling,
                                 dropout=0.0 if not self.training else self.attention_dropout, **kwargs)
        return self.o_proj(self.combine(output, hidden_states)), weights

    def pair_weight(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """lam, (batch, time, h): how much of each pair's second map is subtracted, per token."""
        return torch.sigmoid(self.lambda_proj(hidden_states))

    def combine(self, output: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, time, 2h, d) attention outputs -> (batch, time, h*d) differential outputs."""
        batch, time = output.shape[:2]
        pairs = output.reshape(batch, time, self.num_heads, 2, self.head_dim)
        lam = self.pair_weight(hidden_states).to(pairs.dtype).unsqueeze(-1)
        return (pairs[..., 0, :] - lam * pairs[..., 1, :]).reshape(batch, time, -1)


class DiffLlamaV2DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: DiffLlamaV2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = DiffLlamaV2Attention(config, layer_idx)


class DiffLlamaV2PreTrainedModel(LlamaPreTrainedModel):
    config_class = DiffLlamaV2Config
    config: DiffLlamaV2Config
    _no_split_modules = ["DiffLlamaV2DecoderLayer"]
    _supports_flex_attn = False  # flex attention's score mods index heads; 2h query heads are untested there
    _can_record_outputs = {"hidden_states": DiffLlamaV2DecoderLayer, "attentions": DiffLlamaV2Attention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DiffLlamaV2Attention):
            nn.init.normal_(module.lambda_proj.weight, mean=0.0, std=self.config.initializer_range)


# its attention goes through compat.attention_function, which transformers' source-text check cannot see
compat.follows_attention_interface(DiffLlamaV2PreTrainedModel)


class DiffLlamaV2Model(DiffLlamaV2PreTrainedModel, LlamaModel):
    """LlamaModel's forward over V2 layers (built here, not by LlamaModel.__init__, which
    would first allocate a Llama's layers)."""

    def __init__(self, config: DiffLlamaV2Config):
        llama_stack.build_model_body(self, config, DiffLlamaV2DecoderLayer)


class DiffLlamaV2ForCausalLM(DiffLlamaV2PreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: DiffLlamaV2Config):
        llama_stack.build_causal_lm(self, config, DiffLlamaV2Model)


def register() -> None:
    """Make `AutoConfig`/`AutoModelForCausalLM` (and so `--model FOLDER`) load V2 folders."""
    llama_stack.register_auto(DiffLlamaV2Config, DiffLlamaV2ForCausalLM)


register()
