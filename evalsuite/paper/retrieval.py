"""Sections of retrieval: multi-needle accuracy at 4K, the 64K heatmaps with each model's effective
length, attention allocation, and the long-context entries (any length-swept task: nolima, ruler...)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evalsuite.analysis.compare import Comparison, compare
from evalsuite.analysis.effective_length import words
from evalsuite.analysis.effective_text import rule
from evalsuite.analysis.task_of import installed_task
from evalsuite.runs.records import RunFolder

from .collect import PaperRuns
from .measures import Key, estimates
from .published import Published, published
from .sections import Cells, Section, Table, absent, beside, cell_table, two_models

TITLES = {
    "needle-4k": "Multi-needle retrieval at 4K",
    "needle-64k": "Needle retrieval up to 64K: depth × length",
    "attention": "Attention allocation",
    "long-context": "Long context beyond the paper: effective length",
}


PAPER_RULE, STRICT = "correct_all_substring", "correct_all"
RULES_NOTE = (f"the paper's rule ({PAPER_RULE}, beside its numbers): a sample is correct when the digits of every one "
              f"of its R magic numbers appear in the greedy answer; strict ({STRICT}): the answer gives each queried "
              "city exactly one number, the needle's (a swapped pair or a list of every number is wrong)")


def _by_label(section: str) -> dict[str, Published]:
    return {p.label: p for p in published(section)}


def needle_4k(runs: PaperRuns, figures: Path) -> Section:
    """Accuracy (every query right) per (N, R) setting, over all depths."""
    key = "needle-4k"
    found = two_models(runs, key)
    if found is None:
        return absent(key, TITLES[key], runs, [key])
    paper = _by_label(key)

    def label(cell: Key) -> str:
        return f"N={cell[0]}, R={cell[1]}"

    # beside the paper's numbers, the paper's rule (the digits appear in the answer); strict below, named so
    cells = Cells(keys=("n_needles", "n_queries"), metric=PAPER_RULE, label=label,
                  paper=lambda cell: paper.get(label(cell)))
    table, readings, _ = cell_table(f"accuracy over all depths, the paper's substring rule ({PAPER_RULE})", found,
                                    cells, "(N, R) settings")
    strict, _, _ = cell_table(f"the same, strict scoring ({STRICT})",
                              found, Cells(keys=cells.keys, metric=STRICT, label=label), "(N, R) settings")
    lengths = sorted({int(n) for _, run in found for n in run.read_config()["params"].get("lengths", [])})
    title = TITLES[key] if lengths == [4096] else f"Multi-needle retrieval at {_tokens(lengths)} (the paper's: 4K)"
    return Section(key=key, title=title, readings=readings, tables=[table, strict], published=published(key),
                   notes=[f"context length {', '.join(map(str, lengths))} tokens", RULES_NOTE])


def needle_64k(runs: PaperRuns, figures: Path) -> Section:
    """Accuracy per length (over depths) and the depth × length heatmaps of every model."""
    from evalsuite.tasks.needle.view import needle_grid

    key = "needle-64k"
    found = two_models(runs, key)
    if found is None:
        return absent(key, TITLES[key], runs, [key])
    longest = max(int(n) for _, run in found for n in run.read_config()["params"]["lengths"])
    paper = _by_label(key)

    def paper_of(cell: Key) -> Published | None:
        return paper["average at 64K"] if cell[0] == 65536 else None

    cells = Cells(keys=("context_length",), metric=PAPER_RULE, label=lambda cell: f"{cell[0]} tokens",
                  paper=paper_of)
    table, readings, _ = cell_table(f"accuracy per length, over all depths, the paper's substring rule ({PAPER_RULE})",
                                    found, cells, "lengths")
    strict, _, _ = cell_table(f"the same, strict scoring ({STRICT})", found,
                              Cells(keys=cells.keys, metric=STRICT, label=cells.label), "lengths")
    depth_cells = Cells(keys=("context_length", "depth"), metric=PAPER_RULE,
                        label=lambda cell: f"{cell[0]} tokens, depth {cell[1]:.2f}",
                        paper=lambda cell: paper["25% depth at 64K"] if cell == (65536, 0.25) else None)
    depth_table, _, _ = cell_table(f"accuracy per length and depth, the paper's substring rule ({PAPER_RULE})",
                                   found, depth_cells, "cells")
    comparisons = [compare(found[0][1].path, run.path) for _, run in found[1:]]
    folder = figures / key
    folder.mkdir(parents=True, exist_ok=True)
    drawn = needle_grid(comparisons, folder) if len(comparisons) > 1 else _pair_figures(comparisons[0], folder)
    effective = effective_table(comparisons, f"effective length, strict scoring ({STRICT})")
    notes = [f"the longest length run: {longest} tokens", RULES_NOTE,
             f"the heatmaps show strict scoring ({STRICT})"] + runs.notes.get(key, [])
    title = TITLES[key] if longest == 65536 else f"Needle retrieval up to {_tokens([longest])}: depth × length " \
        "(the paper's: 64K)"
    tables = [table, strict, depth_table] + ([effective] if effective is not None else [])
    return Section(key=key, title=title, readings=readings, tables=tables, figures=drawn, published=published(key),
                   notes=notes)


def effective_table(comparisons: Sequence[Comparison], title: str) -> Table | None:
    """Each model's effective length with its 95% interval and its base score with n (baseline first), and
    each other model minus the baseline with its paired interval, beside the paired test of their base
    scores (analysis/effective_length.py); None for a sweep of one length."""
    found = [c for c in comparisons if c.effective is not None]
    if not found:
        return None
    first = found[0].effective
    assert first is not None
    rows = [[found[0].names[0], first.a.text(), first.a.base_text()]]
    rows += [[c.names[1], c.effective.b.text(), c.effective.b.base_text()] for c in found if c.effective]
    rows += [[f"{c.names[1]} − {c.names[0]}", c.effective.text(negated=True), c.effective.base_difference(negated=True)]
             for c in found if c.effective]
    header = ["", "effective length (95% CI)",
              f"base score (n): {first.a.metric} at {words(first.a.base_lengths)} tokens"]
    return Table(f"{title}: {rule(first.a)}", header, rows)


def long_context(runs: PaperRuns, figures: Path) -> Section | None:
    """Every other length-swept entry run by two or more models (the long-context suite's needle, nolima
    and ruler entries): its effective lengths and its task view's depth × length heatmaps (None: none)."""
    key = "long-context"
    tables, drawn, notes, readings = [], [], [], []
    for entry in runs.runs:
        found = two_models(runs, entry) if entry not in TITLES else None
        if found is None:
            continue
        comparisons = [compare(found[0][1].path, run.path) for _, run in found[1:]]
        table = effective_table(comparisons, f"{entry} ({comparisons[0].task})")
        if table is None:
            continue
        tables.append(table)
        readings += [f"{entry}: {c.names[1]} − {c.names[0]}, {c.effective.text(negated=True)} (base score "
                     f"{c.effective.base_difference(negated=True)})" for c in comparisons if c.effective is not None]
        notes += runs.notes.get(entry, [])
        task = installed_task(found[0][1])
        if task is not None:  # the heatmaps its view draws of the pair, or of every model beside the baseline
            folder = figures / key / entry
            folder.mkdir(parents=True, exist_ok=True)
            view = task.view(task)
            drawn += view.grid_report(comparisons, folder) if len(comparisons) > 1 else \
                view.pair_report(comparisons[0], folder)
    if not tables:
        return None
    return Section(key=key, title=TITLES[key], readings=readings, tables=tables, figures=drawn, notes=notes)


def _tokens(lengths: list[int]) -> str:
    """The lengths a section ran at, for its heading: a 512-token run is not headed "at 4K"."""
    return ", ".join(f"{n:,}" for n in lengths) + " tokens"


def _pair_figures(comparison: Comparison, folder: Path) -> list[Path]:
    """Two models: both heatmaps side by side, and the difference with its significant cells marked."""
    from evalsuite.tasks.needle.view import needle_pair_heatmaps, significance_marks

    marks = significance_marks(comparison.cells) if comparison.cells else None
    return needle_pair_heatmaps(comparison.frame_a, comparison.frame_b, folder, comparison.names, marks=marks)


def attention(runs: PaperRuns, figures: Path) -> Section:
    """Share of attention on the answer span and on the rest of the context, by answer depth."""
    key = "attention"
    found = two_models(runs, key)
    if found is None:
        return absent(key, TITLES[key], runs, [key])
    paper = _by_label(key)
    tables, readings = [], []
    for metric, label, lower in (("answer_share", "answer span", False), ("noise_share", "noise context", True)):
        cells = Cells(keys=("depth",), metric=metric, label=lambda cell: f"depth {cell[0]:.2f}",
                      paper=beside(paper[label]), lower_is_better=lower)
        table, lines, _ = cell_table(f"attention on the {label}, by answer depth", found, cells, "depths")
        tables.append(table)
        readings += [f"{label}: {line}" for line in lines]
    notes = ["shares of the attention from the answer positions (BOS and the query excluded), averaged over layers "
             "and heads; DIFF maps are the differential map normalised by 1 − λ; the paper gives a range over depths, "
             "shown on every depth's row", _answer_rows(found)] + _negative_noise(found)
    return Section(key=key, title=TITLES[key], readings=readings, tables=tables, published=published(key),
                   notes=notes)


def _answer_rows(found: list[tuple[str, RunFolder]]) -> str:
    """Which rows the attention tables read: the reference answer fed teacher-forced (the default), or
    each model's own generated answer as the paper reads it."""
    modes = {str(run.read_config()["params"].get("query_positions", "answer")) for _, run in found}
    if modes == {"generated"}:
        return ("the answer positions are those of the answer each model generated (-T query_positions=generated), "
                "as the paper reads them")
    if modes == {"answer"}:
        return ("the answer positions are the needle's answer tokens fed teacher-forced after the question (the "
                "reference answer), where the paper reads the tokens the model generated: a model that answers "
                "wrongly is still measured on the right answer; -T query_positions=generated reads the paper's rows "
                "(docs/attention.md)")
    return f"the rows read are -T query_positions={', '.join(sorted(modes))} (docs/attention.md)"


def _negative_noise(found: list[tuple[str, RunFolder]]) -> list[str]:
    """A negative noise share (a differential map whose λ exceeds 1 takes more than it gives) is flagged:
    the paper's shares lie in [0, 1], so it cannot stand beside them as a share."""
    notes = []
    for model, run in found:
        below = [f"{cell[0]:.2f}" for cell, e in estimates(run, ("depth",), "noise_share").items() if e.mean < 0]
        if below:
            notes.append(f"NEGATIVE noise share for {model} at depth {', '.join(below)}: its λ exceeds 1 in some "
                         "layer, so its differential map is negative on the context; not a share in [0, 1] like "
                         "the paper's")
    return notes
