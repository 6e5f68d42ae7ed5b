"""Shared fixtures: a toy tokenizer and tiny random Llama / DiffLlama folders.

Everything is built locally on the fly: no test downloads anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = dict(hidden=64, layers=2, heads=4, intermediate=128, max_context=4096)


@pytest.fixture(scope="session")
def toy_tokenizer():
    from evalsuite.models.toy import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, toy_tokenizer) -> dict[str, Path]:
    """{'base': folder, 'diff': folder}: randomly initialised, same tokenizer."""
    from evalsuite.models.toy import ToySize, save_random_model

    root = tmp_path_factory.mktemp("tiny")
    return {kind: save_random_model(kind, root / f"tiny-{kind}", toy_tokenizer, ToySize(**TINY), seed=1)
            for kind in ("base", "diff")}


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`evalsuite ARGS...` in a subprocess, as a user would type it."""
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)
