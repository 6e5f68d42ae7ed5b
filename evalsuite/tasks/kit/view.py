"""The depth x length view any length-swept task can declare (`view = DepthLengthView`).

Per facet (a value of each of the task's other group_by axes, e.g. needles and queries): a heatmap
of one run with depth as rows (0 at the top) and length as columns, every cell with its n; for a
pair of runs, both heatmaps side by side and their difference with significant cells marked; for
three or more models, a grid of every heatmap over its difference from the baseline. A task without
a depth axis gets one row per heatmap. Subclass to name the metric and words of the titles:

    class MyView(DepthLengthView):
        metric = "correct"                 # None: the task's primary metric, else its first
        metric_words = "answered right"    # the metric in titles
        item_words = "needle"              # what sits at the depth, on the depth axis's label

The grid functions (`depth_length_grid`, `sample_counts`, `paired_counts`, `significance_marks`,
`draw_difference`) serve views that draw their own figures. Drawing libraries are imported when
something is drawn, so that registering a task stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from evalsuite.contracts import TaskView

if TYPE_CHECKING:
    import matplotlib.pyplot as plt
    import pandas as pd

LENGTH, DEPTH = "context_length", "depth"
AXIS_LABELS = {LENGTH: "context length (tokens)", DEPTH: "depth (fraction of the context)"}
Facet = tuple[Any, ...]  # a value of each facet axis


def _with_depth(frame: pd.DataFrame) -> pd.DataFrame:
    return frame if DEPTH in frame.columns else frame.assign(**{DEPTH: "all"})


def depth_length_grid(frame: pd.DataFrame, metric: str, aggfunc: str = "mean") -> pd.DataFrame:
    """Mean of `metric` (or another `aggfunc`) with depth as rows (0 at the top) and length as columns."""
    grid = _with_depth(frame).pivot_table(index=DEPTH, columns=LENGTH, values=metric, aggfunc=aggfunc)
    return grid.sort_index().sort_index(axis=1)


def sample_counts(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per depth x length cell, the samples with a value of `metric` (what its mean is over)."""
    return depth_length_grid(frame, metric, "count")


def paired_counts(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per cell, the samples (joined on id) where both runs have a value of `metric`."""
    with_value_b = frame_b.loc[frame_b[metric].notna(), "id"]
    both = frame_a.assign(_paired=frame_a[metric].notna() & frame_a["id"].isin(with_value_b))
    return depth_length_grid(both, "_paired", "sum")


def significance_marks(cells: Sequence[Mapping[str, Any]], metric: str, facets: Sequence[str] = ()
                       ) -> dict[Facet, pd.DataFrame]:
    """Per facet, depth x length booleans: is the cell's paired difference significant?"""
    import pandas as pd

    rows = [r for r in cells if r["metric"] == metric]
    if not rows:
        return {}
    frame = _with_depth(pd.DataFrame(rows))
    parts = frame.groupby(list(facets)) if facets else [((), frame)]
    return {_plain_key(key): part.pivot(index=DEPTH, columns=LENGTH, values="significant") for key, part in parts}


def _plain_key(key: Any) -> Facet:
    values = key if isinstance(key, tuple) else (key,)
    return tuple(v.item() if hasattr(v, "item") else v for v in values)


def height(rows: int) -> float:
    """Inches for a heatmap of `rows` rows whose cells hold two lines (the value, then n)."""
    return 0.75 * rows + 2


def draw_cells(ax: plt.Axes, grid: pd.DataFrame, title: str, ylabel: str, diverging: bool = False,
               annot: pd.DataFrame | None = None, counts: pd.DataFrame | None = None) -> None:
    from evalsuite.analysis.plots import heatmap

    heatmap(grid, ax, title, AXIS_LABELS[LENGTH], ylabel, diverging, annot, counts)


def draw_difference(ax: plt.Axes, diff: pd.DataFrame, counts: pd.DataFrame, marks: pd.DataFrame | None,
                    alpha: float, title: str, ylabel: str = AXIS_LABELS[DEPTH]) -> None:
    """A difference heatmap, significant cells marked '*'; the title says what '*' means only when a cell has one."""
    annot = diff.map(lambda v: f"{v:+.2f}")
    aligned = (marks.reindex(index=diff.index, columns=diff.columns).fillna(False).astype(bool)
               if marks is not None else diff.isna() & False)
    annot = annot.where(~aligned, annot + "*")
    note = f"\n* p<{alpha:g}, McNemar" if aligned.to_numpy().any() else ""
    draw_cells(ax, diff, title + note, ylabel, diverging=True, annot=annot, counts=counts)


class DepthLengthView(TaskView):
    """Heatmaps over depth x length of one run, of a pair of runs and of several models beside one baseline."""

    axis_labels: ClassVar[Mapping[str, str]] = AXIS_LABELS
    metric: ClassVar[str | None] = None  # None: the task's primary metric, else its first
    metric_words: ClassVar[str] = ""  # the metric in titles ('': its name)
    item_words: ClassVar[str] = "item"  # what sits at the depth
    facets: ClassVar[tuple[str, ...] | None] = None  # None: the task's group_by less length and depth

    @property
    def scored(self) -> str:
        return self.metric or self.task.primary_metric or self.task.metrics[0]

    @property
    def facet_axes(self) -> tuple[str, ...]:
        return self.facets if self.facets is not None else tuple(
            a for a in self.task.group_by if a not in (LENGTH, DEPTH))

    @property
    def ylabel(self) -> str:
        return f"{self.item_words} {AXIS_LABELS[DEPTH]}"

    def facet_label(self, facet: Facet, short: bool = False) -> str:
        """A facet in a title ('' for a task without facets)."""
        return ", ".join(f"{axis}={value}" for axis, value in zip(self.facet_axes, facet))

    def facet_suffix(self, facet: Facet) -> str:
        return "".join(f"_{axis}{value}" for axis, value in zip(self.facet_axes, facet))

    def _titled(self, head: str, facet: Facet, short: bool = True) -> str:
        label = self.facet_label(facet, short)
        return f"{head}: {label}" if label else head

    def _facets(self, frame: pd.DataFrame) -> list[Facet]:
        axes = [a for a in self.facet_axes if a in frame.columns]
        return sorted({_plain_key(tuple(row)) for row in frame[axes].itertuples(index=False)}) if axes else [()]

    def _part(self, frame: pd.DataFrame, facet: Facet) -> pd.DataFrame:
        for axis, value in zip(self.facet_axes, facet):
            frame = frame[frame[axis] == value]
        return frame

    def _each(self, frame: pd.DataFrame, folder: Path, stem: str, draw: Callable[[Facet], plt.Figure]) -> list[Path]:
        from evalsuite.analysis.plots import save

        facets = self._facets(frame)
        return [save(draw(f), Path(folder) / f"{stem}{self.facet_suffix(f) if len(facets) > 1 else ''}.png")
                for f in facets]

    # ---- the TaskView hooks -----------------------------------------------------------------------

    def plots(self, frame: pd.DataFrame, run: Any, folder: Path, title: str) -> list[Path]:
        return self.heatmaps(frame, folder, title)

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Both models' heatmaps side by side and their difference, significant cells marked."""
        return self.pair_heatmaps(comparison.frame_a, comparison.frame_b, folder, comparison.names,
                                  marks=self.marks(comparison.cells), alpha=comparison.alpha)

    def grid_report(self, comparisons: Sequence[Any], folder: Path) -> list[Path]:
        """Every model's heatmap side by side, and below each its difference from the baseline."""
        return self.grid(comparisons, folder)

    # ---- the figures --------------------------------------------------------------------------------

    def marks(self, cells: Sequence[Mapping[str, Any]]) -> dict[Facet, pd.DataFrame]:
        return significance_marks(cells, self.scored, self.facet_axes)

    def heatmaps(self, frame: pd.DataFrame, folder: Path, title: str) -> list[Path]:
        """One depth x length heatmap per facet for a single model."""
        words = self.metric_words or self.scored

        def draw(facet: Facet) -> plt.Figure:
            part = self._part(frame, facet)
            grid = depth_length_grid(part, self.scored)
            fig, ax = _subplots(1, 1, (1.2 * grid.shape[1] + 3, height(grid.shape[0])))
            label = self.facet_label(facet)
            draw_cells(ax[0][0], grid, f"{title}\n{label + ', ' if label else ''}{words}", self.ylabel,
                       counts=sample_counts(part, self.scored))
            return fig

        return self._each(frame, folder, "heatmap", draw)

    def pair_heatmaps(self, frame_a: pd.DataFrame, frame_b: pd.DataFrame, folder: Path, names: tuple[str, str],
                      marks: pd.DataFrame | Mapping[Facet, pd.DataFrame] | None = None, alpha: float = 0.05
                      ) -> list[Path]:
        """Side by side heatmaps of two models, and the difference (a - b) heatmap. `marks`: depth x
        length booleans (significant cells), or such frames per facet, shown with a '*'."""
        from evalsuite.analysis.plots import save

        paths, metric, facets = [], self.scored, self._facets(frame_a)
        for facet in facets:
            suffix = self.facet_suffix(facet) if len(facets) > 1 else ""
            part_a, part_b = self._part(frame_a, facet), self._part(frame_b, facet)
            grid_a, grid_b = depth_length_grid(part_a, metric), depth_length_grid(part_b, metric)
            fig, axes = _subplots(1, 2, (2.4 * grid_a.shape[1] + 5, height(grid_a.shape[0])))
            for ax, grid, part, name in zip(axes[0], (grid_a, grid_b), (part_a, part_b), names):
                draw_cells(ax, grid, self._titled(name, facet), self.ylabel, counts=sample_counts(part, metric))
            paths.append(save(fig, Path(folder) / f"heatmap_pair{suffix}.png"))
            facet_marks = marks.get(facet) if isinstance(marks, Mapping) else marks
            fig, ax = _subplots(1, 1, (1.2 * grid_a.shape[1] + 3, height(grid_a.shape[0])))
            draw_difference(ax[0][0], grid_a - grid_b, paired_counts(part_a, part_b, metric), facet_marks, alpha,
                            self._titled(f"{names[0]} minus {names[1]}", facet), self.ylabel)
            paths.append(save(fig, Path(folder) / f"heatmap_diff{suffix}.png"))
        return paths

    def grid(self, comparisons: Sequence[Any], folder: Path) -> list[Path]:
        """Per facet, one figure: the top row holds every model's heatmap, the baseline first; the row
        below, each model's difference from the baseline (baseline minus model, the sign of its
        comparison folder), significant cells marked."""
        from evalsuite.analysis.plots import save

        frames = [comparisons[0].frame_a, *(c.frame_b for c in comparisons)]
        names = [comparisons[0].names[0], *(c.names[1] for c in comparisons)]
        metric, facets, paths = self.scored, self._facets(frames[0]), []
        for facet in facets:
            shape = depth_length_grid(self._part(frames[0], facet), metric).shape
            fig, axes = _subplots(2, len(frames), ((1.2 * shape[1] + 3) * len(frames), 2 * height(shape[0])))
            for ax, frame, name in zip(axes[0], frames, names):
                part = self._part(frame, facet)
                draw_cells(ax, depth_length_grid(part, metric), name, self.ylabel, counts=sample_counts(part, metric))
            axes[1][0].axis("off")
            axes[1][0].text(0.5, 0.5, f"baseline: {names[0]}\n\nbelow each model:\n{names[0]} minus that model",
                            ha="center", va="center", transform=axes[1][0].transAxes)
            for ax, comparison in zip(axes[1][1:], comparisons):
                part_a, part_b = self._part(comparison.frame_a, facet), self._part(comparison.frame_b, facet)
                marks = self.marks(comparison.cells).get(facet) if comparison.cells else None
                draw_difference(ax, depth_length_grid(part_a, metric) - depth_length_grid(part_b, metric),
                                paired_counts(part_a, part_b, metric), marks, comparison.alpha,
                                f"{names[0]} minus {comparison.names[1]}", self.ylabel)
            label = self.facet_label(facet)
            fig.suptitle(f"{len(frames)} models, baseline {names[0]}: {label + ', ' if label else ''}"
                         f"{self.metric_words or metric}")
            paths.append(save(fig, Path(folder) / f"heatmap_grid{self.facet_suffix(facet) if len(facets) > 1 else ''}.png"))
        return paths


def _subplots(rows: int, columns: int, size: tuple[float, float]) -> tuple[plt.Figure, Any]:
    """A figure of rows x columns axes (always a 2-D array), drawn with the analysis plots' file-only backend."""
    from evalsuite.analysis.plots import plt  # pyplot, its file-only backend selected first

    return plt.subplots(rows, columns, figsize=size, squeeze=False)
