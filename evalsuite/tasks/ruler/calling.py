"""How lm-eval's RULER generators are called: seeded as in an lm-eval process, quiet, and with names
of their module replaced while the call lasts (stand_ins.py says which).

Seeded as in an lm-eval process: lm-eval seeds Python's and numpy's random, and only then imports the
RULER modules its task YAML names (every RULER YAML includes niah_single_1.yaml, so the needle module
and NLTK come in). Imports can draw from the seeded generators: today NLTK imports scikit-learn, whose
progress bar imports rich, which takes `getrandbits(24)` for its style ids. The samples depend on
those draws, so their number is measured once per process, in a fresh interpreter that imports what
lm-eval has imported when it seeds, seeds, then imports what the RULER modules import
(`lmeval_compat.SEED_DRAWS_SCRIPT`); each generation draws as many after seeding.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from evalsuite.errors import UserError
from evalsuite.modeling import lmeval_compat


@contextlib.contextmanager
def replaced(module: ModuleType, names: dict[str, Any]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in names}
    vars(module).update(names)
    try:
        yield
    finally:
        vars(module).update(saved)


@contextlib.contextmanager
def seeded(seeds: tuple[int, int]) -> Iterator[None]:
    """lm-eval's seeding, and the draws its imports make after it; this process's random states put back after."""
    import numpy as np

    saved = random.getstate(), np.random.get_state()
    random.seed(seeds[0])
    np.random.seed(seeds[1])
    python, numpy = draws_after_seed()
    for _ in range(python):  # a 32-bit word each, as getrandbits(24) takes
        random.getrandbits(32)
    for _ in range(numpy):
        np.random.bytes(4)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The generators print progress bars and sizing lines; a run shows its own progress."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


@functools.cache
def draws_after_seed() -> tuple[int, int]:
    """(Python's, numpy's) 32-bit draws between lm-eval's seeding and its RULER generator, measured in
    a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", lmeval_compat.SEED_DRAWS_SCRIPT], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        raise UserError(f"could not measure lm-eval's draws after seeding: {lines[-1]}")
    python, numpy = json.loads(done.stdout.strip().splitlines()[-1])
    return int(python), int(numpy)
