"""`evalsuite watch`: each new checkpoint of a training folder evaluated, trended, gated, alerted.

The loop looks at the folder (woken by file-system events, or every `interval` seconds), takes
the checkpoints that are ready and not in the ledger (`engine/watch.py`), lowest step first,
and hands each to the executor (`watch_jobs.py`). Each one finished is written to the ledger
with its run folders, its metrics and its gate: `analysis.trend` over every checkpoint the
ledger holds, with this checkpoint checked against the previous (or best) one before it by
`check`'s per-cell gate, exactly as `evalsuite trend --gate` would. A regression is posted to
the webhook when one is given. A checkpoint that does not load is written as failed, with the
reason, and the loop goes on; one that another process is evaluating (its run folder locked)
is tried again at a later look, and one deleted before its load is skipped with a line.

Bad gate options are refused before any checkpoint is looked at, by `check`'s own rules; a
`--metric` (or `--max-drop METRIC=`) that the checkpoint's runs do not have is refused as soon
as the first checkpoint's runs show it, before the ledger records that checkpoint, so the
corrected command gates it (its run folders are found finished, not run again).
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsuite.analysis.tolerances import DEFAULT_MAX_DROP
from evalsuite.engine.watch import SKIPPED, Candidate, Entry, Ledger, Readiness, candidates, files_digest
from evalsuite.errors import UserError
from evalsuite.params import option_text

from .watch_jobs import EvalJob, Outcome, executor_for
from .webhook import check_url, message, post

SETTLING = "files complete"  # the start of what a complete checkpoint that may still change waits for


@dataclass(frozen=True)
class WatchSettings:
    """How `evalsuite watch` follows the folder, and what it gates against."""

    folder: Path
    pattern: str = "checkpoint-*"
    marker: str | None = None  # a file the trainer writes last: its presence alone makes a checkpoint ready
    settle: float = 10.0  # seconds a complete checkpoint's files must stay unchanged
    interval: float = 30.0  # seconds between looks when no event comes
    polling: bool = False
    once: bool = False
    until_step: int | None = None  # stop once a checkpoint at this step or later is done
    against: str = "previous"
    max_drop: float = DEFAULT_MAX_DROP
    max_drop_by_metric: Mapping[str, float] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    alpha: float = 0.05
    webhook: str | None = None
    executor: str = "local"
    executor_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchResult:
    evaluated: tuple[Entry, ...]  # in this call, in the order finished
    already: tuple[str, ...]  # checkpoints the ledger held before this call
    waiting: dict[str, str]  # checkpoints not ready when it stopped, and why
    trend: Path

    @property
    def failed(self) -> list[Entry]:
        """Checkpoints that did not load, or whose gate found a regression."""
        return [e for e in self.evaluated if e.status != "ok" or (e.gate or {}).get("failed")]


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def refuse_bad_settings(settings: WatchSettings) -> None:
    """The gate's options by `check`'s rules, and the waits as numbers of seconds a clock can wait:
    one line for each, before anything is evaluated (an `--alpha nan` would skip every gate)."""
    from evalsuite.analysis.check import validate_gate
    from evalsuite.analysis.tolerances import Tolerances

    validate_gate(Tolerances(settings.max_drop, dict(settings.max_drop_by_metric)), settings.alpha)
    for flag, value, least in (("--settle", settings.settle, 0.0), ("--interval", settings.interval, 0.1)):
        if not (math.isfinite(value) and least <= value <= threading.TIMEOUT_MAX):
            raise UserError(f"{flag} takes seconds from {least:g} to {threading.TIMEOUT_MAX:g}, got {value}")
    if any(not metric.strip() for metric in settings.metrics):
        raise UserError("--metric takes a metric's name, got an empty one")


class Watcher:
    def __init__(self, job: EvalJob, settings: WatchSettings, echo: Callable[[str], None] = _say):
        refuse_bad_settings(settings)
        if not settings.folder.is_dir():
            raise UserError(f"no such folder to watch: {settings.folder}")
        if not settings.pattern.strip():
            raise UserError("--model-pattern must not be empty (e.g. 'checkpoint-*')")
        if settings.against not in ("previous", "best"):
            raise UserError(f"--against takes previous or best, got {settings.against!r}")
        if settings.webhook is not None:
            check_url(settings.webhook)
        job.check()  # an unknown task or tracker is refused before any checkpoint is looked at
        self.job, self.settings, self.echo = job, settings, echo
        self.out = Path(job.out)
        self.ledger = Ledger(self.out)
        self.executor = executor_for(job, settings.executor, settings.executor_options)
        self.readiness = Readiness(settings.marker, settings.settle)
        self.waiting: dict[str, str] = {}
        self.evaluated: list[Entry] = []

    # ---- one look -------------------------------------------------------------------------------

    def look(self) -> list[Candidate]:
        """The checkpoints ready now and not yet done, by step; what the others wait for is noted."""
        found, stepless = candidates(self.settings.folder, self.settings.pattern)
        done = {e.path: e for e in self.ledger.entries() if e.job == self.job.digest()}
        ready, waiting = [], {}
        for candidate in found:
            entry = done.get(str(candidate.path.resolve()))
            if entry is not None and (entry.status == "ok" or entry.signature == files_digest(candidate.path)):
                continue
            why = self.readiness.look(candidate)
            if why is None:
                ready.append(candidate)
            else:
                waiting[candidate.name] = why
        for name in stepless:
            waiting[name] = "no training step in its name or trainer_state.json"
        for name, why in waiting.items():
            if self.waiting.get(name) != why and not why.startswith(SETTLING):
                skipped = why.startswith(SKIPPED)
                self.echo(f"skipping {name}: {why.removeprefix(SKIPPED)}" if skipped else f"waiting for {name}: {why}")
        if waiting != self.waiting or not self.ledger.state_path.is_file():
            self.ledger.write_state(waiting)
        self.waiting = waiting
        return ready

    def settling(self) -> bool:
        return any(why.startswith(SETTLING) for why in self.waiting.values())

    # ---- one checkpoint -------------------------------------------------------------------------

    def evaluate(self, ready: Sequence[Candidate]) -> int:
        """Every ready checkpoint submitted (a cluster runs them side by side), then each outcome
        recorded and gated in step order; how many were recorded (a busy one is not)."""
        submitted: list[tuple[Candidate, Outcome]] = []
        for candidate in ready:  # by its absolute path: a relative one like run/checkpoint-5 reads as a hub id
            submitted.append((candidate, self.executor.submit(candidate.path.absolute())))
        recorded = 0
        for candidate, outcome in submitted:
            self.echo(f"evaluating {candidate.name} (step {candidate.step})")
            recorded += self.record(candidate, outcome())
        if len(submitted) > recorded:  # the busy ones are waited for, like any other
            self.ledger.write_state(self.waiting)
        return recorded

    def passed_over(self, candidate: Candidate, answer: Mapping[str, Any]) -> bool:
        """True, with a line, for an outcome that is no outcome of the checkpoint: another process
        evaluating it (waited for, tried again later), or its folder deleted before it could load."""
        if "busy" in answer:
            self.waiting[candidate.name] = f"being evaluated by another process: {answer['busy']}"
            self.echo(f"{candidate.name} (step {candidate.step}) is busy, tried again at a later look: {answer['busy']}")
            return True
        if "error" in answer and not candidate.path.is_dir():
            self.echo(f"skipping {candidate.name} (step {candidate.step}): its folder was deleted before it was "
                      "evaluated")
            return True
        return False

    def record(self, candidate: Candidate, answer: Mapping[str, Any]) -> bool:
        """The outcome into the ledger, gated; False when it was passed over (`passed_over`)."""
        if self.passed_over(candidate, answer):
            return False
        where = (candidate.name, str(candidate.path.resolve()), candidate.step)
        if "error" in answer:
            entry = Entry(*where, status="failed", reason=str(answer["error"]), signature=files_digest(candidate.path),
                          job=self.job.digest())
            self.echo(f"{candidate.name} (step {candidate.step}) failed: {entry.reason}")
        else:
            runs = tuple(str(Path(run).resolve()) for run in answer["runs"])
            self.refuse_unknown_metrics(candidate, runs)
            gate = self.gate(candidate, runs)
            entry = Entry(*where, status="ok", runs=runs, metrics=_metrics(runs), gate=gate,
                          signature=files_digest(candidate.path), job=self.job.digest())
            for run in runs:
                self.echo(f"{candidate.name} (step {candidate.step}): {run}")
            if gate is not None:
                self.echo(gate["verdict"])
                for line in gate["cells"]:
                    self.echo(f"  {line}")
                if gate["failed"] and self.settings.webhook is not None:
                    post(self.settings.webhook, message(gate["verdict"], gate["cells"]))
        self.ledger.append(entry)
        self.evaluated.append(entry)
        return True

    def refuse_unknown_metrics(self, candidate: Candidate, runs: Sequence[str]) -> None:
        """A metric named in --metric or --max-drop that none of the checkpoint's runs has is a typo:
        refused (the watcher stops) before the ledger records the checkpoint, so the corrected
        command gates it instead of skipping every gate."""
        from evalsuite.analysis.outcomes import run_outcomes

        named = [*self.settings.metrics, *self.settings.max_drop_by_metric]
        if not named:
            return
        known = {metric for run in runs for metric in run_outcomes(Path(run)).scores}
        for metric in named:
            if metric not in known:
                raise UserError(f"no run of {candidate.name} has the metric {metric!r} named by --metric or "
                                f"--max-drop (they have {', '.join(sorted(known)) or 'none'}); correct it and "
                                "watch again: its runs are kept and gated then")

    def gate(self, candidate: Candidate, runs: Sequence[str]) -> dict[str, Any] | None:
        """The trend over the ledger's checkpoints and this one, written under OUT/trend; this
        checkpoint's gate as {verdict, failed, cells, against}, None when it is the first."""
        from evalsuite.analysis.tolerances import Tolerances
        from evalsuite.analysis.trend import trend

        s = self.settings
        inputs = [*self.ledger.runs(), *(Path(run) for run in runs)]
        try:
            result = trend(inputs, self.out / "trend", gate_against=s.against,
                           tolerances=Tolerances(s.max_drop, dict(s.max_drop_by_metric)), alpha=s.alpha,
                           metrics=s.metrics)
        except UserError as exc:  # two runs at one step, nothing scored: the records stay, the gate is skipped
            self.echo(f"warning: no gate for {candidate.name}: {exc}")
            return None
        names = {Path(run).name for run in runs}
        mine = [g for g in result.gates if g.step == candidate.step and g.run in names]
        if not mine:
            return None
        cells = [_cell_line(g.series, g.against, c) for g in mine for c in g.failed]
        failed = [g for g in mine if g.failed]
        against = sorted({g.against for g in mine})
        where = f"against step {', '.join(str(a) for a in against)} ({s.against})"
        rows = sum(len(g.result.checks) for g in mine)
        if failed:
            verdict = (f"evalsuite watch: {candidate.name} (step {candidate.step}) REGRESSED {where}: "
                       f"{len(cells)} of {rows} gated rows failed")
        else:
            verdict = f"evalsuite watch: {candidate.name} (step {candidate.step}) passed {where}: {rows} gated rows"
        return {"verdict": verdict, "failed": bool(failed), "cells": cells, "against": against}

    # ---- the loop -------------------------------------------------------------------------------

    def reached_the_end(self) -> bool:
        until = self.settings.until_step
        return until is not None and any(e.step >= until for e in self.ledger.entries())

    def run(self) -> WatchResult:
        from evalsuite.engine.watch_wait import Waiter

        s = self.settings
        with Waiter(s.folder, s.interval, polling=s.polling or s.once, ignore=self.out) as waiter:
            self.echo(f"watching {s.folder} for {s.pattern} ({waiter.mode}); records under {self.out}")
            looks = 0
            while not self.reached_the_end():
                ready = self.look()
                looks += 1
                recorded = self.evaluate(ready)
                if s.once and (looks >= 2 or not self.settling()):
                    break  # --once: a second look only for files that were complete at the first
                if self.reached_the_end():
                    break
                if not recorded:  # nothing new, or only busy ones; --once waits out --settle whole
                    waiter.wait((s.settle if s.once else min(s.interval, s.settle)) if self.settling() else None)
        now, mine = {e.path for e in self.evaluated}, self.job.digest()
        already = tuple(e.checkpoint for e in sorted(self.ledger.entries(), key=lambda e: e.step)
                        if e.path not in now and e.job == mine)
        return WatchResult(tuple(self.evaluated), already, dict(self.waiting), self.out / "trend")


def _cell_line(series: str, against: int, check: Any) -> str:
    where = "over all samples" if check.cell == "all" else f"in cell {check.cell}"
    return (f"{series}: {check.metric} {where}: {check.baseline:.3f} at step {against} -> {check.candidate:.3f} "
            f"(drop {check.drop:+.3f}, tolerance {check.max_drop:g}, n {check.n})")


def _metrics(runs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each run folder's task and the numbers of its summary's overall row, by folder name."""
    found = {}
    for run in runs:
        summary = json.loads((Path(run) / "summary.json").read_text(encoding="utf-8"))
        numbers = {k: v for k, v in summary.get("overall", {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        found[Path(run).name] = {"task": summary.get("task"), **numbers}
    return found


def watch_folder(folder: str | Path, *, task: str | None = None, suite: str | Path | None = None,
                 out: str | Path = "results", params: Mapping[str, Any] | None = None,
                 model_options: Mapping[str, Any] | None = None, device: str = "auto", batch_size: int = 8,
                 limit: int | None = None, seed: int | None = None, log_to: Sequence[str] = (),
                 scale: str | None = None, data_dir: str | Path | None = None, progress: bool = False,
                 echo: Callable[[str], None] = _say, **settings: Any) -> WatchResult:
    """`evalsuite watch`: `task` (with its `params`) or `suite` on each checkpoint of `folder`;
    `settings` are WatchSettings' fields (pattern, marker, settle, once, until_step, against,
    webhook, executor...)."""
    if (task is None) == (suite is None):
        raise UserError("give --task NAME (with its -T parameters) or --suite FILE, one of them")
    if suite is not None and params:
        raise UserError("--suite sets the tasks and their parameters: drop -T, or edit the suite file")
    if not str(out).strip():
        raise UserError("--out must name a folder (an empty name would write into the current folder)")
    known = set(WatchSettings.__dataclass_fields__) - {"folder"}
    if set(settings) - known:
        raise TypeError(f"watch() got unexpected settings: {', '.join(sorted(set(settings) - known))}")
    job = EvalJob(out=str(Path(out).resolve()), task=task, suite=str(suite) if suite is not None else None,
                  params={k: option_text(v) for k, v in (params or {}).items()},
                  model_options={k: option_text(v) for k, v in (model_options or {}).items()}, device=device,
                  batch_size=batch_size, limit=limit, seed=seed, log_to=tuple(log_to), scale=scale,
                  data_dir=str(data_dir) if data_dir is not None else None, progress=progress)
    return Watcher(job, WatchSettings(folder=Path(folder), **settings), echo).run()
