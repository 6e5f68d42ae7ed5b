"""The runner: task plan -> requests -> model -> scores -> records on disk.

The run folder's name is derived from the task, the model and a hash of the
full configuration, so the same command finds the same folder and carries on
where a killed run stopped. Records are appended and flushed a few samples at
a time; summary.json and plots are written last, from samples.jsonl only.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import platform
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from . import __version__
from .adapter import GenerationRequest, LoglikelihoodRequest, ModelAdapter
from .errors import UserError
from .params import build_params, to_jsonable
from .records import Record, RunFolder, Sample, config_hash, prompt_fields
from .registry import get_task
from .report import run_frame, summarize


@dataclass(frozen=True)
class RunOptions:
    out: Path = Path("results")
    limit: int | None = None
    log_prompts: bool = False
    chunk: int = 8  # samples per append to samples.jsonl (the CLI uses the batch size)
    progress: bool = True
    judge: Any = None  # a judge (evalsuite.judges) for tasks with a judging step; not part of the run hash


def make_task(name: str, raw: Mapping[str, str], seed: int | None = None) -> Any:
    """A task from `-T` options; a preset supplies defaults that explicit options override."""
    cls = get_task(name)
    raw = dict(raw)
    preset = raw.get("preset", "")
    if preset:
        presets = getattr(cls, "presets", {})
        if preset not in presets:
            from .errors import unknown

            raise unknown(f"preset for {name}", preset, presets)
        raw = {**presets[preset], **raw}
    if seed is not None and "seed" not in raw and any(f == "seed" for f in cls.__dataclass_fields__):
        raw["seed"] = str(seed)
    return build_params(cls, raw, flag="-T")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"python": platform.python_version(), "evalsuite": __version__}
    for package in ("torch", "transformers", "datasets", "lm_eval"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            continue
    return versions


def run_config(task: Any, model: ModelAdapter, options: RunOptions) -> dict[str, Any]:
    identity = {"task": task.name, "params": to_jsonable(task), "limit": options.limit,
                "model": model.fingerprint()}
    digest = config_hash(identity)
    return {**identity, "hash": digest, "versions": _versions(), "git_commit": _git_commit(),
            "log_prompts": options.log_prompts}


def run_folder_for(config: Mapping[str, Any], options: RunOptions) -> RunFolder:
    name = f"{config['task']}-{_safe(config['model']['name'])}-{config['hash'][:10]}"
    return RunFolder(options.out / name)


def check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write output folder {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write output folder {folder}: permission denied")


def run_task(task: Any, model: ModelAdapter, options: RunOptions) -> RunFolder:
    """Run (or resume) `task` on `model`; returns the completed run folder."""
    if hasattr(task, "check"):
        task.check(model)
    samples = task.plan()
    if options.limit is not None:
        samples = samples[: options.limit]
    if not samples:
        raise UserError(f"task {task.name} planned no samples with these parameters")
    config = run_config(task, model, options)
    run = run_folder_for(config, options)
    run.create(config)
    done = {r.id for r in run.read_records(repair=True)}
    todo = [s for s in samples if s.id not in done]
    bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc=f"{task.name} {model.name}",
               unit="sample", disable=None if options.progress else True, dynamic_ncols=True)
    with bar:
        for chunk in _chunks(task, todo, options.chunk):
            with _model_setting(task, model, chunk[0]):
                run.append(evaluate(task, model, chunk, options.log_prompts))
            bar.update(len(chunk))
    if options.judge is not None:  # judging is its own step over the saved outputs (see `evalsuite score`)
        task.judge_step(run, options.judge, progress=options.progress)
    finish(task, run)
    return run


def _chunks(task: Any, samples: Sequence[Sample], size: int) -> Iterator[list[Sample]]:
    """Runs of at most `size` samples. A task may declare `model_setting(sample)` (zeroshot:
    the attention bit width); one chunk never mixes settings, so one model call never does."""
    setting = getattr(task, "model_setting", lambda sample: None)
    for _, group in itertools.groupby(samples, key=setting):
        run = list(group)
        for start in range(0, len(run), size):
            yield run[start : start + size]


def _model_setting(task: Any, model: ModelAdapter, sample: Sample) -> contextlib.AbstractContextManager:
    """The task's `apply_model_setting(model, setting)` context for this chunk, if it has one."""
    if not hasattr(task, "model_setting"):
        return contextlib.nullcontext()
    return task.apply_model_setting(model, task.model_setting(sample))


def evaluate(task: Any, model: ModelAdapter, samples: Sequence[Sample], log_prompts: bool) -> list[Record]:
    """Requests for every sample, one batched call per request type, then scores."""
    built = [task.requests(sample, model) for sample in samples]
    flat = [(i, j, req) for i, (reqs, _) in enumerate(built) for j, req in enumerate(reqs)]
    outputs: dict[tuple[int, int], Any] = {}
    for kind, call in ((GenerationRequest, model.generate), (LoglikelihoodRequest, model.loglikelihood)):
        picked = [(i, j, r) for i, j, r in flat if isinstance(r, kind)]
        if picked:
            for (i, j, _), out in zip(picked, call([r for _, _, r in picked])):
                outputs[(i, j)] = out
    for i, j, r in flat:
        if hasattr(r, "measure"):  # a probe measures the model itself (outliers: activation statistics)
            outputs[(i, j)] = r.measure(model)
    records = []
    for i, (sample, (reqs, info)) in enumerate(zip(samples, built)):
        outs = [_jsonable_output(outputs[(i, j)]) for j in range(len(reqs))]
        prompts = [getattr(r, "prefix", "") + (getattr(r, "prompt", None) or getattr(r, "context", "")) for r in reqs]
        records.append(Record(
            id=sample.id, task=sample.task, model=model.name, axes=dict(sample.axes), target=sample.target,
            prompt=prompt_fields(prompts, log_prompts), info=info, outputs=tuple(outs),
            scores=task.score(sample, [outputs[(i, j)] for j in range(len(reqs))]),
        ))
    return records


def _jsonable_output(output: Any) -> Any:
    if hasattr(output, "logprob"):
        return {"logprob": output.logprob, "is_greedy": output.is_greedy, "tokens": output.tokens}
    return output


def finish(task: Any, run: RunFolder) -> dict[str, Any]:
    """summary.json and plots, derived from samples.jsonl only."""
    frame = run_frame(run)
    config = run.read_config()
    summary = {
        "task": task.name,
        "model": config["model"]["name"],
        "n": len(frame),
        "overall": summarize(frame, (), task.metrics)[0],
        "cells": summarize(frame, task.group_by, task.metrics),
    }
    if hasattr(task, "summary"):
        summary.update(task.summary(frame))
    if hasattr(task, "plots"):
        summary["plots"] = [p.name for p in task.plots(frame, run.plots, config["model"]["name"])]
    run.write_summary(summary)
    return summary


def run_models(task: Any, specs: Sequence[str], model_options: Mapping[str, str], device: str, batch_size: int,
               options: RunOptions) -> list[RunFolder]:
    """Run the same task (hence the same samples) on each model in turn."""
    from .backends import load_model

    check_writable(options.out)
    runs = []
    for spec in specs:
        model = load_model(spec, model_options, device=device, batch_size=batch_size)
        runs.append(run_task(task, model, options))
        del model
        gc.collect()
    return runs
