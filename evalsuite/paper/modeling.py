"""Sections of the model itself: NLL by position, zero-shot accuracy against attention bits, outliers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evalsuite.runs.records import RunFolder

from .collect import PaperRuns
from .measures import ALPHA, MIN_DOCUMENTS, Key
from .published import published
from .sections import Cells, Section, Table, absent, cell_table, named, two_models

TITLES = {
    "nll": "Cumulative NLL by position",
    "zeroshot": "Zero-shot accuracy against attention bits",
    "outliers": "Activation outliers",
}


def nll(runs: PaperRuns, figures: Path) -> Section:
    """Mean cumulative NLL per position (its paired bootstrap band against the baseline) and the curves."""
    from evalsuite.tasks.nll.view import (
        curves_by_length,
        difference_table,
        headline_positions,
        paired_curves,
        plot_curves,
    )

    key = "nll"
    found = two_models(runs, key)
    if found is None:
        return absent(key, TITLES[key], runs, [key])
    curves = {model: curves_by_length(run.read_records()) for model, run in found}
    base_name = found[0][0]
    header = ["length", "position", *(f"{m} (mean over documents)" for m, _ in found),
              *(f"{m} − {base_name} (95% paired band)" for m, _ in found[1:])]
    rows: dict[tuple[int, int], list[str]] = {}
    readings = []
    for model, _ in found[1:]:
        table = difference_table(paired_curves(curves[base_name], curves[model]))  # baseline minus model
        below = table[table["diff"] > 0]
        shown = sum(1 for _, r in below.iterrows() if not math.isnan(r["low"]) and r["low"] > 0)
        documents = int(table["documents"].min()) if len(table) else 0
        if documents < MIN_DOCUMENTS:
            readings.append(f"{model} vs {base_name}: {documents} documents, fewer than the {MIN_DOCUMENTS} a paired "
                            "band needs; the curves are shown, not read")
        else:
            readings.append(f"{model} below {base_name} at {len(below)} of {len(table)} positions, {shown} with the "
                            f"95% paired band over {documents} documents clear of zero")
        for length in sorted(set(table["context_length"])):
            part = table[table["context_length"] == length].reset_index(drop=True)
            for index in headline_positions(part["position"].to_numpy()):
                r = part.iloc[index]
                row = rows.setdefault((int(length), int(r["position"])), [str(length), str(int(r["position"]))])
                if len(row) == 2:
                    row += [f"{r['mean_a']:.3f}", *(["n/a"] * (len(found) - 1))]
                row[2 + [m for m, _ in found].index(model)] = f"{r['mean_b']:.3f}"
                row.append(_band_text(-r["diff"], -r["high"], -r["low"]))
    folder = figures / key
    folder.mkdir(parents=True, exist_ok=True)
    figure = plot_curves(curves, folder / "nll_curves.png")
    return Section(key=key, title=TITLES[key], readings=readings,
                   tables=[Table("cumulative average NLL (nats) at powers of two", header, list(rows.values()))],
                   figures=[figure], published=published(key), notes=runs.notes.get(key, []))


def _band_text(diff: float, low: float, high: float) -> str:
    band = "" if math.isnan(low) else f" [{low:+.3f}, {high:+.3f}]"
    return f"{diff:+.3f}{band}"


def zeroshot(runs: PaperRuns, figures: Path) -> Section:
    """HellaSwag accuracy (acc_norm, as the paper) per attention bit width."""
    key, entry = "zeroshot", "zeroshot-bits"
    found = two_models(runs, entry)
    if found is None:
        return absent(key, TITLES[key], runs, [entry])
    paper = {p.label: p for p in published(key)}
    metric = "acc_norm" if _has_metric(found[0][1], "acc_norm") else "acc"
    dtype = "/".join(_dtypes(found))

    def label(cell: Key) -> str:  # 16 "bits" is the attention as the model computes it, in its own dtype
        return f"{cell[0]}, unquantized attention ({dtype})" if cell[1] == 16 else f"{cell[0]}, {cell[1]}-bit attention"

    cells = Cells(keys=("benchmark", "bits"), metric=metric, label=label,
                  paper=lambda cell: paper["4-bit attention (about)"] if cell[1] == 4 else None)
    table, readings, _ = cell_table(f"{metric} per attention bit width", found, cells, "bit widths")
    figure = _accuracy_vs_bits(found, metric, figures / key)
    notes = [f"the unquantized row (the paper's 16 bits) is the attention as the model computes it, in {dtype}; fewer "
             "bits quantize the attention logits by dynamic absmax", "the paper's gain is in points (accuracy × 100)"]
    return Section(key=key, title=TITLES[key], readings=readings, tables=[table], figures=[figure],
                   published=published(key), notes=notes)


def _dtypes(found: Sequence[tuple[str, RunFolder]]) -> list[str]:
    """The dtypes the models ran in, as their runs record them."""
    dtypes = set()
    for _, run in found:
        model = run.read_config().get("model")
        dtypes.add(str(model.get("dtype") or "dtype not recorded") if isinstance(model, dict) else "dtype not recorded")
    return sorted(dtypes)


def _has_metric(run: RunFolder, metric: str) -> bool:
    return any(metric in record.scores for record in run.read_records()[:20])


def _accuracy_vs_bits(found: Sequence[tuple[str, RunFolder]], metric: str, folder: Path) -> Path:
    from evalsuite.analysis.plots import plt, save

    from .measures import estimates

    fig, ax = plt.subplots(figsize=(6, 4))
    for model, run in found:
        points = sorted(estimates(run, ("bits",), metric).items())
        bits = [k[0] for k, _ in points]
        means = np.array([e.mean for _, e in points])
        errors = np.array([[e.mean - e.low, e.high - e.mean] for _, e in points]).T
        ax.errorbar(bits, means, yerr=np.nan_to_num(errors), marker="o", capsize=3, label=model)
    ax.set_xlabel("attention bits")
    ax.set_ylabel(f"{metric} (95% CI)")
    ax.invert_xaxis()
    ax.legend(fontsize="small")
    ax.set_title("zero-shot accuracy against attention bits")
    folder.mkdir(parents=True, exist_ok=True)
    return save(fig, folder / "accuracy_vs_bits.png")


OUTLIER_METRICS = (("attn_top1", "attention logits top-1"), ("attn_median", "attention logits median"),
                   ("hidden_top1", "hidden states top-1"), ("hidden_median", "hidden states median"))


def outliers(runs: PaperRuns, figures: Path) -> Section:
    """Top-1 and median |x| of attention logits and hidden states: every shard merged, and per shard
    (mean over shards with its interval, paired test over shards)."""
    from evalsuite.tasks.outliers.view import outlier_table

    key = "outliers"
    found = two_models(runs, key)
    if found is None:
        return absent(key, TITLES[key], runs, [key])
    paper = {p.label: p for p in published(key)}
    merged = {model: outlier_table(run)["overall"] for model, run in found}
    overall = Table("over every token (the paper's statistic)", ["", *(m for m, _ in found),
                                                                  "paper Transformer", "paper DIFF"], [])
    shards = None
    readings: list[str] = []
    for metric, label in OUTLIER_METRICS:
        kind, stat = label.rsplit(" ", 1)
        column = "top1" if stat == "top-1" else "median"
        values = [merged[m].get(kind, {}).get(column) for m, _ in found]
        overall.rows.append([label, *("n/a" if v is None else f"{v:.1f}" for v in values),
                             *(f"{paper[label].values[c]:.1f}" for c in ("Transformer", "DIFF"))])
        cells = Cells(keys=(), metric=metric, label=named(label), lower_is_better=True, digits=2)
        table, lines, _ = cell_table("per shard: mean over shards", found, cells, "tests paired over shards")
        readings += [f"{label}: {line}" for line in lines] if metric.endswith("top1") else []
        shards = table if shards is None else Table(table.title, table.header, shards.rows + table.rows)
    tables = [overall] + ([shards] if shards is not None else [])
    return Section(key=key, title=TITLES[key], readings=readings, tables=tables, published=published(key),
                   notes=[f"paired tests over shards of tokens (significant at p < {ALPHA}); the paper measures 0.4M "
                          "tokens"])
