"""DiffLlama (Differential Transformer) as a vLLM model: HF `DiffLlamaForCausalLM` checkpoints
load as they are, and attention runs through vLLM's own `Attention` layer and paged KV cache.

The math is transformers' `DiffLlamaAttention`. Heads come in pairs (h, h + H/2); each pair
is one differential head whose value is 2d wide (d = head_dim): the V heads of the first
half of the KV heads beside those of the second half. With A_h = softmax(q_h k^T / sqrt(d)):

    out_i = RMSNorm_2d(A_i [v_a | v_b] - lambda * A_{i+H/2} [v_a | v_b]) * (1 - lambda_init)
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
    lambda_init = 0.8 - 0.6 exp(-0.3 layer)

How it maps onto one vLLM attention call: vLLM's attention kernels (the CPU one included)
take a single head size for keys and values, so queries and keys are zero-padded from d to
2d (the zeros add nothing to q.k) and the scale is the explicit 1/sqrt(d); each KV head's
value is its 2d-wide [v_a | v_b]. One call then gives every head's A_h [v_a | v_b], and the
pairs are combined after it.

KV-cache cost: per token and layer the cache holds 2 x num_kv_heads x 2d values, twice what
transformers keeps (its cache holds K and V at width d and splits V after reading it): the
padded half of each key is zeros, and each [v_a | v_b] is stored under both KV heads that
use it. The alternative, one attention call per value half, costs the same (two caches of K
at d and one V half each) and two kernel launches; a kernel with separate key and value
head sizes would need 1.5x, but vLLM's CPU kernel has none.

Tensor parallelism: vLLM splits heads contiguously across ranks, while a differential pair
is (h, h + H/2). Loading reorders the rows of q/k/v_proj so that rank r holds the r-th block
of each half, [A_r, B_r], which keeps every pair, its KV heads and its value halves on one
rank; o_proj's columns are already in rank order. One rank: the order is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index


def lambda_init_fn(layer: int) -> float:
    """transformers' per-layer lambda_init (layer counted from 0)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DiffLlamaAttention(nn.Module):
    """Differential attention over vLLM's Attention layer (queries and keys zero-padded to 2d)."""

    def __init__(self, config: Any, hidden_size: int, num_heads: int, num_kv_heads: int,
                 max_position_embeddings: int = 8192, quant_config: Any = None, bias: bool = False,
                 bias_o_proj: bool = False, cache_config: Any = None, prefix: str = "", **_: Any) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        check_heads(num_heads, num_kv_heads, tp)
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.num_heads, self.num_kv_heads = num_heads // tp, num_kv_heads // tp
        self.lambda_init = lambda_init_fn(extract_layer_index(prefix))
        self.eps = config.rms_norm_eps
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, num_heads, num_kv_heads, bias=bias,
                                          quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(num_heads * self.head_dim, hidden_size, bias=bias_o_proj,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=max_position_embeddings,
                                   rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True)
        # shared by all heads of the layer, as in transformers (replicated on every rank)
        self.lambda_q1, self.lambda_k1 = vector(self.head_dim), vector(self.head_dim)
        self.lambda_q2, self.lambda_k2 = vector(self.head_dim), vector(self.head_dim)
        self.attn = Attention(self.num_heads, 2 * self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        d, heads, kv_heads = self.head_dim, self.num_heads, self.num_kv_heads
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        tokens = q.shape[0]
        q = nn.functional.pad(q.view(tokens, heads, d), (0, d))
        k = nn.functional.pad(k.view(tokens, kv_heads, d), (0, d))
        halves = v.view(tokens, 2, kv_heads // 2, d)  # this rank's KV heads: [first half | second half]
        value = torch.cat([halves[:, 0], halves[:, 1]], dim=-1).repeat(1, 2, 1)  # KV head j: [v_a | v_b] of j mod n
        out = self.attn(q.reshape(tokens, -1), k.reshape(tokens, -1), value.reshape(tokens, -1))
        out = out.view(tokens, 2, heads // 2, 2 * d)
        diff = out[:, 0] - self._lambda(out.dtype) * out[:, 1]
        diff = (1 - self.lambda_init) * rms_norm(diff, self.eps)
        output, _ = self.o_proj(diff.reshape(tokens, heads * d))
        return output

    def _lambda(self, dtype: torch.dtype) -> torch.Tensor:
        """lambda in float32, then in the activations' dtype, as transformers computes it."""
        one = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32))
        two = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32))
        return (one.to(dtype) - two.to(dtype)) + self.lambda_init


def vector(size: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(size), requires_grad=False)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' groupnorm: nn.RMSNorm over the 2d head width, no weight (float32 inside)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def check_heads(num_heads: int, num_kv_heads: int, tp: int) -> None:
    """Each rank holds whole differential pairs and the KV heads (both halves) they use."""
    if num_kv_heads % (2 * tp) or num_heads % (2 * tp) or num_heads % num_kv_heads:
        raise ValueError(f"DiffLlama in vLLM needs num_key_value_heads ({num_kv_heads}) and num_attention_heads "
                         f"({num_heads}) divisible by 2 x tensor_parallel_size ({2 * tp})")


class DiffLlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, config=config, attn_layer_type=DiffLlamaAttention)


class DiffLlamaForCausalLM(LlamaForCausalLM):
    """Llama with differential attention: everything else (MLP, norms, RoPE, head) is Llama's."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=DiffLlamaDecoderLayer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        tp = get_tensor_model_parallel_world_size()
        return super().load_weights(weights if tp == 1 else pair_rows_by_rank(weights, self.config, tp))


def pair_rows_by_rank(weights: Iterable[tuple[str, torch.Tensor]], config: Any, tp: int
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """q/k/v_proj rows in the head order [A_0, B_0, A_1, B_1, ...] (A, B: the two halves of the
    heads, each cut into `tp` blocks), so that vLLM's contiguous split gives rank r [A_r, B_r]."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for name, tensor in weights:
        count = heads if name.endswith(("q_proj.weight", "q_proj.bias")) else kv_heads
        if name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                          "v_proj.bias")):
            tensor = tensor[head_rows(count, tensor.shape[0] // count, tp)]
        yield name, tensor


def head_rows(count: int, width: int, tp: int) -> torch.Tensor:
    """Row indices that put head blocks in [A_0, B_0, A_1, B_1, ...] order."""
    block = count // (2 * tp)
    order = [half * count // 2 + rank * block + i for rank in range(tp) for half in (0, 1) for i in range(block)]
    return torch.tensor([head * width + j for head in order for j in range(width)])
