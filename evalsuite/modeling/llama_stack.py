"""What evalsuite's own model classes share: a Llama's body over other decoder layers, and their
registration with transformers' Auto classes.

DIFF V2 and Motif keep LlamaModel's and LlamaForCausalLM's forward passes and change only the
decoder layer; `LlamaModel.__init__` would first allocate a Llama's layers, so the bodies are built
here instead. Phi-4-mini-flash has a body of its own and uses only `register_auto`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from evalsuite.modeling import compat

_llama = compat.llama_modeling()
# the Llama classes DIFF V2 and Motif build on (typed Any: transformers' own annotations vary by release)
LlamaDecoderLayer: Any = _llama.LlamaDecoderLayer
LlamaPreTrainedModel: Any = _llama.LlamaPreTrainedModel
LlamaModel: Any = _llama.LlamaModel
LlamaForCausalLM: Any = _llama.LlamaForCausalLM


def build_model_body(model: Any, config: Any, layer_class: type[nn.Module]) -> None:
    """LlamaModel's attributes on `model`, with `layer_class(config, index)` as its decoder layers."""
    _llama.LlamaPreTrainedModel.__init__(model, config)
    model.padding_idx = config.pad_token_id
    model.vocab_size = config.vocab_size
    model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, model.padding_idx)
    model.layers = nn.ModuleList([layer_class(config, i) for i in range(config.num_hidden_layers)])
    model.norm = _llama.LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    model.rotary_emb = _llama.LlamaRotaryEmbedding(config=config)
    model.gradient_checkpointing = False
    model.post_init()


def build_causal_lm(model: Any, config: Any, body_class: type[nn.Module]) -> None:
    """LlamaForCausalLM's attributes on `model`, over a `body_class(config)` body."""
    _llama.LlamaPreTrainedModel.__init__(model, config)
    model.model = body_class(config)
    model.vocab_size = config.vocab_size
    model.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    model.post_init()


def project_heads(attention: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value of an attention module with Llama's `q_proj`, `k_proj`, `v_proj` and
    `head_dim`, each as (batch, heads, time, head_dim): how many heads each has is its projection's."""
    shape = (*hidden_states.shape[:2], -1, attention.head_dim)
    return tuple(projection(hidden_states).view(shape).transpose(1, 2)
                 for projection in (attention.q_proj, attention.k_proj, attention.v_proj))


def register_auto(config_class: type, model_class: type) -> None:
    """Make `AutoConfig`/`AutoModelForCausalLM` (and so `--model FOLDER`) load folders of this model type."""
    try:
        AutoConfig.register(config_class.model_type, config_class)  # type: ignore[attr-defined]
        AutoModelForCausalLM.register(config_class, model_class)
    except ValueError:  # registered already (a second import path, or a caller registered it first)
        pass
