"""A run as its readers see it: its folder, its config and its records, and nothing that changes them.

A task's hooks that read a run (its summary, its plots, its report section, its side scores, its run
step) are handed a `ReadOnlyRun`: they read the records and the config as the engine and every
reader do (records.py's one rule), and find the side files their own step keeps beside the records
(judgements/) under `path`. A `RunFolder` offers the same reading, so a function that only reads a
run takes either (`RunView`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from .records import Record


class RunView(Protocol):
    """What reading a run needs: where it is, its config and its records."""

    @property
    def path(self) -> Path:
        """The run folder (side files a task's step writes sit in it)."""
        ...

    @property
    def plots(self) -> Path:
        """The run's plots folder."""
        ...

    def read_config(self) -> dict[str, Any]: ...

    def read_records(self) -> list[Record]: ...


class ReadOnlyRun:
    """A finished run handed to a task's hooks: records read once, each caller given its own copies."""

    def __init__(self, run: RunView):
        self._folder = run
        self._records: tuple[Record, ...] | None = None  # records are frozen: one read serves every hook

    def __repr__(self) -> str:
        return f"ReadOnlyRun({str(self._folder.path)!r})"

    @property
    def path(self) -> Path:
        return self._folder.path

    @property
    def plots(self) -> Path:
        return self._folder.plots

    def read_config(self) -> dict[str, Any]:
        return self._folder.read_config()  # a fresh dict: a hook cannot change what the next one reads

    def read_records(self) -> list[Record]:
        if self._records is None:
            self._records = tuple(self._folder.read_records())
        return list(self._records)
