"""The viewer's page: viewer.html (shipped with the package) with the data embedded as JSON."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from evalsuite.analysis.html import write_page_file

from .data import collect

DATA_MARK = "__EVALSUITE_VIEW_DATA__"


def template() -> str:
    return resources.files("evalsuite.viewer").joinpath("viewer.html").read_text(encoding="utf-8")


def embedded_json(data: Any) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' can end it early
    (JSON strings carry them as \\u escapes, which read back as the same characters)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: Any) -> str:
    page = template()
    head, mark, tail = page.partition(DATA_MARK)
    assert mark, "viewer.html has lost its data mark"
    return head + embedded_json(data) + tail


def write_page(results: str | Path, out_file: str | Path) -> Path:
    """One self-contained HTML file for the results folder: data and images inside it."""
    return write_page_file(out_file, render(collect(results, embed_images=True, page=Path(out_file))))
