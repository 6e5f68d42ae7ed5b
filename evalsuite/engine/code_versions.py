"""Which code made a run: the task's own versions, the libraries' releases, and what follows from them.

A task declares two versions (contracts.TaskBase): `plan_version`, of what decides its samples and
prompts, and `score_version`, of how it scores an output. The plan version is part of the run's
identity, so a changed prompt builder starts a new run folder. The score version is not: a run
resumed under a newer scorer keeps its outputs and is scored again, with no model call. The
libraries' releases go into config.json, and `compare`, `check` and `trend` name every difference
between the runs they pair (runs/versions.py).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from evalsuite.modeling import compat
from evalsuite.runs.records import Record, RunFolder, write_json_atomic
from evalsuite.types import LOGLIKELIHOOD_KEYS, RequestKind, Sample, output_from_json
from evalsuite.version import __version__

LIBRARIES = ("torch", "transformers", "datasets", "lm-eval")
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
