"""The nll task's presentation: curves read back from records, the cumulative-NLL plot (both
models on one plot when two runs are compared), the per-position difference with its paired
bootstrap band, and the summary and markdown tables. No torch import; the drawing and statistics
libraries are imported when something is drawn or summarised, so that registering the task stays cheap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evalsuite.contracts import TaskView
from evalsuite.runs.records import Record
from evalsuite.runs.view import RunView

if TYPE_CHECKING:
    import pandas as pd

BAND = "95% bootstrap band over documents"


@dataclass(frozen=True)
class Curves:
    """Cumulative average NLL of each scored document at the run's checkpoint positions (one length)."""

    ids: tuple[str, ...]  # sample ids, one per row
    positions: np.ndarray
    values: np.ndarray  # documents x positions

    def subset(self, ids: Sequence[str]) -> Curves:
        row = {sample_id: i for i, sample_id in enumerate(self.ids)}
        return Curves(tuple(ids), self.positions, self.values[[row[i] for i in ids]])


def finite_curve(record: Record) -> bool:
    """A record whose running sums are all finite numbers: a model's NLL can overflow to inf or NaN
    (float16), and such a curve would turn every mean and band over its length into NaN."""
    sums = record.outputs[0].get("nll_sum") if isinstance(record.outputs[0], Mapping) else None
    return isinstance(sums, list) and bool(sums) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in sums)


def curves_by_length(records: Sequence[Record]) -> dict[int, Curves]:
    """Per length, every scored document's curve (skipped documents, errors and curves that are not
    finite left out: `document_counts` counts them)."""
    scored: dict[int, list[Record]] = {}
    for record in records:
        if not record.error and record.outputs and finite_curve(record):
            scored.setdefault(int(record.axes["context_length"]), []).append(record)
    out = {}
    for length, group in sorted(scored.items()):
        positions = np.asarray(group[0].outputs[0]["positions"])
        assert all(r.outputs[0]["positions"] == group[0].outputs[0]["positions"] for r in group), "one run, one grid"
        values = np.array([np.asarray(r.outputs[0]["nll_sum"]) / positions for r in group])
        out[length] = Curves(tuple(r.id for r in group), positions, values)
    return out


def paired_curves(a: Mapping[int, Curves], b: Mapping[int, Curves]) -> dict[int, tuple[Curves, Curves]]:
    """Per length both runs' curves on the documents scored in both, in one order."""
    out = {}
    for length in sorted(set(a) & set(b)):
        common = sorted(set(a[length].ids) & set(b[length].ids))
        if common:
            out[length] = (a[length].subset(common), b[length].subset(common))
    return out


class NllView(TaskView):
    """The nll task's curves and tables, of one run and of a pair of runs."""

    axis_labels = {"context_length": "context length (tokens)"}

    def plots(self, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path]:
        curves = curves_by_length(run.read_records())
        return [plot_curves({title: curves}, Path(folder) / "nll_cumulative.png")] if curves else []

    def report_section(self, run: RunView) -> str:
        records = run.read_records()
        return markdown_curves(records[0].model if records else run.path.name, records)

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Both models' curves on one plot, and the per-position difference with its paired band."""
        return pair_outputs(comparison.run_a.read_records(), comparison.run_b.read_records(), comparison.names,
                            Path(folder))


# ---- summary and markdown -------------------------------------------------------------------


def document_counts(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """Per length: documents scored, skipped (shorter than the length), failed, and scored with an
    NLL that is not finite (left out of the curves)."""
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        cell = counts.setdefault(str(record.axes["context_length"]),
                                 {"scored": 0, "skipped": 0, "errors": 0, "not_finite": 0})
        kind = "errors" if record.error else "skipped" if record.info.get("skipped") else "scored"
        if kind == "scored" and record.outputs and not finite_curve(record):
            kind = "not_finite"
        cell[kind] += 1
    return counts


def headline_positions(positions: np.ndarray) -> np.ndarray:
    """Indices of the positions that are powers of two, and of the last position."""
    powers = (positions & (positions - 1)) == 0
    powers[-1] = True
    return np.flatnonzero(powers)


def curve_summary(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per length: the mean cumulative NLL and its band at powers of two and the last position."""
    from evalsuite.analysis.stats import mean_band

    out = {}
    for length, curves in curves_by_length(records).items():
        keep = headline_positions(curves.positions)
        mean, low, high = mean_band(curves.values[:, keep])
        out[str(length)] = {"documents": len(curves.ids), "positions": curves.positions[keep].tolist(),
                            "mean": mean.tolist(), "low": _listed(low), "high": _listed(high)}
    return out


def _listed(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]  # NaN is not JSON


def markdown_curves(model: str, records: Sequence[Record]) -> str:
    """One row per (length, headline position): mean cumulative NLL with its band."""
    counts = document_counts(records)
    lines = [f"Cumulative average NLL of {model} (nats; {BAND}):", "",
             "| length | position | cumulative NLL [95% band] | documents | skipped |", "|---|---|---|---|---|"]
    for length, cell in curve_summary(records).items():
        for position, mean, low, high in zip(cell["positions"], cell["mean"], cell["low"], cell["high"]):
            band = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
            lines.append(f"| {length} | {position} | {mean:.3f}{band} | {cell['documents']} | "
                         f"{counts[length]['skipped']} |")
    return "\n".join(lines)


# ---- plots ------------------------------------------------------------------------------------


def _panels(lengths: Sequence[int]) -> tuple[Any, Any]:
    from evalsuite.analysis.plots import plt

    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4), squeeze=False)
    return fig, axes[0]


def _band(ax: Any, positions: np.ndarray, values: np.ndarray, label: str) -> None:
    from evalsuite.analysis.stats import mean_band

    mean, low, high = mean_band(values)
    (line,) = ax.plot(positions, mean, label=f"{label} (n={len(values)})")
    ax.fill_between(positions, low, high, color=line.get_color(), alpha=0.25, linewidth=0)


def plot_curves(models: Mapping[str, Mapping[int, Curves]], path: Path) -> Path:
    """Cumulative average NLL against position (log x), one panel per length, a line and band per model."""
    from evalsuite.analysis.plots import save

    lengths = sorted({length for curves in models.values() for length in curves})
    fig, axes = _panels(lengths)
    for ax, length in zip(axes, lengths):
        for name, curves in models.items():
            if length in curves:
                _band(ax, curves[length].positions, curves[length].values, name)
        ax.set_xscale("log")
        ax.set_xlabel("position (tokens)")
        ax.set_ylabel("cumulative average NLL (nats)")
        ax.set_title(f"length {length}")
        ax.legend(fontsize="small")
    fig.suptitle(f"{' vs '.join(models)}: cumulative average NLL by position\n{BAND}")
    return save(fig, path)


def difference_table(pairs: Mapping[int, tuple[Curves, Curves]]) -> pd.DataFrame:
    """Per length and position: both means and the mean paired difference a - b with its band."""
    import pandas as pd

    from evalsuite.analysis.stats import mean_band

    frames = []
    for length, (a, b) in pairs.items():
        diff, low, high = mean_band(a.values - b.values)
        frames.append(pd.DataFrame({"context_length": length, "position": a.positions, "documents": len(a.ids),
                                    "mean_a": a.values.mean(axis=0), "mean_b": b.values.mean(axis=0),
                                    "diff": diff, "low": low, "high": high}))
    return pd.concat(frames, ignore_index=True)


def plot_difference(table: pd.DataFrame, names: tuple[str, str], path: Path) -> Path:
    """The paired difference of cumulative average NLL by position (below zero: a is better)."""
    from evalsuite.analysis.plots import save

    lengths = sorted(table["context_length"].unique())
    fig, axes = _panels(lengths)
    for ax, length in zip(axes, lengths):
        part = table[table["context_length"] == length]
        (line,) = ax.plot(part["position"], part["diff"], label=f"n={part['documents'].iloc[0]} paired documents")
        ax.fill_between(part["position"], part["low"], part["high"], color=line.get_color(), alpha=0.25, linewidth=0)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("position (tokens)")
        ax.set_ylabel(f"{names[0]} minus {names[1]} (nats)")
        ax.set_title(f"length {length}")
        ax.legend(fontsize="small")
    fig.suptitle(f"cumulative average NLL, {names[0]} minus {names[1]}\npaired {BAND}")
    return save(fig, path)


def pair_outputs(records_a: Sequence[Record], records_b: Sequence[Record], names: tuple[str, str], folder: Path
                 ) -> list[Path]:
    """nll_curves.png (both models, paired documents), nll_difference.png and .csv."""
    pairs = paired_curves(curves_by_length(records_a), curves_by_length(records_b))
    if not pairs:
        return []
    curves = {names[0]: {length: a for length, (a, _) in pairs.items()},
              names[1]: {length: b for length, (_, b) in pairs.items()}}
    table = difference_table(pairs)
    csv = folder / "nll_difference.csv"
    table.to_csv(csv, index=False)
    return [plot_curves(curves, folder / "nll_curves.png"), plot_difference(table, names, folder / "nll_difference.png"),
            csv]
