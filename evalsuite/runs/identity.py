"""What a run is, for pairing runs: its task and the parameters that decide its samples.

Two runs pair up (in `compare`, `check` and the HTML report) when their
identities match, whatever the models: that is the point of a comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # evalsuite/: shipped data is named relative to it


def _portable(value: Any) -> Any:
    """Paths to data shipped inside the package compare equal across installations."""
    if isinstance(value, str) and value.startswith("/"):
        try:
            return "<evalsuite>/" + Path(value).resolve().relative_to(PACKAGE_DIR).as_posix()
        except ValueError:
            return value
    return value


def task_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What decides which samples a run holds: the task and its parameters.

    `preset` only supplies defaults (already expanded into the other
    parameters) and `limit` only cuts the plan, which the join on sample id
    handles, so neither is part of the identity."""
    params = {k: _portable(v) for k, v in config["params"].items() if k != "preset"}
    return {"task": config["task"], "params": params}


def identity_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when two identities match, else a short description of what differs."""
    if a["task"] != b["task"]:
        return f"task {a['task']} vs {b['task']}"
    keys = sorted(set(a["params"]) | set(b["params"]))
    diffs = [f"{k}: {a['params'].get(k)!r} vs {b['params'].get(k)!r}" for k in keys
             if a["params"].get(k) != b["params"].get(k)]
    return "; ".join(diffs) or None


# What the run hash is made of. A fingerprint records where a checkpoint was found (its spec,
# path and the config's `_name_or_path`, hashed into `config_sha256`) and, for weights too large
# to hash whole, their modification time. None of that decides the outputs, so the hash leaves
# it out: a moved checkpoint, or the same command from another working directory, finds its run.
# The task's plan version is in it: prompts built by other code are another run.
LOCATION_KEYS = ("spec", "path", "config_sha256", "weights_mtime")
IDENTITY_RULE = "content+plan-version"  # config.json's `identity_rule`


def run_identity(task: str, params: Mapping[str, Any], limit: int | None, fingerprint: Mapping[str, Any],
                 plan_version: int) -> dict[str, Any]:
    """What the run hash covers: the task and the version of its prompt building, its parameters
    (package data by its place in the package), the sample limit and the model's content, never
    file locations."""
    return {**unversioned_identity(task, params, limit, fingerprint), "plan_version": plan_version}


def unversioned_identity(task: str, params: Mapping[str, Any], limit: int | None,
                         fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The identity of earlier releases, which recorded no task version: to recognise their folders."""
    model = {k: v for k, v in fingerprint.items() if k not in LOCATION_KEYS}
    return {"task": task, "params": {k: _portable(v) for k, v in params.items()}, "limit": limit,
            "model": model}
