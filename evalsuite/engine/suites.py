"""Suites: a small TOML file listing task configurations, run as one.

    name = "ci-smoke"          # optional; defaults to the file name without .toml
    description = "..."        # optional

    [[run]]
    task = "needle"            # a registered task
    name = "needle"            # optional label, unique in the suite; defaults to the task
    limit = 20                 # optional: only the first N samples of the plan
    [run.params]               # the task's -T parameters as TOML values
    lengths = [512, 1024]
    samples = 4

A string parameter may contain `{suite_dir}`, the folder holding the suite
file, so that a suite can ship its small data files beside it, or `{data_dir}`,
the folder given with `--data-dir`. Scales (`--scale`, `[run.scale.NAME]`),
optional entries, entries clipped to a model's context and entries that need a
run-step option (`--judge`) are described in `suite_scales.py`. The whole file
is checked (keys, tasks, parameters, data files) before anything runs; when it
runs, each entry is first prepared without a model (its data read, the packages
it needs imported: lm-eval for zeroshot), so that a need the machine lacks stops
the suite before its first entry, not after the entries before it ran.

`evalsuite run --suite FILE --model M` makes an ordinary run folder per entry
and a suite result file, `suite-<suite>-<model>.json`, that lists them; `check`
and `report` accept that file wherever they accept a run folder.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.analysis.inputs import RESULT_FORMAT
from evalsuite.errors import UserError, did_you_mean, unknown

from .records import write_json_atomic
from .suite_scales import (
    ENTRY_KEYS,
    SuiteSettings,
    check_clip_parameter,
    check_entry_keys,
    chosen_scale,
    clipped,
    entry_needs,
)

if TYPE_CHECKING:
    from evalsuite.contracts import ModelAdapter

    from .runner import RunOptions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SHIPPED = Path(__file__).parents[1] / "suites"  # evalsuite/suites: the package data holds the shipped suites
SUITE_KEYS = ("name", "description", "run", "default_scale")
RUN_KEYS = ("task", "name", "limit", "params", *ENTRY_KEYS)


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


# ---- running ---------------------------------------------------------------------------------

def run_suite(suite: Suite, specs: Sequence[str], model_options: Mapping[str, str], device: str, batch_size: int,
              options: RunOptions) -> list[Path]:
    """Every entry on each model (loaded once); returns the suite result files."""
    from .progress import overall
    from .runner import for_each_model

    suite = check_needs(suite)
    if not suite.entries:
        raise UserError(f"suite {suite.name}: every entry was skipped; provide what the lines above ask for")
    with overall(len(specs) * len(suite.entries)):  # the overall ETA of progress lines counts every run
        return for_each_model(specs, model_options, device, batch_size, options.out,
                              lambda spec, model: _run_entries(suite, spec, model, options))


def check_needs(suite: Suite) -> Suite:
    """Each entry prepared without a model: what it needs beyond a model (data files, a dataset,
    lm-eval for zeroshot) is refused here, before the first entry runs. An optional entry that
    cannot run is left out of the returned suite, with one line on stderr saying what to provide."""
    kept, skipped = [], list(suite.skipped)
    for entry in suite.entries:
        why = entry.missing or _unprepared(entry)
        if why is None:
            kept.append(entry)
        elif entry.optional:
            skipped.append((entry, why))
            print(f"skipped {entry.name!r} ({entry.task.name}): {why}", file=sys.stderr)
        else:
            raise UserError(f"suite {suite.name}, run {entry.name!r}: {why}")
    return dataclasses.replace(suite, entries=tuple(kept), skipped=tuple(skipped))


def refused_on(entry: SuiteEntry, task: Any, model: ModelAdapter) -> str | None:
    """Why an optional entry clipped to this model's context cannot run on it (its documents too short
    for that context), said in one line and skipped; None when it can, or when it is not optional (the
    run then refuses it as it would any task)."""
    from .runner import check_task

    if not entry.optional:
        return None
    try:
        check_task(task, model)
    except UserError as exc:
        print(f"skipped {entry.name!r} ({task.name}) on {model.name}: {exc}", file=sys.stderr)
        return str(exc)
    return None


def _unprepared(entry: SuiteEntry) -> str | None:
    """Why the entry's task cannot be prepared without a model (its data, its packages), or None."""
    try:
        entry.task.prepare(None)
    except UserError as exc:
        return f"{exc}; {entry.local_hint}" if entry.local_hint else str(exc)
    return None


def _run_entries(suite: Suite, spec: str, model: ModelAdapter, options: RunOptions) -> Path:
    from .distributed import world_from_env
    from .runner import _safe, run_task

    runs, notes, skipped = [], {}, list(suite.skipped)
    for entry in suite.entries:
        limit = options.limit if options.limit is not None else entry.limit
        task, note = clipped(entry.task, entry.clip, model.max_context)
        if note is not None:
            notes[entry.name] = note
            print(f"note: {entry.name} on {model.name}: {note}", file=sys.stderr)
        why = refused_on(entry, task, model) if note is not None else None  # clipped: its data may not reach
        if why is not None:
            skipped.append((entry, why))
            continue
        step = entry.step if entry.step is not None else options.step
        runs.append((entry, run_task(task, model, dataclasses.replace(options, limit=limit, step=step))))
    result: Path = options.out / f"suite-{_safe(suite.name)}-{_safe(model.name)}.json"
    if not world_from_env().main:
        return result  # rank 0 writes the suite result
    _note_replaced(result, suite.scale, spec)
    write_json_atomic(result, {
        "format": RESULT_FORMAT, "version": 1, "suite": suite.name, "suite_file": str(suite.path),
        "model": model.name, "model_spec": spec, "scale": suite.scale,
        "runs": [{"name": entry.name, "task": entry.task.name, "run": run.path.name,
                  "overall": json.loads(run.summary_path.read_text()).get("overall", {}),
                  **({"note": notes[entry.name]} if entry.name in notes else {})}
                 for entry, run in runs],
        "skipped": [{"name": entry.name, "task": entry.task.name, "reason": why} for entry, why in skipped],
    })
    return result



def _note_replaced(result: Path, scale: str | None, spec: str) -> None:
    """One line when this run replaces the result file of another scale or checkpoint: the file
    lists the newest run of each model, and the older run folders stay beside it."""
    try:
        before = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(before, dict) and (before.get("scale"), before.get("model_spec")) != (scale, spec):
        print(f"note: {result.name} listed the runs of {before.get('model_spec')} at scale {before.get('scale')}; "
              f"it now lists {spec} at scale {scale} (the earlier run folders are kept; use another --out to "
              "keep both results)", file=sys.stderr)


def skipped_entries(result: Path) -> list[tuple[str, str]]:
    """(entry name, why) of the entries a suite result file says were left out."""
    data = json.loads(result.read_text(encoding="utf-8"))
    return [(str(item["name"]), str(item["reason"])) for item in data.get("skipped", [])]
