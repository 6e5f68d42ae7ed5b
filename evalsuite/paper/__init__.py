"""A report shaped like the Differential Transformer paper, from the runs of the diff-paper suite.

    evalsuite report --paper RESULTS_DIR [--out paper-report.html] [--baseline MODEL]

writes one self-contained HTML page and a markdown file beside it (figures in a folder next to the
markdown) with the paper's sections in its order: multi-needle accuracy at 4K, the 64K heatmaps,
attention allocation, NLL by position, ICL against shots and its spread over orders,
hallucination, zero-shot accuracy against attention bits, outliers; then, beyond the paper and only
where the results hold them, the effective lengths and heatmaps of other length-swept entries (the
long-context suite's needle, nolima and ruler). Statistics come from
`analysis.frame`, `analysis.compare` and the task views; the paper's numbers from `published.py`.
No torch import.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError

from . import learning, modeling, retrieval
from .collect import PaperRuns, collect
from .render import keep_figures, markdown, page
from .sections import Section

BUILDERS = (retrieval.needle_4k, retrieval.needle_64k, retrieval.attention, modeling.nll, learning.icl,
            learning.icl_order, learning.hallucination, modeling.zeroshot, modeling.outliers)
EXTRAS = (retrieval.long_context,)  # beyond the paper, after its sections: shown when the results hold what they read


@dataclass(frozen=True)
class PaperReport:
    html: Path
    markdown: Path
    sections: tuple[Section, ...]


def build_sections(runs: PaperRuns, figures: Path) -> list[Section]:
    """Every section in the paper's order, then the extras that apply; figures are drawn into `figures`."""
    extras = (extra(runs, figures) for extra in EXTRAS)
    return [build(runs, figures) for build in BUILDERS] + [s for s in extras if s is not None]


def write_paper_report(results: str | Path, out: str | Path | None = None, baseline: str | None = None,
                       suite: str | None = None) -> PaperReport:
    """The paper report of the suite results in `results`: `out` (default RESULTS/paper-report.html) and
    the markdown file of the same name ending in .md."""
    runs = collect(results, baseline, suite)
    if len(runs.models) < 2:
        raise UserError(f"{results} holds one model's results ({runs.models[0]}); the paper report compares two "
                        "or more: run the suite with --model BASELINE --model DIFF")
    html_path = Path(out) if out is not None else Path(results) / "paper-report.html"
    if html_path.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {html_path}: give a file name ending in .html (the markdown goes beside it)")
    md_path = html_path.with_suffix(".md")
    with tempfile.TemporaryDirectory(prefix="evalsuite-paper-") as tmp:
        sections = build_sections(runs, Path(tmp))
        text = page(runs, sections)
        folder = html_path.parent / f"{html_path.stem}_figures"
        kept = [dataclasses.replace(s, figures=keep_figures(s.figures, folder)) for s in sections]
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(text, encoding="utf-8")
        md_path.write_text(markdown(runs, kept, folder, md_path) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {html_path}: {exc.strerror or exc}") from None
    return PaperReport(html=html_path, markdown=md_path, sections=tuple(kept))
