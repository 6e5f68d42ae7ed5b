"""Seaborn plots drawn from the tidy frame of `report.py`. No torch import."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

METRIC = "correct_all"


def depth_length_grid(frame: pd.DataFrame, metric: str = METRIC) -> pd.DataFrame:
    """Mean of `metric` with depth as rows (0 at the top) and length as columns."""
    grid = frame.pivot_table(index="depth", columns="context_length", values=metric, aggfunc="mean")
    return grid.sort_index().sort_index(axis=1)


def _settings(frame: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(n), int(r)) for n, r in zip(frame["n_needles"], frame["n_queries"])})


def _setting_frame(frame: pd.DataFrame, n: int, r: int) -> pd.DataFrame:
    return frame[(frame["n_needles"] == n) & (frame["n_queries"] == r)]


def _draw(grid: pd.DataFrame, ax: plt.Axes, title: str, diverging: bool = False,
          annot: pd.DataFrame | None = None) -> None:
    options = {"vmin": -1, "vmax": 1, "cmap": "RdBu", "center": 0} if diverging else {"vmin": 0, "vmax": 1,
                                                                                         "cmap": "viridis"}
    sns.heatmap(grid.astype(float), ax=ax, annot=annot if annot is not None else True,
                fmt="" if annot is not None else ".2f", cbar=True, square=False, linewidths=0.5, **options)
    ax.set_title(title)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("answer needle depth")


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _per_setting(frame: pd.DataFrame, folder: Path, stem: str, draw: Callable[[pd.DataFrame, str], plt.Figure]
                 ) -> list[Path]:
    paths = []
    for n, r in _settings(frame):
        suffix = "" if len(_settings(frame)) == 1 else f"_N{n}_R{r}"
        fig = draw(_setting_frame(frame, n, r), f"N={n} needles, R={r} queries")
        paths.append(_save(fig, folder / f"{stem}{suffix}.png"))
    return paths


def needle_heatmaps(frame: pd.DataFrame, folder: Path, title: str) -> list[Path]:
    """One depth x length accuracy heatmap per (N, R) setting for a single model."""

    def draw(part: pd.DataFrame, setting: str) -> plt.Figure:
        grid = depth_length_grid(part)
        fig, ax = plt.subplots(figsize=(1.2 * grid.shape[1] + 3, 0.6 * grid.shape[0] + 2))
        _draw(grid, ax, f"{title}\n{setting}, all queries correct")
        return fig

    return _per_setting(frame, Path(folder), "heatmap", draw)


def needle_pair_heatmaps(frame_a: pd.DataFrame, frame_b: pd.DataFrame, folder: Path, names: tuple[str, str],
                         marks: pd.DataFrame | dict[tuple[int, int], pd.DataFrame] | None = None,
                         alpha: float = 0.05) -> list[Path]:
    """Side by side heatmaps of two models and the difference (a - b) heatmap.

    `marks`, when given, is a depth x length frame of booleans (significant cells),
    or a dict of such frames per (N, R) setting, shown with a '*' after the difference."""
    paths = []
    for n, r in _settings(frame_a):
        suffix = "" if len(_settings(frame_a)) == 1 else f"_N{n}_R{r}"
        grid_a = depth_length_grid(_setting_frame(frame_a, n, r))
        grid_b = depth_length_grid(_setting_frame(frame_b, n, r))
        fig, axes = plt.subplots(1, 2, figsize=(2.4 * grid_a.shape[1] + 5, 0.6 * grid_a.shape[0] + 2))
        for ax, grid, name in zip(axes, (grid_a, grid_b), names):
            _draw(grid, ax, f"{name}: N={n}, R={r}")
        paths.append(_save(fig, Path(folder) / f"heatmap_pair{suffix}.png"))
        diff = grid_a - grid_b
        annot = diff.map(lambda v: f"{v:+.2f}")
        setting_marks = marks.get((n, r)) if isinstance(marks, dict) else marks
        if setting_marks is not None:
            aligned = setting_marks.reindex(index=diff.index, columns=diff.columns).fillna(False).astype(bool)
            annot = annot.where(~aligned, annot + "*")
        fig, ax = plt.subplots(figsize=(1.2 * diff.shape[1] + 3, 0.6 * diff.shape[0] + 2))
        note = f"\n* p<{alpha:g}, McNemar" if setting_marks is not None else ""
        _draw(diff, ax, f"{names[0]} minus {names[1]}: N={n}, R={r}{note}", diverging=True, annot=annot)
        paths.append(_save(fig, Path(folder) / f"heatmap_diff{suffix}.png"))
    return paths


def paired_difference_plots(cells: pd.DataFrame, keys: list[str], folder: Path, names: tuple[str, str]
                            ) -> list[Path]:
    """Any task: per metric, the paired difference (a - b) of each cell with its 95%
    interval, along the first numeric axis; other axes become the line label.
    Filled markers are significant cells, hollow ones are not."""
    numeric = [k for k in keys if pd.api.types.is_numeric_dtype(cells[k]) and cells[k].nunique() > 1]
    x = numeric[0] if numeric else keys[0]
    others = [k for k in keys if k != x and cells[k].nunique() > 1]
    paths = []
    for metric, part in cells.groupby("metric", sort=False):
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = part[others].astype(str).agg(", ".join, axis=1) if others else pd.Series("", index=part.index)
        for label, line in part.assign(_label=labels).groupby("_label", sort=True):
            line = line.sort_values(x)
            xs = line[x] if x in numeric else line[x].astype(str)
            err = [line["diff"] - line["low"], line["high"] - line["diff"]]
            drawn = ax.errorbar(xs, line["diff"], yerr=err, marker="", capsize=3, label=label or None)
            colour = drawn[0].get_color()
            significant = line["significant"].astype(bool).to_numpy()
            ax.scatter(xs[significant], line["diff"][significant], color=colour, zorder=3)
            ax.scatter(xs[~significant], line["diff"][~significant], facecolors="white", edgecolors=colour, zorder=3)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xlabel(x)
        ax.set_ylabel(f"{metric}: {names[0]} minus {names[1]}")
        ax.set_title(f"{metric}, paired difference with 95% interval (filled: significant)")
        if others:
            ax.legend(title=", ".join(others), fontsize="small")
        paths.append(_save(fig, Path(folder) / f"difference_{metric}.png"))
    return paths


# ---- many-shot in-context learning -----------------------------------------------------------

def icl_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model and shot count: accuracy (mean over permutations) and its 95% interval,
    taken over test examples (each example's mean outcome over the permutations)."""
    from .stats import mean_interval

    rows = []
    for (model, n), part in frame.groupby(["model", "n_shots"], sort=True):
        per_example = part.groupby("test_index")["correct"].mean().astype(float)
        mean, low, high = mean_interval(per_example.tolist())
        rows.append({"model": model, "n_shots": int(n), "accuracy": mean, "low": low, "high": high})
    return pd.DataFrame(rows)


def icl_accuracy_vs_shots(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Accuracy against the number of demonstrations: one line per model, 95% band."""
    curves = icl_curves(frame)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model, line in curves.groupby("model", sort=True):
        drawn = ax.plot(line["n_shots"], line["accuracy"], marker="o", label=str(model))
        ax.fill_between(line["n_shots"], line["low"], line["high"], color=drawn[0].get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(curves["n_shots"].unique()), [str(n) for n in sorted(curves["n_shots"].unique())])
    ax.set_ylim(0, 1)
    ax.set_xlabel("demonstrations (shots)")
    ax.set_ylabel("accuracy (mean over orders)")
    ax.set_title(f"{title}\nmany-shot ICL accuracy, 95% interval over test examples")
    ax.legend(fontsize="small")
    return _save(fig, Path(path))


def icl_permutation_spread(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Accuracy of each demonstration order, per shot count and model (box + points);
    the spread (best - worst) is the height of each box's whiskers."""
    accuracy = frame.groupby(["model", "n_shots", "permutation"], sort=True)["correct"].mean().reset_index()
    accuracy["correct"] = accuracy["correct"].astype(float)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * accuracy["n_shots"].nunique() + 3), 4.5))
    sns.boxplot(data=accuracy, x="n_shots", y="correct", hue="model", ax=ax, whis=(0, 100), fill=False)
    sns.stripplot(data=accuracy, x="n_shots", y="correct", hue="model", ax=ax, dodge=True, legend=False,
                  size=5, alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("demonstrations (shots)")
    ax.set_ylabel("accuracy of one order")
    orders = accuracy.groupby(["model", "n_shots"])["permutation"].nunique().max()
    ax.set_title(f"{title}\naccuracy over {orders} demonstration orders (whiskers: best to worst)")
    return _save(fig, Path(path))


def accuracy_vs_bits(rows: list[dict], path: Path, title: str) -> Path:
    """Zero-shot accuracy (the paper's metric, ±1 lm-eval stderr) against attention-logit
    bits, one line per model, one panel per benchmark; 16 bits (unquantized) on the left."""
    scores = pd.DataFrame([r for r in rows if r["metric"] == "score"])
    benchmarks = list(dict.fromkeys(scores["benchmark"]))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(4.2 * len(benchmarks), 3.8), squeeze=False, sharey=True)
    for ax, benchmark in zip(axes[0], benchmarks):
        for model, line in scores[scores["benchmark"] == benchmark].groupby("model", sort=True):
            line = line.sort_values("bits", ascending=False)
            ax.errorbar(line["bits"].astype(str), line["value"], yerr=line["stderr"].fillna(0.0), marker="o",
                        capsize=3, label=str(model))
        ax.set_title(benchmark)
        ax.set_xlabel("attention logit bits (16 = none)")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("accuracy (acc_norm for hellaswag)")
    axes[0][-1].legend(fontsize="small")
    fig.suptitle(f"{title}: accuracy vs absmax-quantized attention logits")
    return _save(fig, Path(path))


def outlier_layers(per_layer: list[dict], path: Path, title: str) -> Path:
    """Top-1 and median |x| per layer, attention logits and hidden states side by side (log scale)."""
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
    return _save(fig, Path(path))
