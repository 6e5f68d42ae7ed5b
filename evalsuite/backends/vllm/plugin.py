"""vLLM's `vllm.general_plugins` entry point: registers evalsuite's DiffLlama and DIFF V2 with
vLLM's model registry, so that `vllm serve` (and any `vllm.LLM`) loads their checkpoints.

vLLM calls `register` in every process it starts (engine core, workers), possibly more than
once; registering by "module:class" string keeps it light (nothing heavy is imported until such a
checkpoint is loaded; the V2 config class, which vLLM reads through transformers, is small) and repeatable.
"""

from __future__ import annotations

# config.json "architectures" -> the vLLM model class that runs it
MODELS = {
    "DiffLlamaForCausalLM": "evalsuite.backends.vllm.diffllama:DiffLlamaForCausalLM",  # transformers' DiffLlama
    "DiffLlamaV2ForCausalLM": "evalsuite.backends.vllm.diffllama_v2:DiffLlamaV2ForCausalLM",  # DIFF V2
    "MotifForCausalLM": "evalsuite.backends.vllm.motif:MotifForCausalLM",  # Motif-2.6B, Motif-2-12.7B (GDA)
}


def register() -> None:
    from vllm import ModelRegistry

    import evalsuite.modeling.diffllama_v2  # noqa: F401  (AutoConfig learns "diffllama_v2" in this process)
    import evalsuite.modeling.motif  # noqa: F401  (AutoConfig learns "Motif")

    for architecture, model_class in MODELS.items():
        ModelRegistry.register_model(architecture, model_class)
