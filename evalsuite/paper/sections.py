"""A paper report's sections, in the paper's order, and the table shape they share.

Each section shows the user's models (the baseline first) with 95% intervals, each other model
minus the baseline with its paired test, the paper's published numbers beside them (labelled as
the paper's, with where the paper gives them) and one line that reads the comparison. A section
whose runs are absent says so in one line (and why, when the suite skipped them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from evalsuite.runs.records import RunFolder

from .collect import PaperRuns
from .measures import Estimate, Key, Paired, estimates, paired, reading
from .published import DIFF, GAIN, TRANSFORMER, Published, published

PAPER_COLUMNS = (TRANSFORMER, DIFF, GAIN)


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    key: str
    title: str
    readings: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    published: list[Published] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    absent: str | None = None


@dataclass(frozen=True)
class Cells:
    """What a table of cells is made from: the axes, the metric, how a cell is named, and which
    published number (if any) stands beside it."""

    keys: Sequence[str]
    metric: str
    label: Callable[[Key], str]
    paper: Callable[[Key], Published | None] = lambda key: None
    lower_is_better: bool = False
    digits: int = 3
    metric_of: Callable[[RunFolder], str] | None = None  # a metric named per run (a judge's)


def named(text: str) -> Callable[[Key], str]:
    """A cell label that is the same text for every cell (a table of one row per entry)."""
    return lambda cell: text


def beside(item: Published | None, where: Callable[[Key], bool] = lambda cell: True
           ) -> Callable[[Key], Published | None]:
    """The published number shown beside the cells for which `where` holds."""
    return lambda cell: item if where(cell) else None


def paper_text(item: Published | None, column: str) -> str:
    if item is None or column not in item.values:
        return ""
    return item.text(column)


class Built(NamedTuple):
    table: Table
    readings: list[str]  # one line per model compared with the baseline
    tests: dict[str, dict[Key, Paired]]  # model -> cell -> its paired test against the baseline


def cell_table(title: str, runs: Sequence[tuple[str, RunFolder]], cells: Cells, what: str) -> Built:
    """Rows: a cell's label, each model's mean [95% interval], each other model minus the baseline
    (interval, p), and the paper's numbers; with one reading line per model compared."""
    metric_for = cells.metric_of or (lambda run: cells.metric)
    by_model = {model: estimates(run, cells.keys, metric_for(run)) for model, run in runs}
    (base_name, base_run), others = runs[0], runs[1:]
    tests = {model: paired(base_run, run, cells.keys, metric_for(base_run)) for model, run in others}
    keys = sorted({key for found in by_model.values() for key in found}, key=_sortable)
    papers = [cells.paper(key) for key in keys]
    columns = [c for c in PAPER_COLUMNS if any(p is not None and c in p.values for p in papers)]
    header = ["", *(f"{m} (95% CI)" for m, _ in runs), *(f"{m} − {base_name} (95% CI, p)" for m, _ in others),
              *(f"paper {c}" for c in columns)]
    rows = []
    for key, paper in zip(keys, papers):
        row = [cells.label(key)]
        row += [by_model[m].get(key, Estimate(float("nan"), float("nan"), float("nan"), 0)).text(cells.digits)
                for m, _ in runs]
        row += [_test_text(tests[m].get(key), cells.digits) for m, _ in others]
        row += [paper_text(paper, c) for c in columns]
        rows.append(row)
    readings = [reading(m, base_name, tests[m], what, cells.lower_is_better) for m, _ in others]
    return Built(Table(title, header, rows), readings, tests)


def _test_text(test: Paired | None, digits: int) -> str:
    return "n/a" if test is None else test.text(digits)


def _sortable(key: Key) -> tuple[Any, ...]:
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)


def absent(key: str, title: str, runs: PaperRuns, entries: Sequence[str]) -> Section:
    """The one line of a section whose runs are not in the results."""
    why = [f"{name}: {runs.skipped[name]}" for name in entries if name in runs.skipped]
    line = "not run" + (f" (skipped by the suite: {'; '.join(why)})" if why else
                        f": no run of {' / '.join(entries)} in these results")
    return Section(key=key, title=title, absent=line, published=published(key))


def two_models(runs: PaperRuns, entry: str) -> list[tuple[str, RunFolder]] | None:
    """(model, run) of an entry, baseline first, when at least two models ran it."""
    found = runs.models_of(entry)
    return found if len(found) >= 2 else None

