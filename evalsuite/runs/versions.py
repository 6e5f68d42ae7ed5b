"""Which code made each of several runs, told side by side: `compare`, `check` and `trend` name
every version that differs among the runs they pair (config.json's `versions` and `task_versions`,
written by the engine's code_versions.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError

from .records import open_run
from .suite_result import suite_runs

# what `compare`, `check` and `trend` hold side by side: (config.json path, the name printed)
COMPARED = (("versions.evalsuite", "evalsuite"), ("task_versions.plan", "task plan"),
            ("task_versions.score", "task scoring"), ("versions.transformers", "transformers"),
            ("versions.torch", "torch"), ("versions.lm-eval", "lm-eval"))


def _at(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None and dotted == "versions.lm-eval":  # folders written before the names were normalised
        return _at(config, "versions.lm_eval")
    return value


def version_differences(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """'transformers 5.23.0 vs 5.24.0'-style entries for every version that differs among the runs'
    configs (a run that did not record one counts as 'unrecorded')."""
    differences = []
    for dotted, label in COMPARED:
        values = [_at(config, dotted) for config in configs]
        shown = ["unrecorded" if value is None else str(value) for value in values]
        if len(set(shown)) > 1:
            differences.append(f"{label} {' vs '.join(dict.fromkeys(shown))}")
    return differences


def versions_line(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming every version difference, or None when the runs agree."""
    found = version_differences(configs)
    return f"note: these runs were made by different code: {'; '.join(found)}" if found else None


def versions_note(inputs: Sequence[str | Path], refuse: bool = False) -> str | None:
    """`versions_line` over the runs that run folders, results folders and suite results hold (a
    baseline file records no code); with `refuse`, a difference is a UserError instead."""
    configs = []
    for folder in _runs_within(inputs):
        try:
            configs.append(open_run(folder).read_config())
        except UserError:  # a reader of the run says what is wrong with it
            continue
    note = versions_line(configs) if len(configs) > 1 else None
    if note is not None and refuse:
        raise UserError(f"--same-versions: {note.removeprefix('note: ')}")
    return note


def _runs_within(inputs: Sequence[str | Path]) -> list[Path]:
    found: list[Path] = []
    for item in map(Path, inputs):
        if (item / "config.json").is_file():
            found.append(item)
        elif item.is_dir():
            found.extend(sorted(child for child in item.iterdir() if (child / "config.json").is_file()))
        elif item.is_file():
            try:
                found.extend(folder for _, folder in suite_runs(item))
            except (UserError, KeyError, TypeError):  # a baseline file: outcomes only, no config
                continue
    return found
