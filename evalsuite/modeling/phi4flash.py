"""Phi-4-mini-flash (SambaY with differential attention) in the checkpoint's own layout:
`Phi4FlashConfig` (`model_type: phi4flash`), `Phi4FlashForCausalLM`, `Phi4FlashCache`.

A folder downloaded from microsoft/Phi-4-mini-flash-reasoning loads by path with no remote code:
the config fields and parameter names are the checkpoint's. The layout, point by point (where each
was read is in docs/models.md):

- layers: L = num_hidden_layers (a multiple of 4), mb_per_layer = 2. The self-decoder, layers
  0 .. L/2 - 1: Mamba at even layers, sliding-window differential attention at odd ones. Layer L/2:
  Mamba whose scan output before the gate is the YOCO memory; layer L/2 + 1: full attention whose
  keys and values every later attention layer reuses. The cross-decoder, layers L/2 + 2 .. L - 1:
  gated memory units (GMU, even) and differential attention whose `Wqkv` makes only queries (odd);
- `num_attention_heads` counts component heads of width d = hidden_size / num_attention_heads;
  they pair as adjacent heads (2i, 2i + 1), and so do the key-value heads: DIFF head i is
  softmax(q_2i k_2j) - λ softmax(q_2i+1 k_2j+1) against the value [v_2j | v_2j+1] of width 2d
  (j the key-value pair of its GQA group);
- λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, one per layer, with λ_init = 0.8 - 0.6 exp(-0.3 layer_idx)
  (layer_idx counted from 0 over all layers, Mamba ones included);
- each DIFF head's output goes through an RMSNorm over its 2d values (`subln`, eps 1e-5), times
  (1 - λ_init);
- `attn.Wqkv` is one biased projection to [q | k | v], `attn.out_proj` is biased, and λ and the norm
  live under `attn.inner_cross_attn.*`;
- no rotary embedding: attention sees no positions (position_ids are accepted and unused);
- sliding window W (`sliding_window`): a query sees itself and the W - 1 keys before it;
- LayerNorm (with bias) before each mixer and the MLP; the MLP is fc1 -> (gate, up), up * silu(gate), fc2;
- GMU: out_proj(memory * silu(in_proj(x))) (`phi4flash_mamba`).

The attention is `phi4flash_attention`, the cache `phi4flash_cache`, the Mamba and GMU blocks
`phi4flash_mamba`.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from evalsuite.modeling import compat, llama_stack
from evalsuite.modeling.phi4flash_attention import Phi4FlashAttention, Phi4FlashDiffAttention, Phi4FlashRMSNorm
from evalsuite.modeling.phi4flash_cache import CROSS, FULL, GMU, MAMBA, SLIDING, Phi4FlashCache
from evalsuite.modeling.phi4flash_mamba import Phi4FlashGMU, Phi4FlashMamba

# columns run through the stack at once: the masks of a slice are slice x seen, so a 64K-token prompt
# never holds a 64K x 64K mask; a logit quantization scale (per call) covers at most this many query rows
PREFILL_CHUNK = 8192


class Phi4FlashConfig(PretrainedConfig):
    """The checkpoint's configuration fields, with the defaults of its own configuration class."""

    model_type = "phi4flash"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size: int = 51200, hidden_size: int = 2560, intermediate_size: int = 9216,
                 num_hidden_layers: int = 32, num_attention_heads: int = 40, num_key_value_heads: int | None = 4,
                 resid_pdrop: float = 0.0, embd_pdrop: float = 0.0, attention_dropout: float = 0.0,
                 hidden_act: str = "silu", max_position_embeddings: int = 4096, initializer_range: float = 0.02,
                 layer_norm_eps: float = 1e-5, use_cache: bool = True, tie_word_embeddings: bool = True,
                 rope_theta: float = 10000.0, bos_token_id: int = 1, eos_token_id: int = 2, pad_token_id: int = 0,
                 sliding_window: int | list[int | None] | None = 2047, mb_per_layer: int = 2,
                 mamba_d_state: int = 16, mamba_d_conv: int = 4, mamba_expand: int = 2,
                 mamba_dt_rank: int | str = "auto", mamba_conv_bias: bool = True, mamba_proj_bias: bool = False,
                 mlp_bias: bool = False, lm_head_bias: bool = False, **kwargs: Any):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attention_dropout = attention_dropout
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta  # in the published config; the model applies no rotary embedding
        self.sliding_window = sliding_window
        self.mb_per_layer = mb_per_layer
        self.mamba_d_state = mamba_d_state
        self.mamba_d_conv = mamba_d_conv
        self.mamba_expand = mamba_expand
        self.mamba_dt_rank = mamba_dt_rank
        self.mamba_conv_bias = mamba_conv_bias
        self.mamba_proj_bias = mamba_proj_bias
        self.mlp_bias = mlp_bias
        self.lm_head_bias = lm_head_bias
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
        self._check_layout()

    def _check_layout(self) -> None:
        layers, heads, kv_heads = self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads
        if layers % 4 or self.mb_per_layer != 2:
            raise ValueError(f"phi4flash needs num_hidden_layers divisible by 4 and mb_per_layer = 2 (the SambaY "
                             f"layout), got {layers} and {self.mb_per_layer}")
        if self.hidden_size % heads or heads % 2 or kv_heads % 2 or heads % kv_heads:
            raise ValueError(f"phi4flash needs even num_attention_heads ({heads}) and num_key_value_heads "
                             f"({kv_heads}), the first a multiple of the second, dividing hidden_size")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def layer_kind(self, layer: int) -> str:
        """mamba, gmu, sliding_attention, full_attention (the K/V the cross-decoder reuses) or cross_attention."""
        half = self.num_hidden_layers // 2
        if layer % self.mb_per_layer == 0:
            return GMU if layer >= half + 2 else MAMBA
        if layer >= half + 2:
            return CROSS
        return SLIDING if layer < half and self.window(layer) is not None else FULL

    def window(self, layer: int) -> int | None:
        """The sliding window of an attention layer (keys a query sees, itself included), or None."""
        if layer >= self.num_hidden_layers // 2 + 1:
            return None
        window = self.sliding_window
        return window[layer] if isinstance(window, list) else window

    @property
    def layers_block_type(self) -> list[str]:
        """Per layer: mamba (GMU included), attention, or shared_attention (a cross-decoder layer)."""
        names = {MAMBA: "mamba", GMU: "mamba", SLIDING: "attention", FULL: "attention", CROSS: "shared_attention"}
        return [names[self.layer_kind(i)] for i in range(self.num_hidden_layers)]

    def kv_source(self) -> int:
        """The layer whose keys and values the cross-decoder's attention layers reuse."""
        return self.num_hidden_layers // 2 + 1

    def new_cache(self) -> Phi4FlashCache:
        """An empty cache for this model (evalsuite.modeling.compat.empty_cache asks for it)."""
        return Phi4FlashCache(self)

    def layout_line(self) -> str:
        """One line: which layout points were read."""
        kinds = [self.layer_kind(i) for i in range(self.num_hidden_layers)]
        at = {kind: ",".join(str(i) for i, k in enumerate(kinds) if k == kind) for kind in set(kinds)}
        windows = sorted({self.window(i) for i in range(self.num_hidden_layers) if kinds[i] == SLIDING}, key=str)
        return (f"phi4flash layout: mamba at {at.get(MAMBA, '-')} (memory from {self.num_hidden_layers // 2}); "
                f"sliding window {','.join(map(str, windows)) or '-'} at {at.get(SLIDING, '-')}; full attention "
                f"K/V at {at.get(FULL, '-')}; cross-decoder attention (Wqkv makes Q) at {at.get(CROSS, '-')}; "
                f"GMU memory*silu(in_proj(x)) at {at.get(GMU, '-')}; {self.num_attention_heads} component heads "
                f"of {self.head_dim} ({self.num_attention_heads // 2} DIFF heads), adjacent pairs (2i, 2i+1) for "
                f"Q and K/V, V 2d wide; lambda = exp(q1.k1) - exp(q2.k2) + lambda_init, lambda_init = 0.8 - "
                f"0.6 exp(-0.3 layer_idx); subln RMSNorm(2d) x (1 - lambda_init); fused biased Wqkv, "
                f"attn.inner_cross_attn.*; no rotary")


# ---- the stack --------------------------------------------------------------------------------------------


class Phi4FlashMLP(nn.Module):
    def __init__(self, config: Phi4FlashConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(hidden_states).chunk(2, dim=-1)
        return self.fc2(up * self.activation_fn(gate))


class Phi4FlashDecoderLayer(nn.Module):
    def __init__(self, config: Phi4FlashConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.kind = config.layer_kind(layer_idx)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Phi4FlashMLP(config)
        self.attn: nn.Module
        if self.kind == MAMBA:
            self.attn = Phi4FlashMamba(config, layer_idx, yoco_kv=layer_idx >= config.num_hidden_layers // 2)
        elif self.kind == GMU:
            self.attn = Phi4FlashGMU(config, layer_idx)
        else:
            self.attn = Phi4FlashAttention(config, layer_idx, cross=self.kind == CROSS)

    def forward(self, hidden_states: torch.Tensor, padding: torch.Tensor | None, state: Any,
                memory: torch.Tensor | None, shared: Any) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """(hidden states, YOCO memory, shared keys and values) after this layer."""
        normed = self.input_layernorm(hidden_states)
        if self.kind == MAMBA:
            columns = padding[:, padding.shape[1] - hidden_states.shape[1]:] if padding is not None else None
            mixed, produced, state.state = self.attn(normed, columns, state.state)
            state.seen += hidden_states.shape[1]
            memory = produced if produced is not None else memory
        elif self.kind == GMU:
            assert memory is not None, "a GMU follows the Mamba layer that makes its memory"
            mixed = self.attn(normed, memory)
        else:
            mixed, shared = self.attn(normed, padding, state, shared)
        hidden_states = hidden_states + mixed
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), memory, shared


class Phi4FlashPreTrainedModel(PreTrainedModel):
    config_class = Phi4FlashConfig
    config: Phi4FlashConfig
    base_model_prefix = "model"
    _no_split_modules = ["Phi4FlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False  # FlashAttention needs the value as wide as the query; DIFF's is 2d
    _supports_flex_attn = False
    _supports_attention_backend = True  # evalsuite's registered attention functions (quantizer, row reader)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.normal_(mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, Phi4FlashRMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, Phi4FlashDiffAttention):
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(module, name).normal_(mean=0.0, std=0.1)
        elif isinstance(module, Phi4FlashMamba):
            module.A_log.copy_(torch.log(torch.arange(1, module.d_state + 1, dtype=torch.float32)
                                         ).repeat(module.d_inner, 1))
            module.D.fill_(1.0)


class Phi4FlashModel(Phi4FlashPreTrainedModel):
    def __init__(self, config: Phi4FlashConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([Phi4FlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                use_cache: bool | None = None, **kwargs: Any) -> BaseModelOutputWithPast:
        """position_ids are unused: the model has no positional encoding. `attention_mask` (batch,
        cached + new columns) marks real tokens with 1 (left padding)."""
        cache = compat.passed_cache(kwargs)
        if cache is not None and not isinstance(cache, Phi4FlashCache):
            raise TypeError(f"phi4flash keeps its own cache (Phi4FlashCache), got {type(cache).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        running = cache if cache is not None else Phi4FlashCache(self.config)
        embedded = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        width = embedded.shape[1]
        pieces = []
        for start in range(0, width, PREFILL_CHUNK):  # the state carries over exactly, slice to slice
            end = min(start + PREFILL_CHUNK, width)
            padding = None if attention_mask is None else attention_mask[:, : attention_mask.shape[1] - width + end]
            hidden, memory, shared = embedded[:, start:end], None, None
            for layer, state in zip(self.layers, running.layers):
                hidden, memory, shared = layer(hidden, padding, state, memory, shared)
            pieces.append(hidden)
        hidden = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        kept = running if (use_cache or cache is not None) else None
        return BaseModelOutputWithPast(last_hidden_state=self.final_layernorm(hidden),
                                       **compat.cache_argument(kept))


class Phi4FlashForCausalLM(Phi4FlashPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: Phi4FlashConfig):
        super().__init__(config)
        self.model = Phi4FlashModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        model = super().from_pretrained(*args, **kwargs)
        print(model.config.layout_line(), file=sys.stderr)  # which layout points were read, as the issue asks
        return model

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_decoder(self) -> Phi4FlashModel:
        return self.model

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0, **kwargs: Any) -> CausalLMOutputWithPast:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                             use_cache=use_cache, **kwargs)
        hidden = outputs.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        return CausalLMOutputWithPast(logits=logits, **compat.cache_argument(compat.returned_cache(outputs)))


for _model_class in (Phi4FlashModel, Phi4FlashForCausalLM):  # their attention runs through the interface
    compat.follows_attention_interface(_model_class)


def register() -> None:
    """Make `AutoConfig`/`AutoModelForCausalLM` (and so `--model FOLDER`) load phi4flash folders."""
    llama_stack.register_auto(Phi4FlashConfig, Phi4FlashForCausalLM)


register()
