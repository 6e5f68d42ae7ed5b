"""Running a suite (suites.py reads one): every entry on each model, loaded once, and the suite
result file that lists the run folders made (`runs/suite_result.py`).

Before the first entry runs, each entry is prepared without a model (its data read, the packages it
needs imported: lm-eval for zeroshot), so that a need the machine lacks stops the suite at once,
not after the entries before it ran. On each model, an entry clipped to the model's context
(`clip_to_context`) runs with the lengths that fit, and the run-step options given (`--judge`)
become the step of each entry whose task declares them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.errors import UserError
from evalsuite.runs.safe_json import read_json
from evalsuite.runs.suite_result import write_suite_result

from .run_steps import declared, given_as, owners, step_for
from .suites import Suite, SuiteEntry

if TYPE_CHECKING:
    from evalsuite.contracts import ModelAdapter

    from .runner import RunOptions


def run_suite(suite: Suite, specs: Sequence[str], model_options: Mapping[str, str], device: str, batch_size: int,
              options: RunOptions) -> list[Path]:
    """Every entry on each model (loaded once); returns the suite result files."""
    from .progress import overall
    from .runner import for_each_model
    from .thinking import with_thinking

    model_options, options = with_thinking(model_options, options)  # -M thinking(_budget): the engine's
    suite = check_needs(suite)
    if not suite.entries:
        raise UserError(f"suite {suite.name}: every entry was skipped; provide what the lines above ask for")
    # the overall ETA of progress lines counts every run; --no-progress silences a library's bars too
    with overall(len(specs) * len(suite.entries), bars=options.progress):
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
        task, note = clipped(entry.task, entry.clip, model.max_context, options.thinking.thinking_budget)
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
    write_suite_result(result, {
        "suite": suite.name, "suite_file": str(suite.path), "model": model.name, "model_spec": spec,
        "scale": suite.scale,
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
        before = read_json(result)
    except (OSError, ValueError):  # none yet, or damaged: it is written anew
        return
    if isinstance(before, dict) and (before.get("scale"), before.get("model_spec")) != (scale, spec):
        print(f"note: {result.name} listed the runs of {before.get('model_spec')} at scale {before.get('scale')}; "
              f"it now lists {spec} at scale {scale} (the earlier run folders are kept; use another --out to "
              "keep both results)", file=sys.stderr)


def clipped(task: Any, clip: str | None, max_context: int, thinking_budget: int = 0) -> tuple[Any, str | None]:
    """The task with the lengths of parameter `clip` over `max_context` (less the tokens a thinking
    model's generations add, `-M thinking_budget`) left out, and a note saying which were (None when
    all fit). When none fits (an NLL entry of one 64K length on an 8K model), the entry runs at the
    room there is instead, so that every model runs every entry."""
    if clip is None:
        return task, None
    room = max_context - thinking_budget
    lengths = tuple(getattr(task, clip))
    kept = tuple(n for n in lengths if n <= room)
    if kept == lengths:
        return task, None
    left_out = ", ".join(str(n) for n in lengths if n not in kept)
    less = f" less -M thinking_budget={thinking_budget}" if thinking_budget else ""
    note = f"{clip} {left_out} left out: over the model's context of {max_context} tokens{less}"
    if not kept:
        kept, note = (room,), f"{note}; run at {room} instead"
    return dataclasses.replace(task, **{clip: kept}), note


def with_steps(suite: Suite, given: Mapping[str, Any], *, out: Path, device: str, batch_size: int) -> Suite:
    """The suite with each entry's run step made from the run-step options `given` that its task
    declares (`run_steps.step_for`); an option that no entry's task takes is refused."""
    if not given:
        return suite
    entries, used = [], set()
    for entry in suite.entries:
        mine = {key: value for key, value in given.items() if key in declared(entry.task)}
        used |= set(mine)
        step = step_for(entry.task, mine, out=out, device=device, batch_size=batch_size) if mine else None
        entries.append(dataclasses.replace(entry, step=step))
    unused = [key for key in given if key not in used]
    if unused:
        flag, names = owners().get(unused[0], (given_as(unused[0]), ()))
        raise UserError(f"{flag} works with --task (e.g. {', '.join(names)}) or a suite entry of such a task, "
                        f"not with --suite {suite.name}: none of its entries takes it")
    return dataclasses.replace(suite, entries=tuple(entries))
