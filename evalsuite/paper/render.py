"""The paper report as one self-contained HTML page (figures embedded) and as markdown."""

from __future__ import annotations

import html as html_lib
import shutil
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from evalsuite.analysis.frame import ERRORS_RULE
from evalsuite.analysis.html import STYLE, image, table
from evalsuite.analysis.tables import markdown as markdown_table
from evalsuite.version import __version__

from .collect import PaperRuns
from .published import PAPER_PLACES, STATEMENTS, Published
from .sections import Section

PAPER = ('"Differential Transformer", Ye, Dong, Xia, Sun, Zhu, Huang, Wei, ICLR 2025 (arXiv 2410.05258); '
         "published numbers are for its 3B models")
EXTRA_STYLE = """
.reading { font-weight: bold; } .absent { color: #666; font-style: italic; }
.paper th { background: #fff4e0; } .notes { color: #444; font-size: 0.9em; }
"""


def _published_rows(items: Sequence[Published]) -> list[list[str]]:
    rows = []
    for item in items:
        values = "; ".join(f"{column} {item.text(column)}" for column in item.values)
        rows.append([item.label, values, item.unit, item.cite])
    return rows


PUBLISHED_HEADER = ["setting", "the paper's value", "unit", "where the paper gives it"]


def heading(section: Section) -> str:
    """A section's title and the table or figure of the paper it answers."""
    place = PAPER_PLACES.get(section.key)
    return section.title if place is None else f"{section.title} (answers the paper's {place})"


def intro(runs: PaperRuns) -> list[str]:
    """Lines saying what was compared with what."""
    others = ", ".join(runs.models[1:])
    return [f"suite {runs.suite}: baseline {runs.baseline}, compared with {others}",
            f"source of the published numbers: {PAPER}",
            "intervals: 95% (Wilson for pass/fail rates, Student t otherwise); differences: each model minus the "
            "baseline on paired samples with a 95% paired bootstrap interval and a two-sided p (exact McNemar for "
            "pass/fail, sign-flip permutation otherwise); * marks p < 0.05, without correction across cells",
            f"errored samples: {ERRORS_RULE}; n counts scored and errored samples"]


def run_first(sections: Sequence[Section]) -> tuple[list[Section], list[Section]]:
    """(the sections with results, in the paper's order; those not run): a folder of one part of
    the paper (the long-context suite's) opens with what it measured, not with lines of "not run"."""
    return [s for s in sections if s.absent is None], [s for s in sections if s.absent is not None]


NOT_RUN = "Not in these results"


def markdown(runs: PaperRuns, sections: Sequence[Section], figures_dir: Path, md_path: Path) -> str:
    lines = [f"# The Differential Transformer paper's evaluations: {', '.join(runs.models)}", ""]
    lines += [f"- {line}" for line in intro(runs)] + [""]
    measured, absent = run_first(sections)
    for number, section in enumerate(measured, 1):
        lines += [f"## {number}. {heading(section)}", ""]
        lines += [f"**Reading:** {'; '.join(section.readings) or 'nothing to compare'}", ""]
        for tab in section.tables:
            lines += [f"{tab.title}:", "", markdown_table(tab.header, tab.rows), ""]
        for figure in section.figures:
            relative = figure.relative_to(figures_dir.parent) if figure.is_relative_to(figures_dir.parent) else figure
            lines += [f"![{section.title}]({relative.as_posix()})", ""]
        lines += [f"- {note}" for note in section.notes] + ([""] if section.notes else [])
        if section.key in STATEMENTS:
            lines += [f"The paper: {STATEMENTS[section.key]}", ""]
        if section.published:
            lines += ["The paper's numbers (3B models):", "",
                      markdown_table(PUBLISHED_HEADER, _published_rows(section.published)), ""]
    if absent:
        lines += [f"## {NOT_RUN}", ""] + [f"- {heading(s)}: _{s.absent}_" for s in absent] + [""]
    return "\n".join(lines)


def page(runs: PaperRuns, sections: Sequence[Section]) -> str:
    esc = html_lib.escape
    measured, absent = run_first(sections)
    contents = "".join(f'<li><a href="#{esc(s.key)}">{esc(heading(s))}</a></li>' for s in measured)
    if absent:
        contents += f'<li><a href="#not-run">{esc(NOT_RUN)}</a> ({len(absent)})</li>'
    body = []
    for number, section in enumerate(measured, 1):
        body.append(f'<h2 id="{esc(section.key)}">{number}. {esc(heading(section))}</h2>')
        body.append(f'<p class="reading">{esc("; ".join(section.readings) or "nothing to compare")}</p>')
        for tab in section.tables:
            body.append(f"<p>{esc(tab.title)}</p>" + table(tab.header, tab.rows))
        body += [image(figure) for figure in section.figures]
        if section.notes:
            body.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in section.notes) + "</ul>")
        if section.key in STATEMENTS:
            body.append(f'<p class="notes">The paper: {esc(STATEMENTS[section.key])}</p>')
        if section.published:
            body.append('<div class="paper"><p>The paper\'s numbers (3B models):</p>'
                        + table(PUBLISHED_HEADER, _published_rows(section.published)) + "</div>")
    if absent:
        body.append(f'<h2 id="not-run">{esc(NOT_RUN)}</h2><ul>' + "".join(
            f'<li id="{esc(s.key)}">{esc(heading(s))}: <span class="absent">{esc(s.absent or "")}</span></li>'
            for s in absent) + "</ul>")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Differential Transformer paper report: {esc(', '.join(runs.models))}</title>",
        f"<style>{STYLE}{EXTRA_STYLE}</style></head><body>",
        f"<h1>The Differential Transformer paper's evaluations</h1><p>evalsuite {esc(__version__)}, {stamp}</p>",
        "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in intro(runs)) + "</ul>",
        f"<ol>{contents}</ol>", *body, "</body></html>",
    ])


def keep_figures(figures: Sequence[Path], folder: Path) -> list[Path]:
    """Copies of the figures beside the markdown file (the HTML page embeds its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    kept = []
    for figure in figures:
        target = folder / f"{figure.parent.name}_{figure.name}"
        shutil.copyfile(figure, target)
        kept.append(target)
    return kept
