"""Finished runs written in lm-evaluation-harness's output layout, for tools that read it.

    <out>/<model name, sanitized>/results_<datetime>.json
    <out>/<model name, sanitized>/samples_<task>_<datetime>.jsonl

as lm-eval's `EvaluationTracker` writes them with `--output_path <out> --log_samples`: one
results file per model holding every exported run of that model (a task each), and one
samples file per task. The datetime is the export's own (ISO format, `:` written `-`, as
lm-eval writes it), shared by every file of one export, so lm-eval's own readers
(`lm_eval.utils.get_results_filenames`, `get_latest_filename`...) find the latest export.

What maps to what:
- a task's metric, averaged over the run's records as `report` averages it (an errored sample is
  0 on a higher-is-better metric, no value on a lower-is-better one) -> `results[task]["<metric>,none"]`,
  with `"<metric>_stderr,none"` (standard error of the mean, scipy.stats.sem); a run with no
  readable record is refused before anything is written;
- each record -> one line of the samples file: `doc` holds the sample's id, axes and
  measured facts, `resps` and `filtered_resps` its outputs, then one key per numeric score;
  `prompt_hash` is the record's prompt hash (the sha256 of the prompt text, as lm-eval's);
- the run's config -> `configs[task]` (the task's parameters under `metadata`) and `config`
  (model, device, dtype, parameters, weights hash, limit, seed).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError
from evalsuite.runs.confine import beside
from evalsuite.runs.records import Record, RunFolder, open_run
from evalsuite.version import __version__

FILTER = "none"  # evalsuite scores what the model said; lm-eval names that filter "none"


def sanitized_model_name(name: str) -> str:
    """A model name as lm-eval names its output folder: quotes, brackets, slashes and the
    other characters a file name cannot hold become `__` (a hub id `org/name` -> `org__name`)."""
    return re.sub(r'["<>:/|\\?*\[\]]+', "__", name)


def export_time(moment: datetime | None = None) -> str:
    """The datetime in lm-eval's file names: ISO format with `:` as `-` (no `_`, which splits names)."""
    return (moment or datetime.now()).isoformat().replace(":", "-")


def export_runs(runs: Sequence[str | Path], out: str | Path, *, moment: datetime | None = None) -> list[Path]:
    """Write the finished runs under `out` in lm-eval's layout; returns the files written."""
    folders = [open_run(path) for path in runs]
    records: dict[Path, list[Record]] = {}  # every run's records read (and refused when none is) before anything is written
    for folder in folders:
        if not folder.complete:
            raise UserError(f"run {folder.path} is not complete (no summary.json); rerun its command to finish it")
        records[folder.path] = folder.read_records()
        if not records[folder.path]:
            raise UserError(f"run {folder.path} holds no readable samples (samples.jsonl is empty, missing or "
                            "damaged); rerun its command")
    by_model: dict[str, list[RunFolder]] = {}
    targets: dict[str, Path] = {}  # each model's folder, checked to be one folder under `out` before anything is written
    for folder in folders:
        model = str(folder.read_config()["model"]["name"])
        by_model.setdefault(model, []).append(folder)
        targets[model] = beside(Path(out), sanitized_model_name(model), f"the model name in {folder.config_path}")
    stamp = export_time(moment)
    written: list[Path] = []
    for model, model_runs in by_model.items():
        written += _export_model(model, model_runs, records, targets[model], stamp)
    return written


def _export_model(model: str, runs: list[RunFolder], records_of: Mapping[Path, list[Record]], folder: Path,
                  stamp: str) -> list[Path]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write output folder {folder}: {exc.strerror or exc}") from None
    names = _task_names(runs)
    results: dict[str, Any] = {key: {} for key in
                               ("results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                                "n-samples", "task_hashes")}
    written = []
    for run, name in zip(runs, names):
        config, records = run.read_config(), records_of[run.path]
        samples = [sample_line(index, record) for index, record in enumerate(records)]
        path = folder / f"samples_{name}_{stamp}.jsonl"
        path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples), encoding="utf-8")
        written.append(path)
        _add_task(results, name, config, records, samples)
    first = runs[0].read_config()
    results.update(_general(model, first, runs))
    path = folder / f"results_{stamp}.json"
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    return [path, *written]


def _task_names(runs: Sequence[RunFolder]) -> list[str]:
    """The task's name, made unique with the run's hash when one model has two runs of a task;
    lm-eval reads a task name between the first and the last `_` of a samples file's name."""
    tasks = [str(run.read_config()["task"]) for run in runs]
    return [re.sub(r"\W", "_", task if tasks.count(task) == 1 else f"{task}_{run.read_config()['hash'][:8]}")
            for task, run in zip(tasks, runs)]


def _add_task(results: dict[str, Any], name: str, config: Mapping[str, Any], records: Sequence[Record],
              samples: Sequence[Mapping[str, Any]]) -> None:
    from evalsuite.analysis.task_of import task_spec

    spec = task_spec(str(config["task"]), records)
    metrics: dict[str, Any] = {"alias": name}
    for metric in spec.metrics:
        values = _metric_values(records, metric, metric in spec.lower_is_better)
        if values:
            metrics[f"{metric},{FILTER}"], metrics[f"{metric}_stderr,{FILTER}"] = _mean_and_sem(values)
    metrics["name"], metrics["sample_len"] = name, len(records)
    results["results"][name] = metrics
    results["group_subtasks"][name] = []
    results["configs"][name] = {
        "task": name, "output_type": _output_type(records), "num_fewshot": 0,
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": m not in spec.lower_is_better}
                        for m in spec.metrics],
        "metadata": {"evalsuite_task": config["task"], "params": config.get("params", {}), "run_hash": config["hash"],
                     "version": __version__},
    }
    results["versions"][name] = __version__
    results["n-shot"][name] = 0
    results["higher_is_better"][name] = {m: m not in spec.lower_is_better for m in spec.metrics}
    results["n-samples"][name] = {"original": len(records), "effective": len(records)}
    results["task_hashes"][name] = _sha256("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                                   for s in samples))


def _metric_values(records: Sequence[Record], metric: str, lower_is_better: bool) -> list[float]:
    """The metric's values over the records, an errored sample's by the rule `report` uses
    (analysis.frame.errored_values: 0 on a higher-is-better metric, no value on a lower-is-better one)."""
    import pandas as pd

    from evalsuite.analysis.frame import errored_values

    frame = pd.DataFrame({metric: pd.Series([_number(r.scores.get(metric)) for r in records], dtype=float),
                          "error": [r.error for r in records]})
    return [float(v) for v in errored_values(frame, metric, lower_is_better).dropna()]


def _mean_and_sem(values: list[float]) -> tuple[float, Any]:
    from scipy.stats import sem

    mean = sum(values) / len(values)
    error = float(sem(values)) if len(values) > 1 else float("nan")
    return mean, error if math.isfinite(error) else "N/A"  # lm-eval writes "N/A" where it has no stderr


def _general(model: str, config: Mapping[str, Any], runs: Sequence[RunFolder]) -> dict[str, Any]:
    """What lm-eval's simple_evaluate and its tracker add beside the results."""
    fingerprint = config.get("model", {})
    started = min(run.config_path.stat().st_mtime for run in runs)
    finished = max(run.summary_path.stat().st_mtime for run in runs)
    return {
        "config": {
            "model": fingerprint.get("spec", model), "model_args": None, "batch_size": None, "batch_sizes": [],
            "device": fingerprint.get("device"), "limit": config.get("limit"),
            "model_num_parameters": fingerprint.get("parameters"), "model_dtype": fingerprint.get("dtype"),
            "model_sha": fingerprint.get("weights_sha256"), "random_seed": config.get("params", {}).get("seed"),
        },
        "git_hash": config.get("git_commit"),
        "date": started,
        "transformers_version": config.get("versions", {}).get("transformers", "N/A"),
        "evalsuite_version": __version__,
        "model_source": f"evalsuite-{fingerprint.get('backend', 'unknown')}",
        "model_name": model,
        "model_name_sanitized": sanitized_model_name(model),
        "chat_template": None,
        "total_evaluation_time_seconds": str(max(0.0, finished - started)),
    }


def sample_line(index: int, record: Record) -> dict[str, Any]:
    """One record as a line of lm-eval's samples file."""
    doc = {"id": record.id, "axes": dict(record.axes), "info": dict(record.info)}
    target = record.target[0] if len(record.target) == 1 else json.dumps(list(record.target), ensure_ascii=False)
    texts = record.prompt.get("text") or [""] * len(record.outputs)
    responses = [_response(output) for output in record.outputs]
    scores = {k: _number(v) for k, v in record.scores.items() if _number(v) is not None}
    return {
        "doc_id": index,
        "doc": doc,
        "target": target,
        "arguments": {f"gen_args_{i}": {"arg_0": text, "arg_1": {}} for i, text in enumerate(texts)},
        "resps": [[response] for response in responses],
        "filtered_resps": responses,
        "filter": FILTER,
        "metrics": list(scores),
        "doc_hash": _sha256(json.dumps(doc, indent=2, ensure_ascii=False, default=str)),
        "prompt_hash": str(record.prompt.get("sha256", "")),
        "target_hash": _sha256(target),
        **scores,
        **({"error": record.error} if record.error else {}),
    }


def _response(output: Any) -> Any:
    """A generation as its text; a log-likelihood as lm-eval keeps one, [logprob, is_greedy] as text."""
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping) and {"logprob", "is_greedy"} <= set(output):
        return [str(output["logprob"]), str(output["is_greedy"])]
    return json.dumps(output, ensure_ascii=False, sort_keys=True)  # a probe's measurement


def _output_type(records: Sequence[Record]) -> str:
    first = records[0].outputs[0] if records and records[0].outputs else ""
    if isinstance(first, str):
        return "generate_until"
    return "loglikelihood" if isinstance(first, Mapping) and "logprob" in first else "probe"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
