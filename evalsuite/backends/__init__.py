"""Backends behind the model adapter, chosen by the model spec.

    toy-diff, smollm2 ...     a named model from the registry
    fake[:behaviour]          the scripted fake model (tests, demos)
    gguf:PATH                 a GGUF file, loaded through transformers
    hf:PATH_OR_ID / PATH      any transformers causal LM (local folder or hub id)

Heavy or optional imports happen only when that backend is chosen.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..adapter import ModelAdapter
from ..errors import UserError
from ..registry import resolve_model_name


def load_model(spec: str, options: Mapping[str, str], device: str = "auto", batch_size: int = 8) -> ModelAdapter:
    resolved = resolve_model_name(spec)
    label = spec if resolved else None
    spec = resolved or spec
    kind, sep, rest = spec.partition(":")
    if sep and kind == "fake":
        from .fake import FakeModel

        return FakeModel.from_options(rest, options)
    if spec == "fake":
        from .fake import FakeModel

        return FakeModel.from_options("oracle", options)
    if sep and kind == "gguf":
        from .hf import HFModel

        return HFModel.load(rest, options, device=device, batch_size=batch_size, gguf=True, label=label)
    if sep and kind == "hf":
        spec = rest
    elif sep and kind in ("openai", "vllm"):
        raise UserError(f"the {kind} backend is not available for evaluated models in this version")
    from .hf import HFModel

    return HFModel.load(spec, options, device=device, batch_size=batch_size, label=label)
