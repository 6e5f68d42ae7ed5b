"""vLLM's `vllm.general_plugins` entry point: registers evalsuite's DiffLlama with vLLM's model
registry, so that `vllm serve` (and any `vllm.LLM`) loads HF DiffLlama checkpoints.

vLLM calls `register` in every process it starts (engine core, workers), possibly more than
once; registering by "module:class" string keeps it light (nothing heavy is imported until a
DiffLlama checkpoint is loaded) and repeatable.
"""

from __future__ import annotations

ARCHITECTURE = "DiffLlamaForCausalLM"  # config.json "architectures" of transformers' DiffLlama
MODEL_CLASS = "evalsuite.backends.vllm.diffllama:DiffLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
