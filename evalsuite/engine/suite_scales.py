"""What a suite entry may say beyond its task and parameters: scales, local data, optional entries.

    default_scale = "quick"                  # top level: the scale used when --scale is not given

    [[run]]
    task = "icl"
    name = "icl-trec"
    optional = true                          # skipped (one line saying what to provide) when it cannot run
    needs_option = "judge"                   # a run-step option the entry cannot do without (--judge)
    clip_to_context = "lengths"              # a parameter of lengths: those over a model's context are left out
    [run.params]
    data = "{data_dir}/icl/trec.jsonl"       # {data_dir}: the folder given with --data-dir
    [run.without_data]                       # the parameters used instead when that file is not there
    data = ""                                # (here: the task's own hub dataset)
    [run.scale.quick]                        # parameters of one scale, over [run.params]
    test_size = 50

An entry is skipped, never failed, only when it says `optional = true`; the reasons are found
before the first entry runs (`suites.check_needs`), so a suite never fails after hours for a
file, a dataset or a judge it could have asked for at the start. The core names no task: what an
entry needs is read from its own keys and from its task's `prepare(None)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, did_you_mean, unknown

ENTRY_KEYS = ("optional", "needs_option", "clip_to_context", "without_data", "scale")
SUITE_KEYS = ("default_scale",)
DATA_DIR = "{data_dir}"


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
        if option.replace("-", "_").lstrip("_") not in settings.step and missing is None:
            missing = f"give --{option.replace('_', '-')} (a run-step option of its task: `evalsuite run --help`)"
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


def clipped(task: Any, clip: str | None, max_context: int) -> tuple[Any, str | None]:
    """The task with the lengths of parameter `clip` over `max_context` left out, and a note saying
    which were (None when all fit). When none fits (an NLL entry of one 64K length on an 8K model),
    the entry runs at the model's context instead, so that every model runs every entry."""
    if clip is None:
        return task, None
    lengths = tuple(getattr(task, clip))
    kept = tuple(n for n in lengths if n <= max_context)
    if kept == lengths:
        return task, None
    left_out = ", ".join(str(n) for n in lengths if n not in kept)
    note = f"{clip} {left_out} left out: over the model's context of {max_context} tokens"
    if not kept:
        kept, note = (max_context,), f"{note}; run at {max_context} instead"
    return dataclasses.replace(task, **{clip: kept}), note


def with_steps(suite: Any, given: Mapping[str, Any], build: Callable[[Any, Mapping[str, Any]], Any],
               owners: Callable[[str], tuple[str, tuple[str, ...]]]) -> Any:
    """The suite with each entry's run step, `build(task, options)`, made from the run-step options
    `given` that its task declares; an option that no entry's task takes is refused (`owners(key)`:
    its flag and the tasks that take it)."""
    if not given:
        return suite
    entries, used = [], set()
    for entry in suite.entries:
        declared = {option.key for option in entry.task.options}
        mine = {key: value for key, value in given.items() if key in declared}
        used |= set(mine)
        entries.append(dataclasses.replace(entry, step=build(entry.task, mine) if mine else None))
    unused = [key for key in given if key not in used]
    if unused:
        flag, names = owners(unused[0])
        raise UserError(f"{flag} works with --task (e.g. {', '.join(names)}) or a suite entry of such a task, "
                        f"not with --suite {suite.name}: none of its entries takes it")
    return dataclasses.replace(suite, entries=tuple(entries))
