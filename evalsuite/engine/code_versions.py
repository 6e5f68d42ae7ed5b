"""Which code made a run: the task's own versions, the libraries' releases, and what follows from them.

A task declares two versions (contracts.TaskBase): `plan_version`, of what decides its samples and
prompts, and `score_version`, of how it scores an output. The plan version is part of the run's
identity, so a changed prompt builder starts a new run folder. The score version is not: a run
resumed under a newer scorer keeps its outputs and is scored again, with no model call. The
libraries' releases go into config.json, and `compare`, `check` and `trend` name every difference
between the runs they pair.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evalsuite import compat
from evalsuite.errors import UserError
from evalsuite.types import LOGLIKELIHOOD_KEYS, RequestKind, Sample, output_from_json
from evalsuite.version import __version__

from .records import Record, RunFolder, open_run, write_json_atomic

LIBRARIES = ("torch", "transformers", "datasets", "lm-eval")
# what `compare`, `check` and `trend` hold side by side: (config.json path, the name printed)
COMPARED = (("versions.evalsuite", "evalsuite"), ("task_versions.plan", "task plan"),
            ("task_versions.score", "task scoring"), ("versions.transformers", "transformers"),
            ("versions.torch", "torch"), ("versions.lm-eval", "lm-eval"))
_warned: set[str] = set()


def task_versions(task: Any) -> dict[str, int]:
    return {"plan": int(task.plan_version), "score": int(task.score_version)}


def library_versions() -> dict[str, str]:
    """Python, evalsuite and the installed releases of the libraries a run's results depend on."""
    versions = {"python": platform.python_version(), "evalsuite": __version__}
    for package in LIBRARIES:
        version = compat.installed_version(package)
        if version is not None:
            versions[package] = version
    return versions


def warn_untested() -> dict[str, str]:
    """Libraries installed outside the tested range, each told once per process on stderr."""
    found = compat.untested()
    for name, why in found.items():
        if name not in _warned:
            _warned.add(name)
            print(f"warning: {why}; results are not vouched for (pip install -c constraints.txt pins the tested "
                  "releases)", file=sys.stderr)
    return found


# ---- versions of paired runs ----------------------------------------------------------------------------


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
    from evalsuite.analysis.inputs import suite_runs

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


# ---- scoring again under a newer scorer ------------------------------------------------------------------


def _stored_kind(raw: Any) -> RequestKind:
    """The request kind a stored output answered, from its shape (types.py's table)."""
    if isinstance(raw, str):
        return "generation"
    if isinstance(raw, Mapping) and LOGLIKELIHOOD_KEYS <= raw.keys():
        return "loglikelihood"
    return "probe"


def _rescored(task: Any, sample: Sample, record: Record) -> Record:
    from dataclasses import replace

    outputs = [output_from_json(_stored_kind(raw), raw) for raw in record.outputs]
    try:
        return replace(record, scores=dict(task.score(sample, outputs)), error=None)
    except Exception as exc:  # as when the run scored it first: recorded on the sample, the run goes on
        first = str(exc).splitlines()[0] if str(exc) else ""
        return replace(record, scores={}, error=f"{type(exc).__name__}: {first}".rstrip(": "))


def rescore_outdated(task: Any, run: RunFolder, samples: Sequence[Sample]) -> str | None:
    """Score a run's saved outputs again when its config records an older scoring version than
    the task's; samples.jsonl and config.json are rewritten. A line saying so, or None."""
    config = run.read_config()
    recorded = (config.get("task_versions") or {}).get("score")
    current = int(task.score_version)
    if recorded is None or int(recorded) >= current:
        return None
    by_id = {sample.id: sample for sample in samples}
    records = run.read_records(repair=True)
    # an errored sample has no outputs to score: it is left as it is and rerun as before
    rescored = [_rescored(task, by_id[r.id], r) if r.id in by_id and r.outputs else r for r in records]
    run.replace_records(rescored)
    config["task_versions"] = {**config.get("task_versions", {}), "score": current}
    write_json_atomic(run.config_path, config)
    return (f"note: {run.path} was scored by {task.name} scoring version {recorded}; scored its "
            f"{sum(r.id in by_id and bool(r.outputs) for r in records)} saved outputs again with version {current} "
            "(no model call)")
