"""Judged accuracy from the verdict files of run folders: pure functions, no torch.

Accuracy = samples judged True / samples with a judge response (n). An
unparseable response counts in n and is not True. A sample without a response
(its judge call failed, or it is not judged yet) is "unjudged": outside n, and
counted as not True in the accuracy over all samples, the way a failed
generation counts as a failure, so that judge errors cannot leave n silently.
Two runs made with the same task parameters (so on the same samples) are
compared pairwise with the exact McNemar test on the samples both have
responses for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import pandas as pd

from evalsuite.analysis.report import format_rate
from evalsuite.analysis.stats import mcnemar_exact, wilson_interval
from evalsuite.runs.records import open_run

from .store import JudgementFile, judgement_files, slug
from .verdicts import label_for

HEURISTIC_NOTE = ("`lexical (heuristic)` is an offline word-overlap heuristic (every number and capitalised "
                  "word of the output must occur in the document), not a judge model.")


def verdict_frame(paths: Sequence[str | Path]) -> pd.DataFrame:
    """One row per (run, sample, judge): the sample's verdict status and whether it was True."""
    rows = []
    for path in paths:
        run = open_run(path)
        params = run.read_config().get("params", {})
        records = run.read_records()
        folder = run.path / "judgements"
        for judge in judgement_files(folder):
            verdicts = JudgementFile(folder, judge).read()
            for record in records:
                verdict = verdicts.get(record.id)
                rows.append({
                    "run": run.path.name, "params": repr(sorted(params.items())), "model": record.model,
                    "dataset": record.axes.get("dataset", record.task), "id": record.id, "judge": judge,
                    "status": verdict.status if verdict else "missing",
                    "supported": bool(verdict is not None and verdict.verdict is True),
                })
    columns = ["run", "params", "model", "dataset", "id", "judge", "status", "supported"]
    return pd.DataFrame(rows, columns=columns)


ANSWERED = ("judged", "unparseable")  # statuses of a judge response; "error" and "missing" are unjudged


def _rate(true: int, n: int, prefix: str) -> dict[str, float | None]:
    low, high = wilson_interval(true, n)
    return {prefix: true / n if n else None, f"{prefix}_low": low if n else None, f"{prefix}_high": high if n else None}


def cell(part: pd.DataFrame) -> dict[str, Any]:
    """Accuracy over the samples with a judge response (n), and over all samples (n_all) with
    the unjudged ones counted as not True, each with a Wilson 95% interval."""
    answered = part[part["status"].isin(ANSWERED)]
    n, true = len(answered), int(answered["supported"].sum())
    errors, missing = int((part["status"] == "error").sum()), int((part["status"] == "missing").sum())
    return {**_rate(true, n, "accuracy"), "n": n, "true": true,
            "unparseable": int((part["status"] == "unparseable").sum()), "errors": errors, "missing": missing,
            "unjudged": errors + missing, **_rate(true, len(part), "accuracy_all"), "n_all": len(part)}


def judged_metric(judge: str) -> str:
    """The metric name of one judge's accuracy: `judged_<judge as a file-safe name>`."""
    return f"judged_{slug(judge)}"


def judged_all_metric(judge: str) -> str:
    """The metric name of one judge's accuracy over all samples, unjudged ones not True."""
    return f"{judged_metric(judge)}_all"


def judged_scores(run_path: Path) -> dict[str, dict[str, float | None]]:
    """Sample id -> two metrics per judge with a verdict file, for every record of the run:
    `judged_<judge>` is 1.0 judged True, 0.0 answered otherwise (unparseable included, as in
    the accuracy tables) and None when unjudged (a judge error, or no verdict yet), so a gate
    sees the gap; `judged_<judge>_all` is 1.0 judged True and 0.0 otherwise, unjudged included."""
    folder = Path(run_path) / "judgements"
    judges = judgement_files(folder)
    if not judges:
        return {}
    ids = [record.id for record in open_run(run_path).read_records()]
    scores: dict[str, dict[str, float | None]] = {sample_id: {} for sample_id in ids}
    for judge in judges:
        verdicts = JudgementFile(folder, judge).read()
        for sample_id in ids:
            verdict = verdicts.get(sample_id)
            answered = verdict is not None and verdict.status in ANSWERED
            true = 1.0 if verdict is not None and verdict.verdict is True else 0.0
            scores[sample_id][judged_metric(judge)] = true if answered else None
            scores[sample_id][judged_all_metric(judge)] = true
    return scores


def judge_summaries(run_path: Path) -> dict[str, Any]:
    """summary.json's `judges` section: per judge, accuracy over the run with its counts."""
    frame = verdict_frame([run_path])
    return {judge: {"label": label_for(judge), "heuristic": judge == "lexical", **cell(part)}
            for judge, part in frame.groupby("judge", sort=True)}


def judge_table(paths: Sequence[str | Path], judge: str | None = None) -> str:
    """Markdown: accuracy per dataset, model and judge; then paired comparisons."""
    frame = verdict_frame(paths)
    if judge is not None:
        frame = frame[frame["judge"] == judge]
    if frame.empty:
        return "no verdicts yet: judge with `evalsuite score RUN --judge ...`"
    lines = ["| dataset | model | judge | accuracy (95% CI) | n | unparseable | errors | missing "
             "| accuracy, unjudged not True (95% CI) | all |", "|---|---|---|---|---|---|---|---|---|---|"]
    unjudged = 0
    for (dataset, model, name), part in frame.groupby(["dataset", "model", "judge"], sort=True):
        c = cell(part)
        rate = format_rate(c["accuracy"], c["accuracy_low"], c["accuracy_high"])
        rate_all = format_rate(c["accuracy_all"], c["accuracy_all_low"], c["accuracy_all_high"])
        lines.append(f"| {dataset} | {model} | {label_for(name)} | {rate} | {c['n']} | {c['unparseable']} | "
                     f"{c['errors']} | {c['missing']} | {rate_all} | {c['n_all']} |")
        unjudged += c["unjudged"]
    if unjudged:
        lines += ["", f"Unjudged samples (a judge error, or not judged yet): {unjudged}. `accuracy` leaves them out "
                  "of n, `accuracy, unjudged not True` counts them as not True; `evalsuite score RUN --judge J` "
                  "judges them."]
    paired = paired_rows(frame)
    if paired:
        lines += ["", "Paired (exact McNemar on samples both models have verdicts for):", "",
                  "| dataset | judge | model A | model B | pairs | A True only | B True only | p |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {label_for(r['judge'])} | {r['model_a']} | {r['model_b']} | {r['n']} | "
                  f"{r['only_a']} | {r['only_b']} | {r['p_value']:.4g} |" for r in paired]
    if (frame["judge"] == "lexical").any():
        lines += ["", HEURISTIC_NOTE]
    return "\n".join(lines)


def paired_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """McNemar for every two runs with the same task parameters, per judge and dataset."""
    answered = frame[frame["status"].isin(ANSWERED)]
    rows = []
    for (_params, judge, dataset), part in answered.groupby(["params", "judge", "dataset"], sort=True):
        runs = sorted(part["run"].unique())
        for run_a, run_b in combinations(runs, 2):
            a = part[part["run"] == run_a].set_index("id")
            b = part[part["run"] == run_b].set_index("id")
            common = sorted(set(a.index) & set(b.index))
            if not common:
                continue
            test = mcnemar_exact(a.loc[common, "supported"].tolist(), b.loc[common, "supported"].tolist())
            rows.append({"dataset": dataset, "judge": judge, "model_a": a["model"].iloc[0],
                         "model_b": b["model"].iloc[0], **test})
    return rows


def write_table(run_path: Path) -> Path:
    """judgements.md in the run folder: the table for every judge that has verdicts there."""
    path = run_path / "judgements.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(f"# Judged accuracy: {run_path.name}\n\n{judge_table([run_path])}\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
