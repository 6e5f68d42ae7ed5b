"""The attention task's presentation: the table by answer depth (paper Table 3) with 95%
intervals, the table by layer, depth x length heatmaps of each share, and the views of a pair
of models (side-by-side and difference heatmaps, and the by-depth table with paired differences).

Statistics: a sample's query rows, heads and layers all read one prompt, so they are averaged
into one value per sample first (one cluster, one value); intervals are then over samples,
Student t for a model's mean and the paired bootstrap of `stats.paired_difference` for a pair.

The drawing and statistics libraries are imported when something is drawn or summarised, so
that registering the task stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evalsuite.contracts import TaskView
from evalsuite.runs.view import RunView
from evalsuite.tasks.needle.view import AXIS_LABELS, depth_length_grid, paired_counts, sample_counts, significance_marks

if TYPE_CHECKING:
    import pandas as pd

METRICS = {"answer_share": "answer", "noise_share": "noise"}  # metric -> region in the records
SETTING = ["n_needles", "n_queries"]
AXES = (AXIS_LABELS["context_length"], f"answer needle {AXIS_LABELS['depth']}")


def _cell(mean: Any, low: Any, high: Any) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f}" if low is None or high is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _settings(frame: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(n), int(r)) for n, r in zip(frame["n_needles"], frame["n_queries"])})


def _setting_frame(frame: pd.DataFrame, setting: tuple[int, int]) -> pd.DataFrame:
    return frame[(frame["n_needles"] == setting[0]) & (frame["n_queries"] == setting[1])]


def _suffix(frame: pd.DataFrame, setting: tuple[int, int]) -> str:
    return "" if len(_settings(frame)) == 1 else f"_N{setting[0]}_R{setting[1]}"


def _scored(frame: pd.DataFrame) -> pd.DataFrame:
    """Samples with both shares (a sample that failed has none)."""
    present = [m for m in METRICS if m in frame.columns]
    return frame.dropna(subset=present) if len(present) == len(METRICS) else frame.iloc[0:0]


class AttentionView(TaskView):
    """The attention task's tables and heatmaps, of one run and of a pair of runs."""

    axis_labels = AXIS_LABELS

    def plots(self, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path]:
        return run_outputs(frame, run.read_records(), Path(folder), title)

    def report_section(self, run: RunView) -> str:
        from evalsuite.analysis.frame import run_frame

        return markdown_tables(run_frame(run), run.read_records())

    def html_samples(self, records: Sequence[Any]) -> str:
        from evalsuite.analysis.html import generic_samples

        return generic_samples(records, self.task.metrics)

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Both models' heatmaps side by side, their difference with significant cells marked,
        and the by-depth table of both with the paired difference."""
        return pair_outputs(comparison, Path(folder))


# ---- one run ---------------------------------------------------------------------------------------


def by_depth(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (N, R) setting and answer depth, pooled over lengths: each share's mean and 95% interval."""
    from evalsuite.analysis.frame import plain
    from evalsuite.analysis.stats import mean_interval

    rows = []
    for (n, r, depth), part in _scored(frame).groupby([*SETTING, "depth"], sort=True):
        row: dict[str, Any] = {"n_needles": int(n), "n_queries": int(r), "depth": float(depth), "n": len(part)}
        for metric in METRICS:
            mean, low, high = mean_interval(part[metric].astype(float).tolist())
            row.update({metric: mean, f"{metric}_low": low, f"{metric}_high": high})
        rows.append({k: plain(v) for k, v in row.items()})
    return rows


def by_layer(records: Sequence[Any]) -> list[dict[str, Any]]:
    """Per layer: each share's mean over samples (and λ, for differential maps)."""
    values: dict[tuple[int, str], list[float]] = {}
    lambdas: dict[int, float] = {}
    for record in records:
        if record.error or not record.outputs:
            continue
        output = record.outputs[0]
        for index, layer in enumerate(output["layers"]):
            for region in METRICS.values():
                values.setdefault((layer, region), []).append(output["per_layer"][region][index])
            if output.get("lambdas"):
                lambdas[layer] = output["lambdas"][index]
    rows = []
    for layer in sorted({layer for layer, _ in values}):
        row = {"layer": layer, **{metric: float(np.mean(values[(layer, region)])) for metric, region in METRICS.items()},
               "n": len(values[(layer, "answer")])}
        rows.append({**row, "lambda": lambdas[layer]} if layer in lambdas else row)
    return rows


def _map_note(records: Sequence[Any]) -> str:
    outputs = [r.outputs[0] for r in records if not r.error and r.outputs]
    if not outputs:
        return "no sample was measured"
    first = outputs[0]
    kind = "softmax map" if first["map"] == "softmax" else f"differential map / ({first['normalisation']})"
    return f"{kind}; layers {first['layers']}; mean over heads, query rows and layers per sample"


def markdown_tables(frame: pd.DataFrame, records: Sequence[Any]) -> str:
    """The by-depth table (95% intervals over samples) and the by-layer table, in markdown."""
    several = len(_settings(frame)) > 1 if not frame.empty else False
    keys = [*SETTING, "depth"] if several else ["depth"]
    lines = [f"### Attention allocation by answer depth ({_map_note(records)})", "",
             "| " + " | ".join([*keys, "answer share (95% CI)", "noise share (95% CI)", "n"]) + " |",
             "|" + "---|" * (len(keys) + 3)]
    for row in by_depth(frame):
        cells = [str(row[k]) for k in keys] + [_cell(row[m], row[f"{m}_low"], row[f"{m}_high"]) for m in METRICS]
        lines.append("| " + " | ".join([*cells, str(row["n"])]) + " |")
    layers = by_layer(records)
    has_lambda = any("lambda" in row for row in layers)
    lines += ["", "### By layer (mean over samples)", "",
              "| layer | answer share | noise share |" + (" λ |" if has_lambda else "") + " n |",
              "|---|---|---|" + ("---|" if has_lambda else "") + "---|"]
    for row in layers:
        lam = f" {row['lambda']:.4f} |" if has_lambda else ""
        lines.append(f"| {row['layer']} | {row['answer_share']:.3f} | {row['noise_share']:.3f} |{lam} {row['n']} |")
    return "\n".join(lines) + "\n"


def run_outputs(frame: pd.DataFrame, records: Sequence[Any], folder: Path, title: str) -> list[Path]:
    """One run: a depth x length heatmap per share and (N, R) setting, and the tables."""
    from evalsuite.analysis.plots import heatmap, plt, save

    scored = _scored(frame)
    paths = []
    for setting in _settings(scored) if not scored.empty else []:
        part = _setting_frame(scored, setting)
        for metric, region in METRICS.items():
            grid = depth_length_grid(part, metric)
            fig, ax = plt.subplots(figsize=(1.2 * grid.shape[1] + 3, 0.75 * grid.shape[0] + 2))
            heatmap(grid, ax, f"{title}: {region} share\nN={setting[0]}, R={setting[1]}", *AXES,
                    counts=sample_counts(part, metric))
            paths.append(save(fig, folder / f"heatmap_{metric}{_suffix(scored, setting)}.png"))
    tables = folder / "attention_tables.md"
    tables.write_text(f"## {title}\n\n" + markdown_tables(frame, records), encoding="utf-8")
    return [*paths, tables]


# ---- a pair of runs --------------------------------------------------------------------------------


def pair_outputs(comparison: Any, folder: Path) -> list[Path]:
    """Side-by-side and difference heatmaps per share, and the by-depth table of both models."""
    from evalsuite.analysis.plots import heatmap, plt, save

    frame_a, frame_b, names = comparison.frame_a, comparison.frame_b, comparison.names
    paths = []
    for metric, region in METRICS.items():
        if metric not in frame_a.columns or metric not in frame_b.columns:
            continue
        marks = significance_marks(comparison.cells, metric) if comparison.cells else {}
        for setting in _settings(frame_a):
            suffix = _suffix(frame_a, setting)
            part_a, part_b = _setting_frame(frame_a, setting), _setting_frame(frame_b, setting)
            grid_a, grid_b = depth_length_grid(part_a, metric), depth_length_grid(part_b, metric)
            label = f"{region} share, N={setting[0]}, R={setting[1]}"
            fig, axes = plt.subplots(1, 2, figsize=(2.4 * grid_a.shape[1] + 5, 0.75 * grid_a.shape[0] + 2))
            for ax, grid, part, name in zip(axes, (grid_a, grid_b), (part_a, part_b), names):
                heatmap(grid, ax, f"{name}: {label}", *AXES, counts=sample_counts(part, metric))
            paths.append(save(fig, folder / f"heatmap_pair_{metric}{suffix}.png"))
            paths.append(_difference_heatmap(grid_a - grid_b, paired_counts(part_a, part_b, metric), marks.get(setting),
                                             names, label, comparison.alpha,
                                             folder / f"heatmap_diff_{metric}{suffix}.png"))
    table = folder / "attention_by_depth_pair.md"
    table.write_text(pair_table(frame_a, frame_b, names), encoding="utf-8")
    return [*paths, table]


def _difference_heatmap(diff: pd.DataFrame, counts: pd.DataFrame, marks: pd.DataFrame | None,
                        names: tuple[str, str], label: str, alpha: float, path: Path) -> Path:
    """The difference of two models' shares; what '*' means is said only when a cell has one."""
    from evalsuite.analysis.plots import heatmap, plt, save

    annot = diff.map(lambda v: f"{v:+.3f}")
    marked = False
    if marks is not None:
        aligned = marks.reindex(index=diff.index, columns=diff.columns).fillna(False).astype(bool)
        annot = annot.where(~aligned, annot + "*")
        marked = bool(aligned.to_numpy().any())
    fig, ax = plt.subplots(figsize=(1.2 * diff.shape[1] + 3, 0.75 * diff.shape[0] + 2))
    note = f"\n* p<{alpha:g}, paired permutation test" if marked else ""
    heatmap(diff, ax, f"{names[0]} minus {names[1]}: {label}{note}", *AXES, diverging=True, annot=annot,
            counts=counts)
    return save(fig, path)


def pair_table(frame_a: pd.DataFrame, frame_b: pd.DataFrame, names: tuple[str, str]) -> str:
    """Per setting and depth (pooled over lengths): both models' shares with 95% intervals and the
    paired difference a - b with its bootstrap interval and permutation p-value."""
    from evalsuite.analysis.frame import plain
    from evalsuite.analysis.stats import mean_interval, paired_difference

    several = len(_settings(frame_a)) > 1
    keys = [*SETTING, "depth"] if several else ["depth"]
    header = [*keys, "share", names[0], names[1], "difference [95% CI]", "p", "n"]
    lines = [f"# attention allocation by answer depth: {names[0]} vs {names[1]}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, part_a in frame_a.groupby([*SETTING, "depth"], sort=True):
        part_b = frame_b.loc[part_a.index]  # compare's frames are aligned row by row on sample id
        for metric, region in METRICS.items():
            if metric not in part_a.columns or metric not in part_b.columns:
                continue
            a, b = part_a[metric].astype(float).to_numpy(), part_b[metric].astype(float).to_numpy()
            keep = ~(np.isnan(a) | np.isnan(b))
            test = paired_difference(a[keep], b[keep], pass_fail=False)
            shown = [str(v) for v in key] if several else [str(key[-1])]
            diff = "n/a" if not test["n"] else f"{test['diff']:+.3f} [{test['low']:.3f}, {test['high']:.3f}]"
            lines.append("| " + " | ".join([*shown, region, _cell(*map(plain, mean_interval(a[keep].tolist()))),
                                            _cell(*map(plain, mean_interval(b[keep].tolist()))), diff,
                                            f"{test['p_value']:.3g}", str(test["n"])]) + " |")
    return "\n".join(lines) + "\n"
