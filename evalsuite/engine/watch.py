"""Following a training folder: which checkpoints it holds, which are complete, which were done.

A checkpoint is a sub-folder whose name matches the pattern (`checkpoint-*`) and that states a
training step (in its name, or in its trainer_state.json). It is ready when either

- the marker file the user names exists in it (a trainer that writes one last), or
- its config.json parses, its weights are all there (the index, when there is one, and every
  shard it lists; a safetensors file whose tensors run past its end is still being written),
  and none of its files changed size or time between two looks at least `settle` seconds apart.

What was done is a ledger, `OUT/watch/ledger.jsonl`: one line per checkpoint evaluated (or
failed), appended when it is finished. A watcher killed and started again reads it and
evaluates nothing twice; a run cut short in the middle resumes in its run folder as any run
does. `OUT/watch/state.json` says what the watcher waits for, checkpoint by checkpoint.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsuite.backends.common.checkpoint import WEIGHT_SUFFIXES, check_weight_files, read_config
from evalsuite.errors import UserError
from evalsuite.runs.records import write_json_atomic
from evalsuite.runs.safe_json import holds, json_lines

from .steps import step_from_name, step_from_trainer_state

SHARD_NAME = re.compile(r"-\d{5}-of-\d{5}\.")  # model-00001-of-00002.safetensors: one of several


@dataclass(frozen=True)
class Candidate:
    """A checkpoint folder of the training run and its step."""

    path: Path
    step: int

    @property
    def name(self) -> str:
        return self.path.name


def candidates(folder: Path, pattern: str) -> tuple[list[Candidate], list[str]]:
    """The checkpoint folders under `folder` that match `pattern`, by step; and the names of
    those without a step (they cannot be put on a trend)."""
    found, stepless = [], []
    for child in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not child.is_dir() or not fnmatch.fnmatch(child.name, pattern):
            continue
        step = step_from_name(child.name)
        if step is None:
            try:
                step = step_from_trainer_state(child)
            except UserError:  # a trainer_state.json still being written: look again later
                step = None
        if step is None:
            stepless.append(child.name)
        else:
            found.append(Candidate(child, step))
    return sorted(found, key=lambda c: (c.step, c.name)), stepless


def not_ready(folder: Path, marker: str | None) -> str | None:
    """Why the checkpoint cannot be evaluated yet, or None when its files are complete. A reason
    that starts with SKIPPED is a file no load could read (see `odd_file`)."""
    if marker is not None and not (folder / marker).exists():
        return f"no {marker} yet"
    odd = odd_file(folder)
    if odd is not None or marker is not None:
        return odd
    if not (folder / "config.json").is_file():
        return "no config.json yet"
    weights = [p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES]
    indexes = list(folder.glob("*.index.json"))
    if not weights:
        return "no weights yet"
    if not indexes and any(SHARD_NAME.search(p.name) for p in weights):
        return "weight shards without their index yet"
    try:
        read_config(folder, folder.name)  # a config.json half written does not parse
        check_weight_files(folder, folder.name)  # a shard missing, a safetensors file cut short
    except UserError as exc:
        return str(exc).removeprefix(f"could not load {folder.name}: ")
    return None


SKIPPED = "skipped: "  # the start of a reason that no wait will end by itself


def odd_file(folder: Path) -> str | None:
    """Why a file of the checkpoint cannot be read as one, or None: a FIFO, socket or device (opening
    one to read it blocks until some other process writes, perhaps forever), or a file this user may
    not read. Such a checkpoint is skipped, with a line, until the file is a readable file."""
    for path in sorted(folder.rglob("*")):
        try:
            mode = path.stat().st_mode  # through a link: a link to a FIFO is one
        except OSError:  # removed since the listing, or a link to nothing: the weights' check names it
            continue
        if stat.S_ISDIR(mode):
            continue
        name = path.relative_to(folder)
        if not stat.S_ISREG(mode):
            kind = "FIFO (named pipe)" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device"
            return f"{SKIPPED}{name} is a {kind}, not a file; it is evaluated once that is a readable file"
        if not os.access(path, os.R_OK):
            return f"{SKIPPED}{name} is not readable (permission denied); it is evaluated once it can be read"
    return None


def signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file of the folder with its size and modification time: equal at two looks, nothing grew."""
    files = []
    for path in sorted(folder.rglob("*")):
        try:
            info = path.stat()
        except OSError:  # removed between the listing and the look
            continue
        if path.is_file():
            files.append((str(path.relative_to(folder)), info.st_size, info.st_mtime_ns))
    return tuple(files)


@dataclass
class Readiness:
    """Looks at the checkpoints over time: ready once complete and unchanged for `settle` seconds."""

    marker: str | None = None
    settle: float = 10.0
    seen: dict[Path, tuple[Any, float]] = field(default_factory=dict)  # folder -> (signature, since when)

    def look(self, candidate: Candidate) -> str | None:
        """None when `candidate` is ready now, else what it waits for."""
        why = not_ready(candidate.path, self.marker)
        if why is not None or self.marker is not None:
            self.seen.pop(candidate.path, None)
            return why
        now, current = time.monotonic(), signature(candidate.path)
        before = self.seen.get(candidate.path)
        if before is None or before[0] != current:
            self.seen[candidate.path] = (current, now)
        elif now - before[1] >= self.settle:
            return None
        return f"files complete; waiting for them to stay unchanged for {self.settle:g} seconds"


# ---- what was done ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One ledger line: a checkpoint evaluated ("ok") or not ("failed", with the reason)."""

    checkpoint: str
    path: str
    step: int
    status: str
    runs: tuple[str, ...] = ()  # the run folders (paths) it made
    reason: str | None = None
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # run folder name -> summary's overall
    gate: dict[str, Any] | None = None  # the gate's verdict for this checkpoint, when one was made
    signature: str = ""  # of its files when evaluated: a failed checkpoint rewritten is tried again
    job: str = ""  # what it was evaluated with (task or suite and their parameters), as a digest

    def to_json(self) -> str:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["runs"] = list(self.runs)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Any) -> Entry:
        """The entry a parsed ledger line holds; ValueError saying which field is not what a
        watcher writes (a step that is text, runs that are not a list of paths...)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        for key, kinds in _ENTRY_TYPES.items():
            if key in raw and not holds(raw[key], kinds):
                raise ValueError(f"{key!r} is a {type(raw[key]).__name__}")
        missing = [key for key in ("checkpoint", "path", "step", "status") if key not in raw]
        if missing:
            raise ValueError(f"no {missing[0]!r}")
        if raw["step"] < 0 or not all(isinstance(run, str) for run in raw.get("runs", [])):
            raise ValueError("a negative step, or runs that are not paths")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**{**known, "runs": tuple(known.get("runs", ()))})


# What each field of a ledger line holds (a bool is not a step).
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "checkpoint": (str,), "path": (str,), "step": (int,), "status": (str,), "runs": (list,),
    "reason": (str, type(None)), "metrics": (dict,), "gate": (dict, type(None)), "signature": (str,), "job": (str,)}


class Ledger:
    """`OUT/watch/`: ledger.jsonl (what was done), state.json (what is waited for)."""

    def __init__(self, out: Path):
        self.folder = out / "watch"
        self.path = self.folder / "ledger.jsonl"
        self.state_path = self.folder / "state.json"

    def entries(self) -> list[Entry]:
        """Every line, the last one of a checkpoint winning (a failed one tried again); a line
        cut short by a kill is ignored: its checkpoint is done again, resuming its run folders.
        So is a damaged line (not JSON, nested too deep, a field of the wrong type), with one
        warning line: the ledger is only appended to, so it stays and is said once per process."""
        found: dict[tuple[str, str], Entry] = {}
        if not self.path.is_file():
            return []
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        damaged: list[str] = []
        for line in json_lines(raw):
            if line.torn:
                continue
            try:
                if line.damage is not None:
                    raise ValueError(line.damage)
                entry = Entry.from_dict(line.value)
            except ValueError as exc:
                damaged.append(str(exc))
                continue
            found[entry.path, entry.job] = entry
        if damaged and (self.path, len(raw)) not in _WARNED:
            _WARNED.add((self.path, len(raw)))
            print(f"warning: {self.path}: left out {len(damaged)} damaged line(s) (the first: {damaged[0]}); "
                  "their checkpoints are evaluated again", file=sys.stderr)
        return list(found.values())

    def append(self, entry: Entry) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(entry.to_json() + "\n")
            fh.flush()

    def runs(self) -> list[Path]:
        """The run folders of every checkpoint evaluated, in step order."""
        ok = sorted((e for e in self.entries() if e.status == "ok"), key=lambda e: e.step)
        return [Path(run) for e in ok for run in e.runs]

    def write_state(self, waiting: Mapping[str, str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.state_path, {"waiting": dict(waiting), "time": time.time()})


_WARNED: set[tuple[Path, int]] = set()  # the ledgers this process warned about, by size


def files_digest(folder: Path) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(signature(folder)).encode()).hexdigest()[:16]
