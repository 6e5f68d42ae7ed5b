"""Motif-2.6B and Motif-2-12.7B (grouped differential attention) as a vLLM model: Hub folders
(`MotifForCausalLM`, evalsuite.modeling.motif) load as they are, and attention is one call of
vLLM's own `Attention` layer on its paged KV cache.

The math is evalsuite's hf `MotifAttention` (docs/models.md has the layout and where each point
was read): query heads come in adjacent groups of `grouped_ratio` signal heads and one noise head,
key heads in adjacent (signal, noise) pairs, and value head j of width 2d is v_proj's heads 2j and
2j+1 side by side. With A_h = softmax(q_h k^T / sqrt(d)), signal head h of group g:

    out_h = RMSNorm_2d(A_h V_g - λ A_noise(g) V_g) · subln.weight · (1 - λ_init)
    λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init,   λ_init = 0.8 - 0.6·exp(-0.3·(layer - 1))

One vLLM call holds 2S component heads, the S signal heads and then the noise head of each, over
2P key heads (the P signal keys, then the P noise keys), exactly the hf module's call. vLLM's
kernels take one head size for keys and values, so queries and keys are zero-padded from d to 2d
(the zeros add nothing to q·k; the scale stays 1/sqrt(d)) and each key head's value is its pair's
2d-wide value. The KV cache therefore holds 2P heads of width 2d for keys and for values, four
times the checkpoint's own P pairs of width d: vLLM's CPU kernel has no separate key and value
head sizes. One rank only (tensor parallelism would have to keep each group and its key pair on
one rank; it is refused with one line).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import get_act_fn
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

from evalsuite.modeling.motif import PolyNorm, lambda_init_at  # registers "Motif" with AutoConfig


class MotifAttention(nn.Module):
    """Signal and noise maps of every group in one vLLM attention call (queries and keys padded to 2d)."""

    def __init__(self, config: Any, hidden_size: int, num_heads: int, num_kv_heads: int,
                 max_position_embeddings: int = 8192, quant_config: Any = None, cache_config: Any = None,
                 prefix: str = "", **_: Any) -> None:
        super().__init__()
        if get_tensor_model_parallel_world_size() != 1:
            raise ValueError("Motif in vLLM runs on one rank (tensor_parallel_size 1)")
        self.head_dim = d = config.head_dim
        self.groups, self.ratio = config.noise_heads, config.grouped_ratio
        self.key_pairs, self.signal_heads = num_kv_heads // 2, config.noise_heads * config.grouped_ratio
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.lambda_init = lambda_init_at(extract_layer_index(prefix))
        bias = bool(config.attention_bias or config.use_bias)
        self.qkv_proj = QKVParallelLinear(hidden_size, d, num_heads, num_kv_heads, bias=bias,
                                          quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(self.signal_heads * 2 * d, hidden_size, bias=bias, quant_config=quant_config,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(d, max_position=max_position_embeddings,
                                   rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(d), requires_grad=False) for _ in range(4))
        self.subln = RMSNorm(2 * d, eps=config.attn_rms_norm_eps)
        self.attn = Attention(2 * self.signal_heads, 2 * d, d ** -0.5, num_kv_heads=2 * self.key_pairs,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        d = self.head_dim
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        tokens = q.shape[0]
        grouped = q.view(tokens, self.groups, self.ratio + 1, d)
        signal = grouped[:, :, : self.ratio].reshape(tokens, self.signal_heads, d)
        noise = grouped[:, :, self.ratio :].expand(-1, -1, self.ratio, -1).reshape(tokens, self.signal_heads, d)
        query = nn.functional.pad(torch.cat([signal, noise], dim=1), (0, d))
        pairs = k.view(tokens, self.key_pairs, 2, d)
        key = nn.functional.pad(torch.cat([pairs[:, :, 0], pairs[:, :, 1]], dim=1), (0, d))
        wide = v.view(tokens, self.key_pairs, 2 * d)
        value = torch.cat([wide, wide], dim=1)
        out = self.attn(query.reshape(tokens, -1), key.reshape(tokens, -1), value.reshape(tokens, -1))
        out = out.view(tokens, 2, self.signal_heads, 2 * d)
        diff = out[:, 0] - self._lambda(out.dtype) * out[:, 1]
        diff = (1 - self.lambda_init) * self.subln(diff.reshape(-1, 2 * d)).view_as(diff)
        output, _ = self.o_proj(diff.reshape(tokens, self.signal_heads * 2 * d))
        return output

    def _lambda(self, dtype: torch.dtype) -> torch.Tensor:
        """λ with the exponentials in float32, then the activations' dtype, as the hf module computes it."""
        one = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32))
        two = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32))
        return (one.to(dtype) - two.to(dtype)) + self.lambda_init


class MotifMLP(nn.Module):
    """down(act(gate(x)) · up(x)) with gate and up merged, PolyNorm for `hidden_act: poly_norm`."""

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        width, inner, bias = config.hidden_size, config.intermediate_size, bool(config.use_bias)
        self.intermediate_size = inner
        self.gate_up_proj = MergedColumnParallelLinear(width, [inner] * 2, bias=bias, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inner, width, bias=bias, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = PolyNorm() if config.hidden_act == "poly_norm" else get_act_fn(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up[..., : self.intermediate_size])
                                * gate_up[..., self.intermediate_size :])
        return out


class MotifDecoderLayer(LlamaDecoderLayer):
    """Llama's block and forward around Motif's attention and MLP (Llama's MLP knows no poly_norm)."""

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config: Any = None) -> None:
        nn.Module.__init__(self)
        config = config or vllm_config.model_config.hf_config
        quant_config = self.get_quant_config(vllm_config)
        self.hidden_size = config.hidden_size
        self.self_attn = MotifAttention(config, config.hidden_size, config.num_attention_heads,
                                        config.num_key_value_heads,
                                        getattr(config, "max_position_embeddings", 8192), quant_config,
                                        vllm_config.cache_config, prefix=f"{prefix}.self_attn")
        self.mlp = MotifMLP(config, quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class MotifForCausalLM(LlamaForCausalLM):
    """Llama's embeddings, final norm and head around Motif layers; weights load by their Hub names."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=MotifDecoderLayer)
