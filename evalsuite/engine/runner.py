"""The runner: task prepare -> plan -> requests -> model -> scores -> records on disk.

The run folder's name is derived from the task, the model and a hash of the
full configuration, so the same command finds the same folder and carries on
where a killed run stopped. Records are appended and flushed a few samples at
a time; the task's run step (judging), then summary.json and plots come last,
from samples.jsonl only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from tqdm.auto import tqdm

from evalsuite.analysis.frame import run_frame, summarize
from evalsuite.analysis.report import view_plots
from evalsuite.analysis.thinking import thinking_summary, unended_line
from evalsuite.contracts import (
    BATCH_LIMITS,
    PREFIX_CACHE,
    BatchLimits,
    ModelAdapter,
    PrefixCaching,
    RunStep,
    Task,
    offers,
    tell_expected_answers,
)
from evalsuite.errors import UserError, unknown
from evalsuite.params import build_params, to_jsonable
from evalsuite.registry import get_task
from evalsuite.runs.identity import IDENTITY_RULE, run_identity, unversioned_identity
from evalsuite.runs.records import Record, RunFolder, config_hash, prompt_fields, write_json_atomic
from evalsuite.runs.view import ReadOnlyRun
from evalsuite.types import GenerationRequest, LoglikelihoodRequest, Output, Sample, output_to_json

from . import progress
from . import thinking as reasoning
from .code_versions import library_versions, rescore_outdated, task_versions, warn_untested
from .distributed import World, barrier, device_for, shard, world_from_env
from .no_score import all_failed_note
from .steps import checkpoint_of, identity_with_step

T = TypeVar("T")
AnyTask = Any  # a registered task: Task's members, TaskBase's hooks (validate_task made sure of both)


@dataclass(frozen=True)
class RunOptions:
    out: Path = Path("results")
    limit: int | None = None
    log_prompts: bool = False
    chunk: int = 8  # samples per append to samples.jsonl (the CLI uses the batch size)
    progress: bool = True
    step: RunStep | None = None  # the task's own step over the saved outputs (judging); not part of the run hash
    checkpoint_step: int | None = None  # the training step (--step); else read from the checkpoint folder
    finished: Callable[[RunFolder], None] | None = None  # hears of each finished run folder (trackers); not hashed
    prefix_cache: bool = True  # False (--no-prefix-cache): adapters that reuse shared prefixes do not; not hashed
    allow_version_change: bool = False  # resume under other library versions, recording which wrote what; not hashed
    thinking: reasoning.ThinkingOptions = reasoning.ThinkingOptions()  # -M thinking(_budget); hashed when on


def make_task(name: str, raw: Mapping[str, str], seed: int | None = None) -> Task:
    """A task from `-T` options; a preset supplies defaults that explicit options override."""
    cls = get_task(name)
    raw = dict(raw)
    preset = raw.get("preset", "")
    if preset:
        presets = cls.presets
        if preset not in presets:
            raise unknown(f"preset for {name}", preset, presets)
        raw = {**presets[preset], **raw}
    if seed is not None and "seed" not in raw and any(f.name == "seed" for f in dataclasses.fields(cls)):
        raw["seed"] = str(seed)
    task: Task = build_params(cls, raw, flag="-T")
    return task


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run_config(task: Task, model: ModelAdapter, options: RunOptions) -> dict[str, Any]:
    """The run's config.json: what was run (the full fingerprint, locations included, for the
    reader) and `hash`, which covers content only (runs.identity.run_identity)."""
    params, fingerprint = to_jsonable(task), model.fingerprint()
    checkpoint = checkpoint_of(fingerprint, options.checkpoint_step)  # the training step, when one is known
    versions = task_versions(task)
    thinking = reasoning.thinking_of(options.thinking, model)  # on: it changes outputs, so the hash covers it
    digest = config_hash(identity_with_step(reasoning.identity_with_thinking(
        run_identity(task.name, params, options.limit, fingerprint, versions["plan"]), thinking), checkpoint))
    earlier = config_hash(identity_with_step(reasoning.identity_with_thinking(
        unversioned_identity(task.name, params, options.limit, fingerprint), thinking), checkpoint))
    untested = warn_untested()
    return {"task": task.name, "params": params, "limit": options.limit, "model": fingerprint, "hash": digest,
            "identity_rule": IDENTITY_RULE, "earlier_hash": earlier, "task_versions": versions,
            "versions": library_versions(), **({"untested_versions": untested} if untested else {}),
            "git_commit": _git_commit(), "log_prompts": options.log_prompts,
            **({"checkpoint": checkpoint} if checkpoint is not None else {}),
            **({"thinking": thinking.recorded()} if thinking is not None else {})}


def _folder_name(config: Mapping[str, Any], digest: str) -> str:
    return f"{config['task']}-{_safe(config['model']['name'])}-{digest[:10]}"


def run_folder_for(config: dict[str, Any], options: RunOptions) -> RunFolder:
    """The run's folder. A folder of the same run made by a release that recorded no task
    version may hold prompts built otherwise: it is named, and left as it is."""
    earlier = RunFolder(options.out / _folder_name(config, config.pop("earlier_hash")))
    run = RunFolder(options.out / _folder_name(config, config["hash"]))
    if not run.config_path.is_file() and earlier.config_path.is_file() and world_from_env().main:
        print(f"note: {earlier.path} holds this run as an earlier evalsuite made it, with no task version "
              f"recorded; not resumed (its prompts may differ): starting {run.path}", file=sys.stderr)
    return run


def check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write output folder {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write output folder {folder}: permission denied")


def run_task(task: AnyTask, model: ModelAdapter, options: RunOptions) -> RunFolder:
    """Run (or resume) `task` on `model`; returns the completed run folder."""
    if not options.prefix_cache and offers(model, PREFIX_CACHE):  # the same results: not part of the run's identity
        cast(PrefixCaching, model).use_prefix_cache(False)
    state = check_task(task, model)
    samples = planned_samples(task, state, options.limit)
    if not samples:
        raise UserError(f"task {task.name} planned no samples with these parameters")
    _refuse_repeated_ids(task, samples)
    config = run_config(task, model, options)
    run = run_folder_for(config, options)
    world = world_from_env()
    notes: list[str | None] = []  # said after the run's last lines, by the main rank
    thinking = reasoning.from_config(config)
    if world.main:
        run.create(config)
        _say(reasoning.budget_note(thinking, model))
    with run.lock() if world.main else contextlib.nullcontext():
        if world.main:
            records = run.read_records(repair=True)  # one consistent samples.jsonl before any rank reads it
            _say(rescore_outdated(task, run, samples))
            _say(_resumed_versions(run, config["versions"], samples, records, options.allow_version_change))
        barrier(world)
        done = {r.id for r in run.read_records()}
        barrier(world)  # every rank has read the done set before any rank appends
        if world.distributed:
            run.write_rank_file(world.rank)
        todo = shard([s for s in samples if s.id not in done], world, task.shard_key)
        halved = len(_batch_limits(model)["halvings"])
        _evaluate_all(task, model, state, run, todo, options, config["hash"], world, thinking)
        barrier(world)
        if world.main:
            _keep_backoff(model, run, halved)
            run.merge([s.id for s in samples])
            if options.step is not None:  # over the merged records, before the summary reads them
                options.step.apply(ReadOnlyRun(run), options.progress)
            summary = finish(task, run)
            notes += [all_failed_note(task, summary), unended_line(summary)]
            _drop_lock_files(run)
        barrier(world)  # no rank reports a run before its summary exists
    for note in notes:
        _say(note)
    progress.run_done()
    if world.main and options.finished is not None:
        options.finished(run)
    return run


def _resumed_versions(run: RunFolder, current: Mapping[str, str], samples: Sequence[Sample],
                      records: Sequence[Record], allow: bool) -> str | None:
    """A resume under other library versions than those that wrote the records so far: refused, or
    with `allow` recorded in config.json (runs/versions.py says how); a line when it was."""
    from evalsuite.runs.versions import resume_versions

    done = {record.id for record in records}
    stored = run.read_config()
    line = resume_versions(stored, current, [s.id for s in samples if s.id not in done], run.path, allow)
    if line is not None:
        write_json_atomic(run.config_path, stored)
    return line


def _say(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr)


def _drop_lock_files(run: RunFolder) -> None:
    """A finished run folder keeps no run.lock or run.pid: they read as "being written". Removed
    while the lock is still held: a process that opened the old lock file is refused as busy, one
    that opens it later makes a new one, and this process only releases its lock after this."""
    for name in ("run.pid", "run.lock"):
        with contextlib.suppress(OSError):  # Windows keeps a file open elsewhere (filelock removes it there)
            (run.path / name).unlink(missing_ok=True)


def _evaluate_all(task: AnyTask, model: ModelAdapter, state: Any, run: RunFolder, todo: list[Sample],
                  options: RunOptions, run_hash: str, world: World, thinking: reasoning.Thinking | None) -> None:
    label = f"{task.name} {model.name}" + (f" rank {world.rank}" if world.distributed else "")
    bar = tqdm(total=len(todo), desc=label, unit="sample", disable=None if options.progress else True,
               dynamic_ncols=True)
    lines = progress.LineProgress(label, len(todo), enabled=options.progress)  # where tqdm draws nothing
    with bar:
        for chunk in _chunks(task, todo, options.chunk):
            with task.apply_model_setting(model, task.model_setting(chunk[0])):
                run.append(evaluate(task, model, state, chunk, options.log_prompts, run_hash, thinking))
            bar.update(len(chunk))
            lines.update(len(chunk))
    lines.close()


def _batch_limits(model: ModelAdapter) -> dict[str, Any]:
    """A backend that halves its batches on running out of memory says so in an optional
    `batch_limits`: {"rows", "tokens"} in force, "halvings": one entry per halving so far."""
    if not offers(model, BATCH_LIMITS):
        return {"halvings": []}
    return cast(BatchLimits, model).batch_limits


def _keep_backoff(model: ModelAdapter, run: RunFolder, halved_before: int) -> None:
    """The halvings made during this run, with the limits they left, in batch_limits.json: the
    records cannot show them (they equal those of a run that fitted)."""
    limits = _batch_limits(model)
    if len(limits["halvings"]) > halved_before:
        write_json_atomic(run.path / BATCH_LIMITS_FILE, {**limits, "halvings": limits["halvings"][halved_before:]})


def _refuse_repeated_ids(task: Task, samples: Sequence[Sample]) -> None:
    """Repeated parameter values (`-T depths=0,0.0`) would plan one sample twice."""
    seen: set[str] = set()
    for sample in samples:
        if sample.id in seen:
            raise UserError(f"task {task.name} planned sample {sample.id} twice: a -T list repeats a value; "
                            "give each value once")
        seen.add(sample.id)


BATCH_LIMITS_FILE = "batch_limits.json"
MAX_SAMPLES = 1_000_000  # a plan larger than this is a typo (samples=200000000), not an evaluation


def planned_samples(task: Task, state: Any, limit: int | None) -> list[Sample]:
    """The plan, cut at `--limit` while it is made: a huge plan with --limit 1 costs one sample.
    `state` is what the task's `prepare` returned."""
    cap = limit if limit is not None else MAX_SAMPLES + 1
    samples = list(itertools.islice(task.plan(state), cap))
    if limit is None and len(samples) > MAX_SAMPLES:
        raise UserError(f"task {task.name} plans more than {MAX_SAMPLES:,} samples with these parameters; "
                        "lower -T samples (or the lists of lengths, depths...) or use --limit")
    return samples


def check_task(task: AnyTask, model: ModelAdapter) -> Any:
    """Everything that can refuse a run, before anything runs: capabilities, then the task's own
    `prepare(model)`; returns its state, which `plan` and `requests` read."""
    from evalsuite.backends import require_capabilities

    require_capabilities(model, task.required_capabilities(), task.name)
    return task.prepare(model)


def _chunks(task: AnyTask, samples: Sequence[Sample], size: int) -> Iterator[list[Sample]]:
    """Runs of at most `size` samples; one chunk never mixes model settings, so one model call never does."""
    for _, group in itertools.groupby(samples, key=task.model_setting):
        run = list(group)
        for start in range(0, len(run), size):
            yield run[start : start + size]


def evaluate(task: Task, model: ModelAdapter, state: Any, samples: Sequence[Sample], log_prompts: bool,
             run_hash: str = "", thinking: reasoning.Thinking | None = None) -> list[Record]:
    """Requests for every sample, one batched call per request kind, probes one by one, then scores.
    A scripted model (SCRIPTED_ANSWERS) is told each sample's target first; requests never carry it.
    With `thinking` on, open generation requests go out with its budget and the engine cuts their
    answers (engine/thinking.py); the records keep the task's own requests' prompts."""
    built = [task.requests(sample, model, state) for sample in samples]
    flat = [(i, j, reasoning.sent_request(thinking, req)) for i, (reqs, _) in enumerate(built) for j, req in enumerate(reqs)]
    tell_expected_answers(model, [r for _, _, r in flat], [samples[i].target for i, _, _ in flat])
    outputs: dict[tuple[int, int], Output] = {}
    calls: tuple[tuple[type, Callable[[Any], Sequence[Any]]], ...] = (
        (GenerationRequest, model.generate), (LoglikelihoodRequest, model.loglikelihood))
    for kind, call in calls:
        picked = [(i, j, r) for i, j, r in flat if isinstance(r, kind)]
        if picked:
            for (i, j, _), out in zip(picked, call([r for _, _, r in picked])):
                outputs[(i, j)] = out
    for i, j, r in flat:
        if not isinstance(r, (GenerationRequest, LoglikelihoodRequest)):
            outputs[(i, j)] = r.measure(model)  # a ProbeRequest: the model measured through a capability
    records = []
    for i, (sample, (reqs, info)) in enumerate(zip(samples, built)):
        read = reasoning.read_outputs(thinking, reqs, [outputs[(i, j)] for j in range(len(reqs))])
        scores, error = _score(task, sample, read.outputs) if read.error is None else ({}, read.error)
        records.append(Record(
            id=sample.id, task=sample.task, model=model.name, axes=dict(sample.axes), target=sample.target,
            prompt=prompt_fields([_prompt_text(r) for r in reqs], log_prompts), info={**info, **read.info},
            outputs=tuple(output_to_json(o) for o in read.outputs), scores=scores, error=error, run=run_hash,
        ))
    return records


def _prompt_text(request: Any) -> str:
    """The text a request shows the model (prefix, then prompt or context), for the record's prompt hash."""
    return str(getattr(request, "prefix", "")) + str(getattr(request, "prompt", None) or getattr(request, "context", ""))


def _score(task: Task, sample: Sample, outputs: list[Output]) -> tuple[dict[str, Any], str | None]:
    """The task's scores, or no scores and the error when scoring raised: the sample is recorded
    with its error (counted in the summary) and the run goes on."""
    try:
        return dict(task.score(sample, outputs)), None
    except Exception as exc:  # a scorer's bug on one sample must not lose the run; it is recorded, not hidden
        return {}, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


def finish(task: AnyTask, run: RunFolder) -> dict[str, Any]:
    """summary.json and plots, derived from samples.jsonl only."""
    frame = run_frame(run)
    config = run.read_config()
    summary = {
        "task": task.name,
        "model": config["model"]["name"],
        "n": len(frame),
        "errors": int(frame["error"].notna().sum()) if "error" in frame.columns else 0,
        "overall": summarize(frame, (), task.metrics)[0],
        "cells": summarize(frame, task.group_by, task.metrics),
        **thinking_summary(frame, config),
    }
    view = ReadOnlyRun(run)  # what the task's hooks read: the run's records and config, never a way to change them
    summary.update(task.summary(frame, view))
    plots = view_plots(task, frame, view, run.plots, config["model"]["name"])
    if plots is not None:
        summary["plots"] = [p.name for p in plots]
    run.write_summary(summary)
    return summary


def for_each_model(specs: Sequence[str], model_options: Mapping[str, str], device: str, batch_size: int,
                   out: Path, work: Callable[[str, ModelAdapter], T]) -> list[T]:
    """Load each model in turn (one in memory at a time) and do `work(spec, model)` with it. The
    models after the first are checked before the first loads (spec, options, files: what loading
    would refuse), so a damaged second checkpoint is refused in seconds, not after the first
    model's whole run; the first model's own load checks the same before its work."""
    from evalsuite.backends import check_model, load_model

    from .distributed import init

    check_writable(out)
    for spec in specs[1:]:
        check_model(spec, model_options)
    world = world_from_env()
    init(world)
    results = []
    for k, spec in enumerate(specs):
        model = load_model(spec, model_options, device=device_for(world, device), batch_size=batch_size)
        results.append(work(spec, model))
        del model
        if k + 1 < len(specs):  # the next model loads into the memory this one held
            gc.collect()
    return results


def run_models(task: AnyTask, specs: Sequence[str], model_options: Mapping[str, str], device: str, batch_size: int,
               options: RunOptions) -> list[RunFolder]:
    """Run the same task (hence the same samples) on each model in turn; `-M thinking` and
    `-M thinking_budget` are the engine's (engine/thinking.py), the other options the backend's."""
    model_options, options = reasoning.with_thinking(model_options, options)
    with progress.overall(len(specs), bars=options.progress):  # --no-progress: a library's bars too
        return for_each_model(specs, model_options, device, batch_size, options.out,
                              lambda spec, model: run_task(task, model, options))
