"""The ruler task's presentation: the task kit's depth x length view, one heatmap per sub-task of
lm-eval's score, each cell with its n; for a pair of runs, both heatmaps and their difference with
significant cells marked; for three or more models, the grid beside one baseline.

Only the needle sub-tasks have a depth. In a run that mixes them with others, the others' depth is
missing, and they are drawn as one row over length (their depth made the kit's "all").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.tasks.kit.view import DEPTH, DepthLengthView

if TYPE_CHECKING:
    import pandas as pd

NO_DEPTH = "all"  # the kit's one row of a task without depth


class RulerView(DepthLengthView):
    metric = "score"
    metric_words = "lm-eval's score"
    item_words = "answer needle"
    facets = ("subtask",)

    def plots(self, frame: pd.DataFrame, run: Any, folder: Path, title: str) -> list[Path]:
        return super().plots(without_missing_depth(frame), run, folder, title)

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        return super().pair_report(filled(comparison), folder)

    def grid_report(self, comparisons: Sequence[Any], folder: Path) -> list[Path]:
        return super().grid_report([filled(c) for c in comparisons], folder)


def without_missing_depth(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the missing depth of sub-tasks that have none made the kit's one row."""
    if DEPTH not in frame.columns or not frame[DEPTH].isna().any():
        return frame
    return frame.assign(**{DEPTH: frame[DEPTH].astype(object).where(frame[DEPTH].notna(), NO_DEPTH)})


def filled(comparison: Any) -> Any:
    """A comparison whose frames and cells say `all` where a sub-task has no depth."""
    cells = [_cell(c) for c in comparison.cells] if comparison.cells else comparison.cells
    return dataclasses.replace(comparison, frame_a=without_missing_depth(comparison.frame_a),
                               frame_b=without_missing_depth(comparison.frame_b), cells=cells)


def _cell(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    depth = cell.get(DEPTH)
    missing = depth is None or (isinstance(depth, float) and math.isnan(depth))
    return {**cell, DEPTH: NO_DEPTH} if missing else cell
