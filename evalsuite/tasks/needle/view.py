"""The needle task's presentation: the kit's depth x length view (heatmaps with n per cell, pair and
difference with significant cells marked, the grid of several models), one figure per (N, R)
setting, and the HTML report's worst samples with their needles marked.

The functions below are the view's figures and grids with the needle's defaults (metric
`correct_all`, settings by N and R), for the paper report and the attention task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from evalsuite.tasks.kit import view as kit
from evalsuite.tasks.kit.marked import PROMPT_LIMIT as PROMPT_LIMIT
from evalsuite.tasks.kit.marked import mark as mark
from evalsuite.tasks.kit.marked import marked_prompt
from evalsuite.tasks.kit.view import DepthLengthView
from evalsuite.tasks.kit.view import height as height

if TYPE_CHECKING:
    import matplotlib.pyplot as plt
    import pandas as pd

METRIC = "correct_all"  # the strict metric: every query right
SETTINGS = ("n_needles", "n_queries")  # a figure per (N, R) setting
AXIS_LABELS = {**kit.AXIS_LABELS, "n_needles": "needles (N)", "n_queries": "queries (R)"}
NEEDLE = "The magic number of {city} is {number}."  # the task hides these; the view marks them


def needle_sentences(data: Mapping[str, Any]) -> list[str]:
    """A sample's needle sentences (from its `data`), the queried ones first."""
    return [NEEDLE.format(city=c, number=x) for c, x in zip(data["cities"], data["numbers"])]


class NeedleView(DepthLengthView):
    """Heatmaps per (N, R) setting of one run, of a pair of runs and of several models beside one
    baseline, and the worst samples with their needles marked."""

    axis_labels = AXIS_LABELS
    metric: ClassVar[str | None] = METRIC
    metric_words: ClassVar[str] = "all queries correct"
    item_words: ClassVar[str] = "answer needle"
    facets: ClassVar[tuple[str, ...] | None] = SETTINGS

    def facet_label(self, facet: kit.Facet, short: bool = False) -> str:
        n, r = facet
        return f"N={n}, R={r}" if short else f"N={n} needles, R={r} queries"

    def facet_suffix(self, facet: kit.Facet) -> str:
        return "_N{}_R{}".format(*facet)

    def html_samples(self, records: Sequence[Any]) -> str:
        # the plan is a function of the parameters alone: no haystack is loaded to rebuild it
        return html_samples(records, list(self.task.plan(None)))


# ---- the view's grids and figures with the needle's defaults --------------------------------------------


def depth_length_grid(frame: pd.DataFrame, metric: str = METRIC, aggfunc: str = "mean") -> pd.DataFrame:
    return kit.depth_length_grid(frame, metric, aggfunc)


def sample_counts(frame: pd.DataFrame, metric: str = METRIC) -> pd.DataFrame:
    return kit.sample_counts(frame, metric)


def paired_counts(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str = METRIC) -> pd.DataFrame:
    return kit.paired_counts(frame_a, frame_b, metric)


def significance_marks(cells: Sequence[Mapping[str, Any]], metric: str = METRIC
                       ) -> dict[tuple[int, int], pd.DataFrame]:
    """Per (N, R) setting, depth x length booleans: is the cell's paired difference significant?"""
    return kit.significance_marks(cells, metric, SETTINGS)  # keys: (N, R)


def draw_difference(ax: plt.Axes, diff: pd.DataFrame, counts: pd.DataFrame, marks: pd.DataFrame | None,
                    alpha: float, title: str) -> None:
    kit.draw_difference(ax, diff, counts, marks, alpha, title, NeedleView(None).ylabel)


def needle_heatmaps(frame: pd.DataFrame, folder: Path, title: str) -> list[Path]:
    """One depth x length accuracy heatmap per (N, R) setting for a single model."""
    return NeedleView(None).heatmaps(frame, folder, title)


def needle_pair_heatmaps(frame_a: pd.DataFrame, frame_b: pd.DataFrame, folder: Path, names: tuple[str, str],
                         marks: pd.DataFrame | dict[tuple[int, int], pd.DataFrame] | None = None,
                         alpha: float = 0.05) -> list[Path]:
    """Side by side heatmaps of two models and the difference (a - b) heatmap, significant cells marked."""
    return NeedleView(None).pair_heatmaps(frame_a, frame_b, folder, names, marks, alpha)


def needle_grid(comparisons: Sequence[Any], folder: Path) -> list[Path]:
    """Per (N, R) setting, every model's heatmap over its difference from the baseline."""
    return NeedleView(None).grid(comparisons, folder)


# ---- the HTML report: needles marked in text -----------------------------------------------------------------

def html_samples(records: Sequence[Any], planned: Sequence[Any]) -> str:
    """The worst needle samples: needle sentences rebuilt from the plan, the queried ones first."""
    from evalsuite.analysis.html import esc, key_values, lowest

    failed = [r for r in records if r.error or not r.scores.get("correct_mean", 0) >= 1]
    worst = lowest(failed, ("correct_all", "correct_mean"))
    if not worst:
        return "<h3>Worst samples</h3><p class='ok'>Every sample was answered correctly.</p>"
    by_id = {s.id: s for s in planned}
    parts = [f"<h3>Worst samples</h3><p>The {len(worst)} lowest-scoring samples; needle sentences are "
             "rebuilt from the sample plan (seeded), the queried ones first.</p>"]
    for record in worst:
        sample = by_id.get(record.id)
        needles = needle_sentences(sample.data) if sample else []
        axes, info = record.axes, record.info
        facts = {"context length (requested)": axes.get("context_length"), "prompt tokens": info.get("prompt_tokens"),
                 "depth (requested)": axes.get("depth"), "depth (measured)": info.get("measured_depth"),
                 "answer needle at token": info.get("answer_token"),
                 "needles N / queries R": f"{axes.get('n_needles')} / {axes.get('n_queries')}",
                 "expected": ", ".join(record.target), "produced": " | ".join(map(str, record.outputs)),
                 "scores": json.dumps(dict(record.scores)), "error": record.error or ""}
        queried = needles[: int(axes.get("n_queries", 1))]
        needle_html = "<br>".join(f"<mark>{esc(n)}</mark>" + (" (queried)" if n in queried else "")
                                  for n in needles) or "<i>not in this installation's plan</i>"
        parts.append(f"<h4>{esc(record.id)}</h4>" + key_values(facts) + f"<p>Needles: {needle_html}</p>")
        texts = record.prompt.get("text") if isinstance(record.prompt, Mapping) else None
        if texts:
            parts.append("<details><summary>prompt with the needles marked</summary><pre>"
                         + marked_prompt(str(texts[0]), needles) + "</pre></details>")
    return "\n".join(parts)
