"""Toy checkpoints written as a trainer writes them: the shipped toy-base, whole or in two
safetensors shards with an index, and a worse copy (layer 1's queries and keys scaled to zero:
uniform attention there, the retrieval circuit gone)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

# six samples: the fewest in which a gate of pass/fail pairs can see a regression at alpha 0.05 (four
# pairs all lost give p >= 0.068 at best, and a check that cannot fail is refused)
NEEDLE_FLAGS = ("--task", "needle", "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=3")
NEEDLE = {"lengths": [256], "depths": [0, 1], "samples": 3}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


def toy_base() -> Path:
    from evalsuite.models import HERE

    return HERE / "toy-base"


def weights(perturbed: bool = False) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(toy_base() / "model.safetensors")
    if perturbed:
        for name in ("q_proj", "k_proj"):
            key = f"model.layers.1.self_attn.{name}.weight"
            tensors[key] = tensors[key] * 0.0
    return tensors


def write_checkpoint(folder: Path, perturbed: bool = False) -> Path:
    """A whole checkpoint: toy-base's files, its weights in one safetensors file."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    for path in toy_base().iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, folder / path.name)
    save_file(weights(perturbed), folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def shard_bytes() -> tuple[dict[str, str], list[bytes], int]:
    """toy-base's weights as two safetensors files: (weight map, each file's bytes, total tensor bytes)."""
    from safetensors.torch import save

    tensors = weights()
    names = sorted(tensors)
    halves = (names[: len(names) // 2], names[len(names) // 2:])
    files = [save({n: tensors[n].contiguous() for n in half}, metadata={"format": "pt"}) for half in halves]
    weight_map = {n: SHARDS[i] for i, half in enumerate(halves) for n in half}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    return weight_map, files, total


def write_sharded_slowly(folder: Path, pause: Callable[[str], None]) -> Path:
    """The checkpoint written as a trainer might: small files and the index first, then shard 1,
    then half of shard 2, then the rest; `pause(stage)` is called after each stage."""
    folder.mkdir(parents=True)
    for path in toy_base().iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, folder / path.name)
    weight_map, files, total = shard_bytes()
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / SHARDS[0]).write_bytes(files[0])
    pause("shard 2 missing")
    with (folder / SHARDS[1]).open("wb") as fh:
        fh.write(files[1][: len(files[1]) // 2])
        fh.flush()
        pause("shard 2 half written")
        fh.write(files[1][len(files[1]) // 2:])
    return folder


def write_unloadable(folder: Path) -> Path:
    """Complete files that cannot load: config.json says the hidden size is twice what the weights hold."""
    write_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    return folder
