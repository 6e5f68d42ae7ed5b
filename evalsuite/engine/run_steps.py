"""Run-step options: what a task's step over a run's saved outputs (judging) is asked to do.

A task declares its step's options as a frozen dataclass (`TaskBase.step_options`), and they are
given as `-J key=value`, parsed like `-T` (params.py): typed, checked, one line for a bad value. A
field's metadata may name a flag of its own, its friendly form on the command line (`--judge J`
is `-J judge=J`). The values given, over the dataclass's defaults, reach the task's `run_step`,
which builds the step or says none was asked for. The command line, the API and suites all go
through here, so an option is refused alike wherever it is given to a task that does not take it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.analysis.task_of import task_for_run
from evalsuite.contracts import RunStep
from evalsuite.errors import UserError, unknown
from evalsuite.params import build_params, option_text
from evalsuite.registry import TASKS, load_all
from evalsuite.runs.records import open_run
from evalsuite.runs.view import ReadOnlyRun

STEP_FLAG = "-J"


@dataclass(frozen=True)
class FriendlyFlag:
    """A step option's own flag on the command line (`--judge`), standing for `-J key=VALUE`."""

    flag: str
    key: str
    help: str
    repeatable: bool  # a tuple option: the flag may be given again, each value one item


def declared(task: Any) -> tuple[str, ...]:
    """The step option keys `task` takes (none when it has no run step)."""
    options = task.step_options
    return tuple(f.name for f in dataclasses.fields(options)) if options is not None else ()


def friendly_flags() -> list[FriendlyFlag]:
    """The flags the registered tasks' step options name, each once (the first task's help wins)."""
    found: dict[str, FriendlyFlag] = {}
    for _, cls in _tasks():
        if cls.step_options is None:
            continue
        types = typing.get_type_hints(cls.step_options)
        for option in dataclasses.fields(cls.step_options):
            flag = option.metadata.get("flag")
            if flag and flag not in found:
                repeatable = typing.get_origin(types[option.name]) is tuple
                found[flag] = FriendlyFlag(flag, option.name, option.metadata.get("help", ""), repeatable)
    return list(found.values())


def owners() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Step option key -> (how it is given: its flag, else -J key, and the tasks that take it)."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, cls in _tasks():
        for option in dataclasses.fields(cls.step_options) if cls.step_options is not None else ():
            given_as, names = found.get(option.name, (option.metadata.get("flag") or f"{STEP_FLAG} {option.name}", ()))
            found[option.name] = (given_as, (*names, name))
    return found


def given_as(key: str) -> str:
    """How a step option is given on the command line: `--judge`, or `-J key` for one with no flag."""
    return owners().get(key, (f"{STEP_FLAG} {key}", ()))[0]


def step_for(task: Any, given: Mapping[str, Any], *, out: Path, device: str, batch_size: int) -> RunStep | None:
    """The task's run step for the option values `given` (text from the command line or Python values
    from the API; the options not given take their defaults), None when they ask for none."""
    refuse_undeclared(task, given)
    if task.step_options is None:
        return None
    options = build_params(task.step_options, {key: option_text(value) for key, value in given.items()}, STEP_FLAG)
    step: RunStep | None = task.run_step(options, out=out, device=device, batch_size=batch_size)
    return step


def refuse_undeclared(task: Any, given: Mapping[str, Any], where: str = "") -> None:
    """One line for a step option that the task does not take (`where`: the run it was made for)."""
    mine = declared(task)
    for key in given:
        if key in mine:
            continue
        known = owners()
        if key not in known:
            raise unknown("run-step option", key, known)
        if where:
            raise UserError(f"task {task.name}{where} has no judging step")
        flag, names = known[key]
        raise UserError(f"task {task.name} has no judging step; {flag} is for tasks such as {', '.join(names)}")


@dataclass(frozen=True)
class Scored:
    """What `score` did: one line per run, then the step's table over all of them."""

    paths: tuple[Path, ...]
    lines: tuple[str, ...]
    table: str


def score_runs(runs: Sequence[str | Path], step: Mapping[str, Any], *, device: str, batch_size: int, progress: bool,
               on_run: Callable[[Path, str], None] | None = None) -> Scored:
    """The step `step` asks for applied to finished runs, again, without loading the evaluated model
    (`evalsuite score`), and their summaries rewritten; `on_run(path, line)` hears of each run."""
    from .runner import finish

    folders = [open_run(path) for path in runs]
    tasks = []
    for folder in folders:
        if not folder.complete:
            raise UserError(f"run {folder.path} is not complete (no summary.json); rerun its command to finish it")
        task = task_for_run(folder)
        if task.step_options is None:
            raise UserError(f"task {task.name} of {folder.path} has no judging step")
        refuse_undeclared(task, step, f" of {folder.path}")
        tasks.append(task)
    # one step serves every run (what it loads, it loads once): a RunStep applies to any finished run
    built = step_for(tasks[0], step, out=folders[0].path.parent, device=device, batch_size=batch_size)
    if built is None:
        first = given_as(declared(tasks[0])[0])
        raise UserError(f"nothing to do: give {first} (see `evalsuite score --help`)")
    lines = []
    for folder in folders:
        line = built.apply(ReadOnlyRun(folder), progress)
        finish(task_for_run(folder), folder)
        lines.append(line)
        if on_run is not None:
            on_run(folder.path, line)
    paths = tuple(f.path for f in folders)
    return Scored(paths=paths, lines=tuple(lines), table=built.table(list(paths)))


def _tasks() -> list[tuple[str, Any]]:
    load_all()
    return sorted(TASKS.items())
