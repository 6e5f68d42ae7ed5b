"""Shared fixtures: a toy tokenizer and tiny random Llama / DiffLlama folders.

Everything is built locally on the fly: no test downloads anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core this process may run on (a container's share, where psutil
    would count every core of the host)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


@pytest.fixture(scope="session", autouse=True)
def generated_data_cache(tmp_path_factory) -> Path:
    """Data tasks generate once (RULER's samples, runs/generated_cache.py) cached in this session's own
    folder, never the user's: shared by the session's tests and the processes they start."""
    folder = tmp_path_factory.mktemp("generated")
    os.environ["EVALSUITE_CACHE"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine each small
    operation would wait for it: one thread keeps in-process tests fast and steady. Only where
    torch is already imported: a test that never uses it must not pay for importing it."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Invoked(NamedTuple):
    """What one `invoke` gave: unpacks as (code, out, err) and reads as a finished process does."""

    code: int
    out: str
    err: str

    @property
    def returncode(self) -> int:
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err


def invoke(capsys, *args: str) -> Invoked:
    """`evalsuite ARGS...` through the same `main()` a user runs, in this process
    (exit code, stdout, stderr), without a fresh interpreter's imports per call."""
    from evalsuite.cli import main

    capsys.readouterr()  # what the test printed before is not this command's output
    argv, sys.argv = sys.argv, ["evalsuite", *args]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return Invoked(code, captured.out, captured.err)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`evalsuite ARGS...` in a subprocess, as a user would type it."""
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)
