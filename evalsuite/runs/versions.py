"""Which code made each of several runs, told side by side: `compare`, `check` and `trend` name
every version that differs among the runs they pair (config.json's `versions` and `task_versions`,
written by the engine's code_versions.py).

And which code made each record of one run: a run resumed under other library versions than
those that wrote its records so far is refused, naming both, unless the resume is asked to go on
(`run --allow-version-change`). Then config.json keeps `versions` (those of the first records)
and gains a `resumed_under` entry: the new versions and the ids of the samples left to write,
which they write. A sample's record is written by the last entry that lists it, else by
`versions`; `compare`, `check` and `trend` show such a run's versions joined by `+`.
"""

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


RESUMED = "resumed_under"  # config.json: the later versions that resumed the run, with the samples each wrote


def _at(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None and dotted == "versions.lm-eval":  # folders written before the names were normalised
        value = _at(config, "versions.lm_eval")
    later = config.get(RESUMED) if dotted.startswith("versions.") else None
    if isinstance(later, list) and later:  # a run whose records were written by several versions: all of them
        every = dict.fromkeys(str(v) for v in [value, *(_at(part, dotted) for part in later
                                                        if isinstance(part, Mapping))] if v is not None)
        return "+".join(every) if len(every) > 1 else value
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


# ---- one run resumed under other versions -------------------------------------------------------------


def latest_versions(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The versions that wrote a run's latest records: its last `resumed_under` entry's, else `versions`."""
    later = [part for part in config.get(RESUMED) or () if isinstance(part, Mapping)]
    found = later[-1].get("versions") if later else config.get("versions")
    return found if isinstance(found, Mapping) else None


def _changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[str, str]:
    """('transformers 4.50.0, torch 2.5.0', 'transformers 4.51.0, torch 2.6.0'): what differs, each side."""
    keys = [key for key in dict.fromkeys([*before, *now]) if before.get(key) != now.get(key)]

    def side(versions: Mapping[str, Any]) -> str:
        return ", ".join(f"{key} {versions.get(key, 'absent')}" for key in keys)
    return side(before), side(now)


def resume_versions(config: dict[str, Any], current: Mapping[str, str], todo: Sequence[str], path: Path,
                    allow: bool) -> str | None:
    """Check a resume against the versions that wrote the run's records so far. Nothing to write, the
    same versions, or a run that recorded none: None. Other versions: a UserError naming both, or with
    `allow` a `resumed_under` entry added to `config` (the caller writes it) and a line saying so."""
    before = latest_versions(config)
    if not todo or before is None or dict(before) == dict(current):
        return None
    was, now = _changes(before, current)
    if not allow:
        raise UserError(f"{path} holds records written with {was}; this resume has {now}: resume it with "
                        "those versions, or pass --allow-version-change to write the other "
                        f"{len(todo)} samples with these (config.json then records which versions wrote which)")
    earlier = config.get(RESUMED)
    config[RESUMED] = [*(earlier if isinstance(earlier, list) else []), {"versions": dict(current), "samples": list(todo)}]
    return (f"note: {path}: its records so far were written with {was}; the {len(todo)} left are written with "
            f"{now} (--allow-version-change; listed in config.json's {RESUMED})")
