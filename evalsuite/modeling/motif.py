"""Motif's differential-attention models in their published layout: `MotifConfig`, `MotifForCausalLM`.

One class runs both downloadable families, which share `model_type: "Motif"`, their parameter
names and their blocks, and differ in how the query heads are grouped:

- Motif-2.6B: DIFF V1 attention (arXiv 2410.05258). `num_attention_heads` counts component
  heads (16 for 8 DIFF heads of width d); q_proj gives them, and the two maps of DIFF head i are
  the adjacent heads 2i and 2i+1; k_proj likewise gives adjacent (first, second) key heads;
- Motif-2-12.7B: grouped differential attention (GDA, arXiv 2510.06949), `num_noise_heads` set.
  `num_attention_heads` counts every query head, signal and noise (40 = 32 + 8); they come in
  groups of `grouped_ratio + 1` adjacent heads, `grouped_ratio` signal heads then one noise head
  whose map every signal head of the group subtracts (4 signal to 1 noise). k_proj gives
  `num_key_value_heads` heads in adjacent (signal, noise) pairs (`k_ratio` = 1);
- both: V is one head of width 2d per key pair (v_proj's heads 2j and 2j+1 side by side);
  λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, one per layer, from four vectors of width d;
  λ_init = 0.8 - 0.6·exp(-0.3·(layer_idx - 1)) with layer_idx counted from 0 (the reference's
  offset, not the paper's layer_idx); each DIFF head's output (width 2d) goes through `subln`,
  an RMSNorm of width 2d with its own eps (`attn_rms_norm_eps`), then times (1 - λ_init);
  rotary embeddings rotate halves (Llama's convention) over each d-wide query and key head;
  the MLP is down(act(gate(x)) · up(x)) with PolyNorm as act (`hidden_act: poly_norm`:
  w0·norm(x³) + w1·norm(x²) + w2·norm(x) + b, norm(z) = z / rms(z)).

Where each point was read is in docs/models.md. The 2.6B layout is GDA with one signal head per
group, so one attention module serves both. Each layer attends in one call (`wide_attention.py`,
whose names the hf backend's DIFF seam `backends/hf/diff_attention.py` re-exports) over 2S
component heads: the S signal heads, then for each the noise head it subtracts (a GDA noise map is
scored once per signal head it serves), with the values 2d wide; so the DIFF-aware readers see a
DiffLlama-like call whose DIFF head i pairs component heads i and i + S, and λ and λ_init under
DiffLlama's names. The KV cache holds the checkpoint's own key and value heads.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN

from evalsuite.modeling import compat, llama_stack, wide_attention
from evalsuite.modeling.llama_stack import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel

_llama = compat.llama_modeling()  # Motif keeps Llama's norms and rotary embedding
# the module's own eager attention, where evalsuite's attention readers look for it (attention_share)
eager_attention_forward = _llama.eager_attention_forward


@strict
class MotifConfig(LlamaConfig):
    """Llama's fields plus Motif's: `num_noise_heads` (GDA; absent for the 2.6B family), `k_ratio`,
    `attn_rms_norm_eps` (the sub-layer norm's eps) and `use_bias`."""

    model_type = "Motif"
    hidden_act: str = "poly_norm"
    num_noise_heads: int | None = None
    k_ratio: int = 1
    attn_rms_norm_eps: float = 1e-5
    use_bias: bool = False
    use_sliding_window: bool = False

    def validate_architecture(self) -> None:
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        noise = self.num_noise_heads
        if self.use_sliding_window:
            raise ValueError("Motif with use_sliding_window is not supported: its published models attend globally")
        if self.k_ratio != 1:
            raise ValueError(f"Motif's keys pair one signal with one noise head (k_ratio 1), got k_ratio {self.k_ratio}")
        if kv_heads % 2:
            raise ValueError(f"num_key_value_heads ({kv_heads}) must be even: key heads come in (signal, noise) pairs")
        groups = heads // 2 if noise is None else noise
        per_group = 2 if noise is None else heads // max(noise, 1)
        if groups < 1 or per_group < 2 or groups * per_group != heads:
            raise ValueError(f"num_attention_heads ({heads}) must be groups of signal heads and one noise head "
                             f"(num_noise_heads {noise})")
        if groups % (kv_heads // 2):
            raise ValueError(f"the {groups} noise heads must share the {kv_heads // 2} key pairs evenly "
                             f"(num_key_value_heads {kv_heads})")

    @property
    def noise_heads(self) -> int:
        """Query groups: one noise head each (the 2.6B family: one per DIFF head)."""
        return self.num_attention_heads // 2 if self.num_noise_heads is None else self.num_noise_heads

    @property
    def grouped_ratio(self) -> int:
        """Signal heads per noise head: 1 for the 2.6B family, 4 for Motif-2-12.7B."""
        return self.num_attention_heads // self.noise_heads - 1

    def layout_summary(self) -> str:
        """One line: which layout points this config selects."""
        family = ("grouped differential attention" if self.num_noise_heads is not None
                  else "differential attention (V1)")
        return (f"Motif layout: {family}; {self.num_attention_heads} query heads in {self.noise_heads} groups of "
                f"{self.grouped_ratio} signal + 1 noise (adjacent); {self.num_key_value_heads} key heads in "
                f"(signal, noise) pairs; V one 2d-wide head per pair; λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, "
                f"λ_init = 0.8 - 0.6·exp(-0.3·(layer - 1)); subln RMSNorm(2d, eps {self.attn_rms_norm_eps}) "
                f"× (1 - λ_init); rotary halves; MLP activation {self.hidden_act}")


def lambda_init_at(layer_idx: int) -> float:
    """λ_init of the layer `layer_idx` (from 0), with the reference's offset of one."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer_idx - 1))


class PolyNorm(nn.Module):
    """w0·norm(x³) + w1·norm(x²) + w2·norm(x) + b, norm(z) = z / sqrt(mean(z²) + eps), in float32."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3) / 3)
        self.bias = nn.Parameter(torch.zeros(1))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.float()
        out = (self.weight[0] * self._norm(z ** 3) + self.weight[1] * self._norm(z ** 2)
               + self.weight[2] * self._norm(z) + self.bias)
        return out.to(x.dtype)


class MotifMLP(nn.Module):
    """down(act(gate(x)) · up(x)), with PolyNorm for `hidden_act: poly_norm`."""

    def __init__(self, config: MotifConfig):
        super().__init__()
        width, inner, bias = config.hidden_size, config.intermediate_size, config.use_bias
        self.gate_proj = nn.Linear(width, inner, bias=bias)
        self.up_proj = nn.Linear(width, inner, bias=bias)
        self.down_proj = nn.Linear(inner, width, bias=bias)
        self.act_fn = PolyNorm() if config.hidden_act == "poly_norm" else ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MotifAttention(nn.Module):
    """Grouped differential attention (the 2.6B family: one signal head per group)."""

    def __init__(self, config: MotifConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        assert config.head_dim is not None and config.num_key_value_heads is not None  # LlamaConfig fills both
        self.head_dim = d = config.head_dim
        self.groups, self.ratio = config.noise_heads, config.grouped_ratio
        self.key_pairs = config.num_key_value_heads // 2
        self.signal_heads = self.groups * self.ratio
        # the call's 2S component heads over its 2 x key_pairs key heads (eager's repeat_kv reads this)
        self.num_key_value_groups = self.signal_heads // self.key_pairs
        self.scaling = d ** -0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        bias, width = config.attention_bias or config.use_bias, config.hidden_size
        self.q_proj = nn.Linear(width, config.num_attention_heads * d, bias=bias)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * d, bias=bias)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.signal_heads * 2 * d, width, bias=bias)
        self.lambda_init = lambda_init_at(layer_idx)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(d)) for _ in range(4))
        self.subln = _llama.LlamaRMSNorm(2 * d, eps=config.attn_rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        kv_cache = compat.passed_cache(kwargs)
        query, key, value = llama_stack.project_heads(self, hidden_states)
        assert position_embeddings is not None, "the model passes rotary embeddings to every layer"
        query, key = _llama.apply_rotary_pos_emb(query, key, *position_embeddings)
        if kv_cache is not None:
            key, value = compat.update_cache(kv_cache, key, value, self.layer_idx, kwargs)
        output, weights = wide_attention.attend_wide(
            self, self.component_queries(query), self.component_keys(key), self.wide_values(value),
            attention_mask, self.scaling, eager_attention_forward, **kwargs)
        return self.o_proj(self.combine(output, query.dtype).reshape(*hidden_states.shape[:2], -1)), weights

    def component_queries(self, query: torch.Tensor) -> torch.Tensor:
        """(B, groups·(ratio+1), T, d) -> (B, 2S, T, d): the S signal heads, then the noise head of each."""
        batch, _, time, d = query.shape
        grouped = query.view(batch, self.groups, self.ratio + 1, time, d)
        signal = grouped[:, :, : self.ratio].reshape(batch, self.signal_heads, time, d)
        noise = grouped[:, :, self.ratio :].expand(-1, -1, self.ratio, -1, -1).reshape(batch, self.signal_heads,
                                                                                        time, d)
        return torch.cat([signal, noise], dim=1)

    def component_keys(self, key: torch.Tensor) -> torch.Tensor:
        """(B, 2P, T, d) in (signal, noise) pairs -> (B, 2P, T, d): the P signal keys, then the P noise keys."""
        batch, _, time, d = key.shape
        pairs = key.view(batch, self.key_pairs, 2, time, d)
        return torch.cat([pairs[:, :, 0], pairs[:, :, 1]], dim=1)

    def wide_values(self, value: torch.Tensor) -> torch.Tensor:
        """(B, 2P, T, d) -> (B, 2P, T, 2d): value head j is v_proj's heads 2j and 2j+1 side by side,
        once for the signal keys and once for the noise keys."""
        batch, _, time, d = value.shape
        wide = value.view(batch, self.key_pairs, 2, time, d).transpose(2, 3).reshape(batch, self.key_pairs, time,
                                                                                      2 * d)
        return torch.cat([wide, wide], dim=1)

    def combine(self, output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, T, 2S, 2d) component outputs -> (B, T, S, 2d): subln(signal - λ·noise) · (1 - λ_init)."""
        signal, noise = torch.chunk(output, 2, dim=2)
        combined = signal - self.lambda_full(dtype) * noise
        return (1 - self.lambda_init) * self.subln(combined)

    def lambda_full(self, dtype: torch.dtype) -> torch.Tensor:
        """λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, the exponentials in float32, then `dtype` (the
        form and the names of DiffLlama's λ, which the hf backend's DIFF seam reads as such)."""
        first = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32)).to(dtype)
        second = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32)).to(dtype)
        return first - second + self.lambda_init


class MotifDecoderLayer(LlamaDecoderLayer):
    """Llama's block (pre-norm residuals) around Motif's attention and MLP."""

    def __init__(self, config: MotifConfig, layer_idx: int):
        super(LlamaDecoderLayer, self).__init__()  # not Llama's __init__: its MLP knows no poly_norm
        self.hidden_size = config.hidden_size
        self.self_attn = MotifAttention(config, layer_idx)
        self.mlp = MotifMLP(config)
        self.input_layernorm = _llama.LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = _llama.LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class MotifPreTrainedModel(LlamaPreTrainedModel):
    config_class = MotifConfig
    config: MotifConfig
    _no_split_modules = ["MotifDecoderLayer"]
    _supports_flex_attn = False  # flex attention's score mods index heads; the widened values are untested there
    _can_record_outputs = {"hidden_states": MotifDecoderLayer, "attentions": MotifAttention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, MotifAttention):
            for vector in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                nn.init.normal_(vector, mean=0.0, std=0.1)
            nn.init.ones_(module.subln.weight)
        elif isinstance(module, PolyNorm):
            nn.init.constant_(module.weight, 1 / 3)
            nn.init.zeros_(module.bias)


# its attention goes through compat.attention_function: set_attn_implementation must switch it (the
# quantizer and the attention readers are attention implementations)
compat.follows_attention_interface(MotifPreTrainedModel)


class MotifModel(MotifPreTrainedModel, LlamaModel):
    """LlamaModel's forward over Motif layers."""

    def __init__(self, config: MotifConfig):
        llama_stack.build_model_body(self, config, MotifDecoderLayer)


class MotifForCausalLM(MotifPreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: MotifConfig):
        llama_stack.build_causal_lm(self, config, MotifModel)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """transformers' loading, after one line on stderr: the layout points the folder's config selects."""
        model = super().from_pretrained(*args, **kwargs)
        print(model.config.layout_summary(), file=sys.stderr)
        return model


def register() -> None:
    """Make `AutoConfig`/`AutoModelForCausalLM` (and so `--model FOLDER`) load Motif folders."""
    llama_stack.register_auto(MotifConfig, MotifForCausalLM)


register()
