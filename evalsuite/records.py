"""Samples, records and the run folder on disk.

    results/<run>/config.json     everything needed to rerun (written first)
    results/<run>/samples.jsonl   one record per sample, appended and flushed
    results/<run>/summary.json    derived from samples.jsonl only (written last)
    results/<run>/plots/

A run is complete exactly when summary.json exists. A run killed at any moment
leaves a prefix of whole lines plus at most one torn line, which `RunFolder`
cuts off before appending again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError


@dataclass(frozen=True)
class Sample:
    """One evaluation item, deterministic from the task parameters, seed and index."""

    id: str
    task: str
    axes: Mapping[str, Any]  # what reports group by: context_length, depth, n_shots...
    target: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)  # what the prompt is built from


@dataclass(frozen=True)
class Record:
    """One finished sample: what was asked, what came back, how it scored."""

    id: str
    task: str
    model: str
    axes: Mapping[str, Any]
    target: tuple[str, ...]
    prompt: Mapping[str, Any]  # sha256 and token counts; the text only with --log-prompts
    info: Mapping[str, Any]  # measured facts: prompt_tokens, needle positions...
    outputs: tuple[Any, ...]
    scores: Mapping[str, Any]
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Record:
        values = dict(raw)
        values["target"] = tuple(values.get("target", ()))
        values["outputs"] = tuple(values.get("outputs", ()))
        return cls(**values)


def prompt_fields(prompts: Iterable[str], keep_text: bool) -> dict[str, Any]:
    """A hash of the prompts (their token counts live in the record's info), and the
    text itself only when asked for: a 64K-token run must not write gigabytes."""
    prompts = list(prompts)
    joined = "\x1e".join(prompts)
    out: dict[str, Any] = {"sha256": hashlib.sha256(joined.encode()).hexdigest()}
    if keep_text:
        out["text"] = prompts
    return out


def config_hash(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class RunFolder:
    """The files of one run; appends records durably and reads them back."""

    def __init__(self, path: Path):
        self.path = path
        self.config_path = path / "config.json"
        self.samples_path = path / "samples.jsonl"
        self.summary_path = path / "summary.json"
        self.plots = path / "plots"

    @property
    def complete(self) -> bool:
        return self.summary_path.is_file()

    def create(self, config: Mapping[str, Any]) -> None:
        """Make the folder and its config, or check that an existing one matches."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.plots.mkdir(exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot write output folder {self.path}: {exc.strerror or exc}") from None
        if not os.access(self.path, os.W_OK):
            raise UserError(f"cannot write output folder {self.path}: permission denied")
        if self.config_path.is_file():
            existing = self.read_config()
            if existing.get("hash") != config.get("hash"):
                raise UserError(f"{self.path} holds a run with a different configuration; choose another --out")
            return
        write_json_atomic(self.config_path, config)

    def read_config(self) -> dict[str, Any]:
        try:
            return json.loads(self.config_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{self.path} is not a readable run folder: {exc}") from None

    def read_records(self, repair: bool = False) -> list[Record]:
        """Whole records in file order. A torn last line (a run killed mid-write) is
        ignored, and cut off the file when `repair` is set, so it gets redone."""
        if not self.samples_path.is_file():
            return []
        raw = self.samples_path.read_bytes()
        records, good_end = [], 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                records.append(Record.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                break
            good_end += len(line)
        if good_end != len(raw):
            if not repair:
                raise UserError(f"{self.samples_path} has a damaged line; rerun the same command to repair it")
            with self.samples_path.open("r+b") as fh:
                fh.truncate(good_end)
        return records

    def append(self, records: Iterable[Record]) -> None:
        with self.samples_path.open("a", encoding="utf-8") as fh:
            for record in records:
                fh.write(record.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)


def open_run(path: str | Path) -> RunFolder:
    """An existing run folder, with a clear error for anything else."""
    run = RunFolder(Path(path))
    if not run.config_path.is_file():
        raise UserError(f"not a run folder (no config.json): {path}")
    return run
