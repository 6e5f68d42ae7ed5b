"""The rows of a paired comparison as text: markdown, LaTeX (booktabs) and CSV, from one set of cells."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def p_text(p: float) -> str:
    if isinstance(p, float) and math.isnan(p):
        return "n/a"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def display_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], names: tuple[str, str]
                 ) -> tuple[list[str], list[list[str]]]:
    """Header and text cells shared by the markdown, HTML and LaTeX tables."""
    keys = [k for k in keys if any(k in row for row in rows)]
    header = [*keys, "metric", "n", names[0], names[1], "difference [95% CI]", "test", "p", "significant"]
    body = []
    for row in rows:
        test = row["test"]
        if "a_only" in row:
            test += f" ({row['a_only']}/{row['b_only']} discordant)"
        diff = f"{row['diff']:+.3f} [{_number(row['low'])}, {_number(row['high'])}]" if row["n"] else "n/a"
        # fewer than two paired samples (or clusters): the test column says so, and nothing is "no"
        significant = "n/a" if _missing(row["p_value"]) else "yes" if row["significant"] else "no"
        body.append([*(str(row.get(k)) for k in keys), row["metric"], str(row["n"]), _number(row["mean_a"]),
                     _number(row["mean_b"]), diff, test, p_text(row["p_value"]), significant])
    return header, body


def markdown(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A markdown table: every table the package writes (reports, comparisons, the paper, trackers)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in cells) + " |" for cells in body]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A value as one cell: a "|" or a line break inside it would break the table's row."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex(header: Sequence[str], body: Sequence[Sequence[str]], caption: str) -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""
    lines = [r"\begin{table}[ht]", r"\centering", r"\begin{tabular}{" + "l" * len(header) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(c) for c in cells) + r" \\" for cells in body]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(caption)}}}", r"\end{table}"]
    return "\n".join(lines)


CSV_COLUMNS = ["metric", "test", "n", "mean_a", "mean_b", "diff", "low", "high", "p_value", "significant",
               "a_only", "b_only"]


def csv_frame(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> pd.DataFrame:
    keys = [k for k in keys if any(k in row for row in rows)]
    return pd.DataFrame(list(rows), columns=[*keys, *CSV_COLUMNS])
