"""One self-contained HTML page for a set of finished runs.

For every run: its configuration and fingerprints, the task's table (rate,
95% interval, n per cell), the task's plots, and the worst samples (the
`html_samples` of the task's view when it shows them, else a generic table of
the lowest-scoring records). Runs of the same task configuration are also
compared pairwise.
Images are embedded as base64 PNG, so the page is one file that opens
anywhere; plots are drawn into a temporary folder, never into the run folders.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from evalsuite.analysis.task_of import installed_task, task_spec
from evalsuite.errors import UserError
from evalsuite.runs.identity import identity_difference, task_identity
from evalsuite.runs.records import Record, RunFolder, open_run
from evalsuite.runs.view import ReadOnlyRun
from evalsuite.version import __version__

from .compare import compare, comparison_plots
from .frame import run_frame, summarize
from .report import format_rate, view_plots
from .side_scores import scored_records, side_metrics
from .tables import display_rows

WORST = 10  # samples shown per run

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
img.plot { max-width: 100%; display: block; margin: 0.5em 0; border: 1px solid #ddd; }
pre { white-space: pre-wrap; word-break: break-word; background: #f8f8f8; padding: 0.5em; max-height: 30em;
      overflow: auto; }
mark { background: #ffe066; font-weight: bold; }
.fail { color: #b00020; } .ok { color: #1b5e20; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def key_values(mapping: Mapping[str, Any]) -> str:
    return table(["key", "value"], [[k, json.dumps(v) if isinstance(v, (list, dict)) else v]
                                    for k, v in mapping.items()])


def image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img class="plot" alt="{esc(path.name)}" src="data:image/png;base64,{data}">'


# ---- sections ---------------------------------------------------------------------------------

def config_section(config: Mapping[str, Any]) -> str:
    parts = ["<h3>Configuration</h3>",
             f"<p>config hash (fingerprint of task, parameters, limit and model): "
             f"<code>{esc(config.get('hash'))}</code>; git commit <code>{esc(config.get('git_commit'))}</code>; "
             f"limit {esc(config.get('limit'))}; "
             f"prompts logged: {esc(config.get('log_prompts', False))}</p>",
             "<h4>Task parameters</h4>", key_values(config.get("params", {})),
             "<h4>Model fingerprint</h4>", key_values(config.get("model", {})),
             "<h4>Versions</h4>", key_values(config.get("versions", {}))]
    return "\n".join(parts)


def results_section(frame: pd.DataFrame, group_by: Sequence[str], metrics: Sequence[str]) -> str:
    keys = [k for k in group_by if k in frame.columns]
    present = [m for m in metrics if m in frame.columns]
    header = [*keys, *(f"{m} (95% CI)" for m in present), "n", "errors"]
    rows = []
    for row in [*summarize(frame, (), present), *(summarize(frame, keys, present) if keys else [])]:
        rows.append([*(row.get(k, "all") for k in keys),
                     *(format_rate(row.get(m), row.get(f"{m}_low"), row.get(f"{m}_high")) for m in present),
                     row["n"], row["errors"]])
    return "<h3>Results</h3>" + table(header, rows)


def lowest(records: Sequence[Record], metrics: Sequence[str]) -> list[Record]:
    """The lowest-scoring records (a missing score or an error counts as lowest), ties in id order."""
    def key(record: Record) -> tuple[Any, ...]:
        values = [record.scores.get(m) for m in metrics]
        scored = [float(v) if isinstance(v, (bool, int, float)) and not record.error else -1.0 for v in values]
        return (*scored, record.id)

    return sorted(records, key=key)[:WORST]


def generic_samples(records: Sequence[Record], metrics: Sequence[str]) -> str:
    worst = lowest(records, metrics)
    if not worst:
        return ""
    rows = [[r.id, json.dumps(dict(r.axes)), " | ".join(r.target)[:300], " | ".join(map(str, r.outputs))[:300],
             json.dumps({m: r.scores.get(m) for m in metrics}), r.error or ""] for r in worst]
    header = ["id", "axes", "expected", "produced", "scores", "error"]
    return f"<h3>Lowest-scoring samples</h3><p>by {esc(', '.join(metrics))}</p>" + table(header, rows)


def run_section(run: RunFolder, plot_dir: Path) -> str:
    if not run.complete:
        raise UserError(f"run {run.path} is not complete (no summary.json); rerun its command to finish it")
    config = run.read_config()
    records = scored_records(run)
    frame = run_frame(run)
    spec = task_spec(config["task"], records)
    spec = replace(spec, metrics=(*spec.metrics, *side_metrics(run)))  # e.g. judged accuracy
    task = installed_task(run)
    model = config.get("model", {}).get("name", "?")
    plots = _plots(task, frame, run, plot_dir / run.path.name, str(model))
    if plots is None:  # no plots of its own, or its module is not installed here: the plots the run wrote
        plots = sorted(run.plots.glob("*.png"))
    samples = task.view(task).html_samples(records) if task is not None else None
    if samples is None:
        samples = generic_samples(records, spec.metrics)
    return "\n".join([
        f'<section id="{esc(run.path.name)}"><h2>{esc(run.path.name)}</h2>',
        f"<p>task <b>{esc(config['task'])}</b>, model <b>{esc(model)}</b>, {len(frame)} samples, "
        f"folder <code>{esc(run.path)}</code></p>",
        results_section(frame, spec.group_by, spec.metrics),
        "<h3>Plots</h3>" + ("".join(image(p) for p in plots if p.suffix == ".png") or "<p>none</p>"),
        samples, config_section(config), "</section>",
    ])


def _plots(task: Any | None, frame: pd.DataFrame, run: RunFolder, folder: Path, title: str) -> list[Path] | None:
    """The task view's plots, drawn afresh into `folder` (made first, as views expect)."""
    if task is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return view_plots(task, frame, ReadOnlyRun(run), folder, title)


def comparison_sections(runs: Sequence[RunFolder], plot_dir: Path) -> str:
    """Each run compared with the first run of the same task configuration."""
    firsts: list[tuple[dict[str, Any], RunFolder]] = []
    parts = []
    for run in runs:
        identity = task_identity(run.read_config())
        first = next((f for ident, f in firsts if identity_difference(identity, ident) is None), None)
        if first is None:
            firsts.append((identity, run))
            continue
        comparison = compare(first.path, run.path)
        folder = plot_dir / f"compare-{first.path.name}-{run.path.name}"
        header, body = display_rows(comparison.overall, [], comparison.names)
        section = [f"<h2>{esc(comparison.task)}: {esc(comparison.names[0])} vs {esc(comparison.names[1])}</h2>",
                   "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in comparison.notes()) + "</ul>",
                   table(header, body)]
        section += [image(p) for p in comparison_plots(comparison, folder) if p.suffix == ".png"]
        if comparison.keys:
            section.append("<details><summary>per cell</summary>"
                           + table(*display_rows(comparison.cells, comparison.keys, comparison.names)) + "</details>")
        parts.append("\n".join(section))
    return "\n".join(parts)


def render(folders: Sequence[str | Path]) -> str:
    runs = [open_run(f) for f in folders]
    if not runs:
        raise UserError("report --html needs at least one run folder")
    with tempfile.TemporaryDirectory(prefix="evalsuite-report-") as tmp:
        sections = [run_section(run, Path(tmp)) for run in runs]
        comparisons = comparison_sections(runs, Path(tmp))
    contents = "".join(f'<li><a href="#{esc(r.path.name)}">{esc(r.path.name)}</a></li>' for r in runs)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>evalsuite report: {len(runs)} run{'s' if len(runs) != 1 else ''}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>evalsuite report</h1><p>evalsuite {esc(__version__)}; runs:</p><ul>{contents}</ul>",
        *sections,
        ("<h1>Comparisons</h1>" + comparisons) if comparisons else "",
        "</body></html>",
    ])


def write_html_report(folders: Sequence[str | Path], out_file: str | Path) -> Path:
    return write_page_file(out_file, render(folders))


def write_page_file(out_file: str | Path, page: str) -> Path:
    """An HTML page to a file, its folder made first; a path that cannot be written is one line."""
    out = Path(out_file)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out
