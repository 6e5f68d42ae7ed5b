"""The outliers task's presentation: the table of every shard's sketches merged (the paper's shape:
the k-th largest |x| and the median, overall and per layer) and the plot per layer. The drawing
libraries are imported when something is drawn, so that registering the task stays cheap."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.contracts import TaskView
from evalsuite.runs.view import RunView

from .sketch import KINDS, TOP_RANKS, merge, series_order, statistics

if TYPE_CHECKING:
    import pandas as pd


class OutliersView(TaskView):
    """The outliers table in reports, and the per-layer plot."""

    def report_section(self, run: RunView) -> str:
        return markdown_table(outlier_table(run), run.read_records()[0].model)

    def plots(self, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path]:
        table = outlier_table(run)
        return [outlier_layers(table["per_layer"], Path(folder) / "outliers_per_layer.png", title)]


def outlier_layers(per_layer: list[dict], path: Path, title: str) -> Path:
    """Top-1 and median |x| per layer, attention logits and hidden states side by side (log scale)."""
    import pandas as pd

    from evalsuite.analysis.plots import plt, save

    frame = pd.DataFrame(per_layer)
    kinds = list(dict.fromkeys(frame["kind"]))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        part = frame[frame["kind"] == kind].sort_values("layer")
        for column, label in (("top1", "top-1"), ("top10", "top-10"), ("median", "median")):
            ax.plot(part["layer"], part[column].astype(float), marker="o", label=label)
        ax.set_yscale("log")
        ax.set_xticks(part["layer"].tolist())
        ax.set_xlabel("layer")
        ax.set_ylabel("|x|")
        ax.set_title(kind)
        ax.legend(fontsize="small")
    fig.suptitle(f"{title}: activation magnitudes per layer")
    return save(fig, Path(path))


def outlier_table(run: RunView) -> dict[str, Any]:
    """Every shard's sketches merged: statistics per kind overall and per layer."""
    by_series: dict[str, list[dict[str, Any]]] = {}
    for record in run.read_records():
        for name, sketch in record.outputs[0]["series"].items():
            by_series.setdefault(name, []).append(sketch)
    per_layer = []
    for name in sorted(by_series, key=series_order):
        kind, layer = series_order(name)
        per_layer.append({"kind": KINDS[kind], "layer": layer, **statistics(merge(by_series[name]))})
    overall = {KINDS[k]: statistics(merge([s for n, group in by_series.items() if n.startswith(k + "/")
                                           for s in group])) for k in KINDS}
    return {"overall": overall, "per_layer": per_layer}


def markdown_table(table: dict[str, Any], model: str) -> str:
    """The paper's shape: a row per activation type, the k-th largest |x| and the median."""
    header = "| model | activation | layer | " + " | ".join(f"top-{k}" for k in TOP_RANKS) + " | median | n |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]

    def line(kind: str, layer: str, stats: dict[str, Any]) -> str:
        cells = [_number(stats[f"top{k}"]) for k in TOP_RANKS] + [_number(stats["median"]), str(stats["count"])]
        return f"| {model} | {kind} | {layer} | " + " | ".join(cells) + " |"

    lines += [line(kind, "all", stats) for kind, stats in table["overall"].items()]
    lines += [line(row["kind"], str(row["layer"]), row) for row in table["per_layer"]]
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
