"""DIFF V2 as a vLLM model: `DiffLlamaV2ForCausalLM` folders (evalsuite.modeling.diffllama_v2)
load as they are, and attention is one call of vLLM's own `Attention` layer on its paged KV cache.

V2 needs no padding trick: its 2h query heads and h_kv key/value heads all have width d,
so vLLM's attention runs them as any GQA model's, and the KV cache is exactly a Llama's
with h_kv heads. After the call, pair i (query heads 2i and 2i+1) is combined as

    out_i = attn_2i - lam_i * attn_2i+1,    lam = sigmoid(lambda_proj(x))  (per token and pair)

and o_proj maps the h*d differential outputs back to the model width. Rotary embeddings
rotate halves (vLLM's neox style) or adjacent pairs (`rope_interleaved`, GPT-J style).

Tensor parallelism: vLLM splits query heads contiguously, and a pair is two adjacent heads,
so each rank holds whole pairs; lambda_proj's output rows (one per pair) split the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

import evalsuite.modeling.diffllama_v2  # noqa: F401  (registers the config type with transformers' AutoConfig)


class DiffLlamaV2Attention(nn.Module):
    """2h query heads over h_kv KV heads in one vLLM attention call, then the pairwise difference."""

    def __init__(self, config: Any, hidden_size: int, num_heads: int, num_kv_heads: int,
                 max_position_embeddings: int = 8192, quant_config: Any = None, bias: bool = False,
                 bias_o_proj: bool = False, cache_config: Any = None, prefix: str = "", **_: Any) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        check_heads(num_heads, num_kv_heads, tp)
        self.head_dim = config.head_dim
        self.pairs, self.num_kv_heads = num_heads // tp, max(1, num_kv_heads // tp)
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, 2 * num_heads, num_kv_heads, bias=bias,
                                          quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.lambda_proj = ColumnParallelLinear(hidden_size, num_heads, bias=False, gather_output=False,
                                                prefix=f"{prefix}.lambda_proj")
        self.o_proj = RowParallelLinear(num_heads * self.head_dim, hidden_size, bias=bias_o_proj,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=max_position_embeddings,
                                   rope_parameters=getattr(config, "rope_parameters", None),
                                   is_neox_style=not getattr(config, "rope_interleaved", False))
        self.attn = Attention(2 * self.pairs, self.head_dim, self.head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        d = self.head_dim
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([2 * self.pairs * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v).view(-1, self.pairs, 2, d)
        lam, _ = self.lambda_proj(hidden_states)
        diff = out[:, :, 0] - torch.sigmoid(lam).to(out.dtype).unsqueeze(-1) * out[:, :, 1]
        output, _ = self.o_proj(diff.reshape(-1, self.pairs * d))
        return output


def check_heads(num_heads: int, num_kv_heads: int, tp: int) -> None:
    """Each rank holds whole pairs and the KV heads their query heads read."""
    if num_heads % tp or (2 * num_heads) % num_kv_heads or (num_kv_heads % tp and tp % num_kv_heads):
        raise ValueError(f"DIFF V2 in vLLM needs num_attention_heads ({num_heads}) divisible by "
                         f"tensor_parallel_size ({tp}) and 2 x num_attention_heads divisible by "
                         f"num_key_value_heads ({num_kv_heads})")


class DiffLlamaV2DecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, config=config, attn_layer_type=DiffLlamaV2Attention)


class DiffLlamaV2ForCausalLM(LlamaForCausalLM):
    """Llama with DIFF V2 attention: MLP, norms, embeddings and head are Llama's."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=DiffLlamaV2DecoderLayer)
