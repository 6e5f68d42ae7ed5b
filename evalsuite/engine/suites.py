"""Suites: a small TOML file listing task configurations, run as one; this module reads and checks one.

    name = "ci-smoke"          # optional; defaults to the file name without .toml
    description = "..."        # optional
    default_scale = "quick"    # optional: the scale used when --scale is not given

    [[run]]
    task = "needle"            # a registered task
    name = "needle"            # optional label, unique in the suite; defaults to the task
    limit = 20                 # optional: only the first N samples of the plan
    optional = true            # optional: skipped (one line saying what to provide) when it cannot run
    needs_option = "judge"     # optional: a run-step option the entry cannot do without (--judge)
    clip_to_context = "lengths"  # optional: a parameter of lengths; those over a model's context are left out
    [run.params]               # the task's -T parameters as TOML values
    lengths = [512, 1024]
    data = "{data_dir}/icl/trec.jsonl"   # {data_dir}: the folder given with --data-dir
    [run.without_data]         # the parameters used instead when that file is not there
    data = ""                  # (here: the task's own hub dataset)
    [run.scale.quick]          # parameters of one scale (--scale quick), over [run.params]
    samples = 4

A string parameter may also contain `{suite_dir}`, the folder holding the suite file, so that a
suite can ship its small data files beside it. The whole file is checked (keys, tasks, parameters,
data files) before anything runs; what an entry lacks to run (a data file, a run-step option) is
found here and told by `suite_run.check_needs` before the first entry runs, so a suite never
fails after hours for a file, a dataset or a judge it could have asked for at the start. An entry
is skipped, never failed, only when it says `optional = true`. The core names no task: what an
entry needs is read from its own keys and from its task's `prepare(None)`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, did_you_mean, unknown

from .run_steps import given_as

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SHIPPED = Path(__file__).parents[1] / "suites"  # evalsuite/suites: the package data holds the shipped suites
ENTRY_KEYS = ("optional", "needs_option", "clip_to_context", "without_data", "scale")
DATA_DIR = "{data_dir}"
SUITE_KEYS = ("name", "description", "run", "default_scale")
RUN_KEYS = ("task", "name", "limit", "params", *ENTRY_KEYS)


@dataclass(frozen=True)
class SuiteSettings:
    """What the command line adds to a suite: its scale, the local data folder, the run-step options given."""

    scale: str | None = None
    data_dir: Path | None = None
    step: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class EntryNeeds:
    """An entry's parameters once its scale and data folder are applied, and why it cannot run (None: it can)."""

    params: dict[str, Any]
    missing: str | None = None
    local_hint: str | None = None  # the local files that would stand in for a dataset the task fetches itself


@dataclass(frozen=True)
class SuiteEntry:
    name: str
    task: Any  # the task's parameter dataclass, validated
    limit: int | None = None
    optional: bool = False  # skipped with a line, rather than failing the suite, when it cannot run
    missing: str | None = None  # what the entry lacks to run (a data file, a run-step option), found on loading
    clip: str | None = None  # the parameter of lengths cut to each model's context
    step: Any = None  # the task's run step (judging) built from the run-step options given
    local_hint: str | None = None  # the local files that would stand in for the hub data it needs


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    entries: tuple[SuiteEntry, ...]
    scale: str | None = None
    skipped: tuple[tuple[SuiteEntry, str], ...] = ()  # (entry, why) for optional entries that cannot run


def shipped_suites() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.toml"))


def find_suite(name_or_path: str | Path) -> Path:
    """A suite file path, or the name of a suite shipped with evalsuite."""
    text = str(name_or_path)
    if Path(text).is_file():
        return Path(text)
    if Path(text).is_dir():
        raise UserError(f"--suite {text} is a folder; give a suite file (.toml) or a shipped suite's name")
    if "/" in text or text.endswith(".toml"):
        raise UserError(f"suite file not found: {text}")
    if (SHIPPED / f"{text}.toml").is_file():
        return SHIPPED / f"{text}.toml"
    raise unknown("suite (neither a file nor a shipped suite)", text, shipped_suites())


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")


def _param_text(value: Any, suite_dir: Path, where: str) -> str:
    """A TOML value as the string `-T key=value` would give."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        if "{suite_dir}" not in value:
            return value
        resolved = value.replace("{suite_dir}", str(suite_dir.resolve()))
        if not Path(resolved).exists():
            raise UserError(f"{where}: data file {resolved} does not exist")
        return resolved
    if isinstance(value, list) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return ",".join(_param_text(v, suite_dir, where) for v in value)
    raise UserError(f"{where}: values must be numbers, booleans, strings or lists of them, got {value!r}")


def _entry(raw: Any, index: int, suite: str, suite_dir: Path, seed: int | None, scale: str | None,
           settings: SuiteSettings) -> SuiteEntry:
    from evalsuite.registry import get_task

    from .runner import make_task

    where = f"suite {suite}, [[run]] #{index + 1}"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table")
    _check_keys(raw, RUN_KEYS, where)
    task = raw.get("task")
    if not isinstance(task, str):
        raise UserError(f"{where}: needs task = \"<task name>\"")
    name = raw.get("name", task)
    where = f"suite {suite}, run {name!r}"
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"{where}: limit must be a positive integer, got {limit!r}")
    check_entry_keys(raw, where)
    needs = entry_needs(raw, scale, settings, where)
    optional = bool(raw.get("optional", False))
    if needs.missing is not None and not optional:
        raise UserError(f"{where}: {needs.missing}")
    try:
        get_task(task)
        text = {k: _param_text(v, suite_dir, f"{where}, parameter {k}") for k, v in needs.params.items()}
        task_obj = make_task(task, text, seed)
        check_clip_parameter(task_obj, raw.get("clip_to_context"), where)
    except UserError as exc:
        message = str(exc)
        raise UserError(message if message.startswith(where) else f"{where}: {message}") from None
    return SuiteEntry(name=str(name), task=task_obj, limit=limit, optional=optional, missing=needs.missing,
                      clip=raw.get("clip_to_context"), local_hint=needs.local_hint)


def load_suite(name_or_path: str | Path, seed: int | None = None, settings: SuiteSettings | None = None) -> Suite:
    """Read and validate a suite: every error is reported before anything runs.
    `seed` applies to every entry whose task has a seed that the suite does not set;
    `settings` holds --scale, --data-dir and the run-step options given."""
    settings = settings or SuiteSettings()
    path = find_suite(name_or_path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"suite file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"suite file {path} is not UTF-8 text (a TOML file must be UTF-8)") from None
    except OSError as exc:
        raise UserError(f"cannot read suite file {path}: {exc.strerror or exc}") from None
    _check_keys(raw, SUITE_KEYS, f"suite file {path}")
    name = str(raw.get("name", path.stem))
    runs = raw.get("run", [])
    if not isinstance(runs, list) or not runs:
        raise UserError(f"suite {name} lists no runs; add [[run]] tables with task = \"...\"")
    scale = chosen_scale(raw, runs, settings, name)
    entries = tuple(_entry(item, i, name, path.parent, seed, scale, settings) for i, item in enumerate(runs))
    names = [e.name for e in entries]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"suite {name}: runs named {', '.join(repeated)} more than once; give each [[run]] a "
                        f"distinct name = \"...\"")
    return Suite(name=name, description=str(raw.get("description", "")), path=path, entries=entries, scale=scale)


# ---- scales, local data and what an entry needs ----------------------------------------------


def suite_scales(runs: list[Any]) -> list[str]:
    """Every scale some entry names, sorted."""
    names = {name for raw in runs if isinstance(raw, dict) and isinstance(raw.get("scale"), dict)
             for name in raw["scale"]}
    return sorted(names)


def chosen_scale(raw: Mapping[str, Any], runs: list[Any], settings: SuiteSettings, suite: str) -> str | None:
    """The scale to apply: --scale, else the suite's default_scale; refused when the suite has no such scale."""
    scales = suite_scales(runs)
    scale = settings.scale if settings.scale is not None else raw.get("default_scale")
    if scale is None:
        return None
    if not isinstance(scale, str):
        raise UserError(f"suite {suite}: default_scale must be a string, got {scale!r}")
    if not scales:
        raise UserError(f"suite {suite} has no scales ([run.scale.NAME] tables); drop --scale")
    if scale not in scales:
        raise unknown(f"scale of suite {suite}", scale, scales)
    return scale


def entry_needs(raw: Mapping[str, Any], scale: str | None, settings: SuiteSettings, where: str) -> EntryNeeds:
    """The entry's parameters for `scale` with {data_dir} resolved, and what it lacks to run."""
    params = dict(_table(raw, "params", where))
    scales = _table(raw, "scale", where)
    for name, table in scales.items():
        if not isinstance(table, dict):
            raise UserError(f"{where}: [run.scale.{name}] must be a table of parameters")
    if scale is not None:
        params.update(scales.get(scale, {}))
    params, lacking, fell_back = _with_data_dir(params, _table(raw, "without_data", where), settings.data_dir)
    missing = "give --data-dir DIR holding " + ", ".join(lacking) if lacking else None
    hint = "or give --data-dir DIR holding " + ", ".join(fell_back) if fell_back else None
    option = raw.get("needs_option")
    if option is not None:
        if not isinstance(option, str):
            raise UserError(f"{where}: needs_option must name a run-step option, got {option!r}")
        key = option.lstrip("-").replace("-", "_")  # "judge", or written as its flag, "--judge"
        if key not in settings.step and missing is None:
            missing = f"give {given_as(key)} (a run-step option of its task: `evalsuite run --help`)"
    return EntryNeeds(params, missing, hint)


def _table(raw: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{where}: {key} must be a table ([run.{key}])")
    return value


def _with_data_dir(params: dict[str, Any], without: Mapping[str, Any], data_dir: Path | None
                   ) -> tuple[dict[str, Any], list[str], list[str]]:
    """{data_dir} replaced by --data-dir; a file that is not there is replaced by the entry's
    [run.without_data] value (listed in the third list), and with none the entry lacks it (the second)."""
    out = dict(params)
    lacking, fell_back = [], []
    for key, value in params.items():
        if not (isinstance(value, str) and DATA_DIR in value):
            continue
        resolved = value.replace(DATA_DIR, str(data_dir.resolve())) if data_dir is not None else None
        if resolved is not None and Path(resolved).exists():
            out[key] = resolved
        elif key in without:
            out[key] = without[key]
            fell_back.append(value.replace(DATA_DIR, "DIR"))
        else:
            out.pop(key)
            lacking.append(value.replace(DATA_DIR, "DIR"))
    return out, lacking, fell_back


def check_entry_keys(raw: Mapping[str, Any], where: str) -> None:
    """The types of the keys this module reads (their names are checked with the others')."""
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise UserError(f"{where}: optional must be true or false, got {optional!r}")
    clip = raw.get("clip_to_context")
    if clip is not None and not isinstance(clip, str):
        raise UserError(f"{where}: clip_to_context must name a parameter of lengths, got {clip!r}")


def check_clip_parameter(task: Any, clip: str | None, where: str) -> None:
    """clip_to_context names a parameter of the task that holds token lengths (a tuple of ints)."""
    if clip is None:
        return
    names = [f.name for f in dataclasses.fields(task)]
    if clip not in names:
        raise UserError(f"{where}: clip_to_context names {clip!r}, not a parameter of {task.name}"
                        f"{did_you_mean(clip, names)}")
    value = getattr(task, clip)
    if not (isinstance(value, tuple) and all(isinstance(v, int) for v in value)):
        raise UserError(f"{where}: clip_to_context names {clip!r}, which is not a list of lengths")


