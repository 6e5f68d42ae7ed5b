"""Sections of learning from the context: many-shot ICL, its spread over orders, hallucination."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evalsuite.analysis.compare import paired_frames
from evalsuite.analysis.side_scores import side_metrics
from evalsuite.runs.records import RunFolder

from .collect import PaperRuns
from .measures import Key, Paired, estimates, reading
from .published import published
from .sections import Cells, Section, Table, absent, beside, cell_table, named, two_models

TITLES = {
    "icl": "Many-shot in-context learning: accuracy against shots",
    "icl-order": "Many-shot in-context learning: spread over demonstration orders",
    "hallucination": "Contextual hallucination",
}
ICL_LABELS = {"trec": "TREC", "trec-fine": "TREC-fine", "banking77": "Banking-77", "clinic150": "Clinic-150"}
HALLUCINATION_LABELS = {"xsum": "XSum", "cnn_dailymail": "CNN/DM", "multi_news": "MultiNews", "qasper": "Qasper",
                        "hotpotqa": "HotpotQA", "2wikimqa": "2WikiMQA"}
ORDER_LABELS = {"random": "random order", "alternating": "alternating by class"}


def icl_dataset(run: RunFolder) -> str:
    """The dataset an ICL run read: its hub name, or its local file's name (DIR/icl/trec.jsonl: trec)."""
    params = run.read_config()["params"]
    return Path(params["data"]).stem if params.get("data") else str(params.get("dataset", ""))


def _icl_entries(runs: PaperRuns) -> list[tuple[str, list[tuple[str, RunFolder]]]]:
    found = [(name, two_models(runs, name)) for name in runs.entries("icl")]
    return [(name, models) for name, models in found if models is not None]


def icl(runs: PaperRuns, figures: Path) -> Section:
    """Accuracy per shot count (and order) for each dataset, with the paired test per cell."""
    key = "icl"
    entries = _icl_entries(runs)
    if not entries:
        return absent(key, TITLES[key], runs, [n for n in runs.skipped if n.startswith("icl")] or ["icl-*"])
    paper = {p.label: p for p in published(key)}
    tables: list[Table] = []
    tests: dict[str, dict[Key, Paired]] = {}
    for name, found in entries:
        label = ICL_LABELS.get(icl_dataset(found[0][1]), icl_dataset(found[0][1]))
        largest = max(int(n) for _, run in found for n in _shots(run))
        cells = Cells(keys=("order", "n_shots"), metric="correct", label=lambda cell: f"{cell[0]}, {cell[1]} shots",
                      paper=beside(paper.get(label), ("random", largest).__eq__))
        table, _, by_model = cell_table(f"{label} ({name}): accuracy", found, cells, "cells")
        tables.append(table)
        for model, cells_of in by_model.items():
            tests.setdefault(model, {}).update({(label, *cell): test for cell, test in cells_of.items()})
    base = entries[0][1][0][0]
    readings = [reading(model, base, found, "(dataset, order, shots) cells") for model, found in tests.items()]
    figure = _accuracy_vs_shots(entries, figures / key)
    return Section(key=key, title=TITLES[key], readings=readings, tables=tables, figures=[figure],
                   published=published(key),
                   notes=["paired tests per cell resample whole test questions (clustered by test_index); the "
                          "paper's gains are in points (accuracy × 100), shown beside the largest shot count"])


def _shots(run: RunFolder) -> list[int]:
    return sorted({int(r.axes["n_shots"]) for r in run.read_records() if "n_shots" in r.axes})


def _accuracy_vs_shots(entries: Sequence[tuple[str, list[tuple[str, RunFolder]]]], folder: Path) -> Path:
    from evalsuite.analysis.plots import plt, save

    fig, axes = plt.subplots(1, len(entries), figsize=(4.5 * len(entries), 3.8), squeeze=False)
    for ax, (name, found) in zip(axes[0], entries):
        for model, run in found:
            for order, points in _by_order(estimates(run, ("order", "n_shots"), "correct")).items():
                shots = [s for s, _ in points]
                means = np.array([e.mean for _, e in points])
                errors = np.nan_to_num(np.array([[e.mean - e.low, e.high - e.mean] for _, e in points]).T)
                ax.errorbar(shots, means, yerr=errors, marker="o", capsize=3, label=f"{model}, {order}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("demonstrations (shots)")
        ax.set_ylabel("accuracy (95% CI)")
        ax.set_title(name)
        ax.legend(fontsize="x-small")
    folder.mkdir(parents=True, exist_ok=True)
    return save(fig, folder / "accuracy_vs_shots.png")


def _by_order(found: dict[Key, Any]) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = {}
    for (order, shots), estimate in sorted(found.items()):
        out.setdefault(str(order), []).append((int(shots), estimate))
    return out


def icl_order(runs: PaperRuns, figures: Path) -> Section:
    """Best minus worst accuracy over the demonstration orders at the largest shot count, per model,
    and the ICL task's paired spread test (`icl.order.robustness_rows`) against the baseline."""
    from evalsuite.tasks.icl.order import robustness_rows

    key = "icl-order"
    entries = _icl_entries(runs)
    if not entries:
        return absent(key, TITLES[key], runs, [n for n in runs.skipped if n.startswith("icl")] or ["icl-*"])
    paper = {p.label: p for p in published(key)}
    base = entries[0][1][0][0]
    others = [m for m, _ in entries[0][1][1:]]
    header = ["dataset", "order", "shots", f"{base} spread", *(f"{m} spread" for m in others),
              *(f"{m} − {base} order sd beyond noise (points, p Holm)" for m in others), "paper Transformer",
              "paper DIFF"]
    rows: list[list[str]] = []
    tests: dict[str, dict[Key, Paired]] = {}
    for _, found in entries:
        label = ICL_LABELS.get(icl_dataset(found[0][1]), icl_dataset(found[0][1]))
        for row in _spread_rows(found, robustness_rows):
            item = paper.get(f"{label} {ORDER_LABELS.get(row['order'], row['order'])}")
            values = [] if item is None else [item.text(c) for c in ("Transformer", "DIFF")]  # as the paper rounds
            rows.append([label, row["order"], str(row["n_shots"]), *row["spreads"], *row["tests"],
                         *(values or ["", ""])])
            for model, test in zip(others, row["paired"]):
                tests.setdefault(model, {})[(label, row["order"])] = test
    readings = [reading(m, base, t, "(dataset, order) pairs", lower_is_better=True).replace(" below ", " steadier than ")
                for m, t in tests.items()]
    return Section(key=key, title=TITLES[key], readings=readings, tables=[Table(
        "best minus worst accuracy over orders (points), at the largest shot count", header, rows)],
        published=published(key),
        notes=["order sd beyond noise: the standard deviation of accuracy over the orders, binomial noise taken "
               "out; its p tests the order variance difference by a bootstrap that resamples the permutations (a "
               "random sample of orders) and the test questions together, Holm over the rows, as `evalsuite "
               "compare` writes it in order_robustness.md; needs two or more permutations"])


def _spread_rows(found: list[tuple[str, RunFolder]], robustness_rows: Any) -> list[dict[str, Any]]:
    """Per order at the largest shot count: each model's spread (points) and each test against the baseline."""
    base_run = found[0][1]
    per_model = []
    for _, run in found[1:]:
        frame_a, frame_b = paired_frames(base_run, run)
        rows = robustness_rows(frame_a, frame_b)
        largest = max((r["n_shots"] for r in rows), default=None)
        per_model.append([r for r in rows if r["n_shots"] == largest and r["permutations"] > 1])
    out = []
    for index, first in enumerate(per_model[0] if per_model else []):
        rows = [model_rows[index] for model_rows in per_model]
        spreads = [_points_text(first["spread_a"]), *(_points_text(r["spread_b"]) for r in rows)]
        # the model's order sd minus the baseline's (compare's a is the baseline): below zero, steadier; the
        # test's interval is of the variance difference, in other units, so none is shown beside the sd
        paired = [Paired(_points(r["order_sd_b"], r["order_sd_a"]), np.nan, np.nan,
                         np.nan if r["p_holm"] is None else r["p_holm"], int(r["n"]), "bootstrap") for r in rows]
        tests = [p.text(1).replace("p=", "p Holm=") for p in paired]
        out.append({"order": first["order"], "n_shots": first["n_shots"], "spreads": spreads, "tests": tests,
                    "paired": paired})
    return out


def _points(value: float | None, baseline: float | None) -> float:
    """value - baseline in points (NaN when either is missing)."""
    return np.nan if value is None or baseline is None else (value - baseline) * 100 + 0.0


def _points_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def hallucination(runs: PaperRuns, figures: Path) -> Section:
    """Judged accuracy per dataset (unjudged counted as not True, as the paper counts an unparseable verdict)."""
    key = "hallucination"
    names = runs.entries("hallucination")
    entries = [(name, two_models(runs, name)) for name in names]
    present = [(name, found) for name, found in entries if found is not None]
    if not present:
        return absent(key, TITLES[key], runs, [n for n in runs.skipped if n.startswith(key)] or ["hallucination-*"])
    paper = {p.label: p for p in published(key)}
    tables: list[Table] = []
    tests: dict[str, dict[Key, Paired]] = {}
    judges: set[str] = set()
    for name, found in present:
        metric = _judged_metric(found)
        if metric is None:
            tables.append(Table(f"{name}: no judge verdicts", ["note"], [["judge with `evalsuite score RUN --judge J`"]]))
            continue
        judges.add(metric)
        dataset = str(found[0][1].read_config()["params"].get("dataset", name))
        label = HALLUCINATION_LABELS.get(dataset, dataset)
        cells = Cells(keys=(), metric=metric, label=named(label), paper=beside(paper.get(label)))
        table, _, by_model = cell_table(f"{label}: judged accuracy ({metric})", found, cells, "datasets")
        tables.append(table)
        for model, cells_of in by_model.items():
            tests.setdefault(model, {}).update({(label, *c): t for c, t in cells_of.items()})
    merged = Table("judged accuracy per dataset", tables[0].header, [r for t in tables for r in t.rows]) \
        if all(t.header == tables[0].header for t in tables) else None
    base = present[0][1][0][0]
    readings = [reading(m, base, t, "datasets") for m, t in tests.items()]
    return Section(key=key, title=TITLES[key], readings=readings, tables=[merged] if merged else tables,
                   published=published(key),
                   notes=[f"judged by {', '.join(sorted(judges)) or 'no judge'} (unjudged samples count as not "
                          "True); the paper's judge is GPT-4o: another judge's accuracies are not on the paper's scale; "
                          "paired tests: McNemar's exact test"])


def _judged_metric(found: Sequence[tuple[str, RunFolder]]) -> str | None:
    """The judged accuracy every model's run has: judged_<judge>_all, the first judge by name."""
    shared = set.intersection(*(set(side_metrics(run)) for _, run in found))
    judged = sorted(m for m in shared if m.startswith("judged_") and m.endswith("_all"))
    return judged[0] if judged else None
