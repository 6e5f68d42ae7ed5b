"""Everything the viewer shows, gathered from a results folder into one JSON-ready dict.

Runs are the folders under the results folder that hold a run's config.json
(read through the run-folder format, `runs.records`); comparisons are the
`compare-*` folders that hold a comparison.json (`analysis.compare`). Each run
carries its summary table (`analysis.frame.summarize`), its plots, every
sample, and the runs it pairs with: those of the same task identity
(`runs.identity`), whatever their models.

Images are either embedded as data: URIs (a page written to one file) or named
by their path under the results folder, which the server answers.

A written page stays small however many runs it shows: it holds at most
WRITTEN_SAMPLES samples of each run (spread over the run, the count of all
said beside them; the served viewer shows every one), and beyond EMBED_RUNS
runs it links the plots by their path from the page instead of holding them.
Each run is named by what it ran: its suite entry, task, model and dataset,
not only its folder's hash-suffixed name.

A run swept over context lengths shows its effective length (`analysis.effective_length`, as
`report` says it); a comparison shows both models' effective lengths and their difference as
`compare` wrote them, and its per-cell differences as heatmaps (`cell_heatmaps`), rows of one
axis against another, with the full per-cell table folded beneath.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from evalsuite.analysis.effective_length import effective_length, headline_metric
from evalsuite.analysis.frame import run_frame, summarize
from evalsuite.analysis.report import format_rate
from evalsuite.analysis.side_scores import scored_records, side_metrics
from evalsuite.analysis.tables import display_rows
from evalsuite.analysis.task_of import TaskSpec, task_spec
from evalsuite.errors import UserError
from evalsuite.runs.identity import identity_difference, task_identity
from evalsuite.runs.records import DamagedRun, RunFolder, open_run
from evalsuite.runs.safe_json import read_json
from evalsuite.version import __version__

from .samples import column_order, plain, sample_entries

WRITTEN_SAMPLES = 50  # samples of one run a written page holds
EMBED_RUNS = 20  # runs whose plots a written page holds; beyond, it links them
ImageSource = Callable[[Path], str]  # an image file -> the src the page gives it

IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
FILES_PREFIX = "files/"  # where the server answers a file of the results folder


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def relative_name(path: Path, root: Path) -> str:
    """A folder's name as the viewer shows it: its path under the results folder."""
    relative = path.relative_to(root).as_posix()
    return root.name if relative == "." else relative


def embedded(path: Path) -> str:
    return f"data:{IMAGE_TYPES[path.suffix.lower()]};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def served(root: Path) -> ImageSource:
    return lambda path: FILES_PREFIX + path.relative_to(root).as_posix()


def linked(page_folder: Path) -> ImageSource:
    return lambda path: Path(os.path.relpath(path, page_folder)).as_posix()


def image_entries(folder: Path, source: ImageSource) -> list[dict[str, str]]:
    """The images in `folder`, each as {name, src}: a data: URI, the server's path, or a link."""
    entries = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        if path.suffix.lower() in IMAGE_TYPES and path.is_file():
            entries.append({"name": path.name, "src": source(path)})
    return entries


def spread(items: Sequence[Any], most: int | None) -> list[Any]:
    """At most `most` of `items`, evenly spread over them (every cell of a sweep keeps some)."""
    if most is None or len(items) <= most:
        return list(items)
    return [items[i * len(items) // most] for i in range(most)]


def dataset_of(params: Mapping[str, Any]) -> str:
    """What data a run read, from its parameters: a dataset's name, the benchmarks, a data file's
    name; "built-in" for the generated text of needle, NLL and outliers."""
    named = params.get("dataset") or params.get("benchmarks")
    named = ",".join(map(str, named)) if isinstance(named, list) else named
    files = [str(params.get(key)) for key in ("data", "source", "haystack")
             if params.get(key) not in (None, "", "builtin")]
    file_name = Path(files[0].rstrip("/")).name if files else None
    if named and file_name:
        return f"{named} ({file_name})"
    return str(named or file_name or "built-in")


def suite_entries(root: Path) -> dict[str, str]:
    """Run folder path -> its entry name in the suite results under `root` (needle-4k, icl-trec)."""
    names = {}
    for path in root.rglob("suite-*.json"):
        try:
            data = read_json(path)
            for item in data.get("runs", []):
                names[str((path.parent / item["run"]).resolve())] = str(item["name"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a suite result this viewer can read: its runs keep their folder names
    return names


def run_spec(run: RunFolder, task: str) -> tuple[TaskSpec, tuple[str, ...]]:
    """The task's spec (from the registry, or inferred from the records for a task not installed
    here) with the run's side metrics added, and those side metrics."""
    spec = task_spec(task, run.read_records())
    side = side_metrics(run)
    return replace(spec, metrics=(*spec.metrics, *side)), side


def summary_table(run: RunFolder, spec: TaskSpec) -> dict[str, Any]:
    """The run's table: every declared metric as 'mean [95% interval]', overall and per cell."""
    frame = run_frame(run)
    if frame.empty:
        return {"header": [], "rows": []}
    keys = [k for k in spec.group_by if k in frame.columns]
    metrics = [m for m in spec.metrics if m in frame.columns]
    header = [*keys, *metrics, "n", "errors"]
    rows = []
    for row in [*summarize(frame, (), metrics), *(summarize(frame, keys, metrics) if keys else [])]:
        rows.append([*(str(row.get(k, "all")) for k in keys),
                     *(format_rate(row.get(m), row.get(f"{m}_low"), row.get(f"{m}_high")) for m in metrics),
                     str(row["n"]), str(row["errors"])])
    return {"header": header, "rows": rows}


def effective_line(run: RunFolder, spec: TaskSpec) -> str | None:
    """The run's effective length in words, as `report` gives it (None: not swept over lengths)."""
    metric = headline_metric(spec)
    frame = run_frame(run) if metric is not None else None
    if metric is None or frame is None or frame.empty or metric not in frame.columns:
        return None
    found = effective_length(frame, metric)
    return None if found is None else f"{metric}: {found.line()}"


def run_entry(run: RunFolder, root: Path, images: ImageSource, most_samples: int | None = None,
              entry: str | None = None) -> dict[str, Any]:
    config = run.read_config()
    task = str(config["task"])
    spec, side = run_spec(run, task)
    primary = spec.primary_metric or (spec.metrics[0] if spec.metrics else None)
    gated = [m for m in (primary, *side) if m]
    records = scored_records(run)
    samples, pass_fail = sample_entries(spread(records, most_samples), run.path, gated, spec.lower_is_better)
    model = config.get("model", {})
    return {
        "name": relative_name(run.path, root), "folder": str(run.path), "task": task,
        "entry": entry, "dataset": dataset_of(config.get("params", {})), "samples_total": len(records),
        "model": str(model.get("name", "?")) if isinstance(model, dict) else "?",
        "complete": run.complete, "primary_metric": primary, "gated": gated, "pass_fail": pass_fail,
        "lower_is_better": list(spec.lower_is_better),
        "axes": column_order(records, spec.group_by, "axes"),
        "score_columns": column_order(records, gated, "scores"),
        "params": plain(config.get("params", {})), "limit": config.get("limit"),
        "log_prompts": bool(config.get("log_prompts")), "hash": str(config.get("hash", ""))[:10],
        "summary": summary_table(run, spec), "effective": effective_line(run, spec),
        "images": image_entries(run.plots, images), "samples": samples, "partners": [],
        "_identity": task_identity(config),
    }


def find_runs(root: Path) -> list[RunFolder]:
    """Every run folder under `root` (itself included); a config.json that is not a run's (a
    checkpoint kept beside the results) is passed over."""
    runs = []
    for config in sorted(root.rglob("config.json")):
        run = open_run(config.parent)
        try:
            run.read_config()
        except DamagedRun as exc:  # one damaged run must not hide the others
            warn(f"{exc}; left out")
            continue
        except UserError as exc:  # not a run's config.json, or a run's that is damaged (it has records)
            if run.samples_path.is_file():
                warn(f"{exc}; left out")
            continue
        runs.append(run)
    return runs


def pair_runs(entries: list[dict[str, Any]]) -> None:
    """Fill each entry's `partners`: the other runs of the same task identity."""
    for entry in entries:
        entry["partners"] = [other["name"] for other in entries if other is not entry
                             and identity_difference(entry["_identity"], other["_identity"]) is None]
    for entry in entries:
        del entry["_identity"]


def comparison_names(data: dict[str, Any]) -> tuple[str, str]:
    """The two sides' names as `compare` wrote them: models, or run folders when the models match."""
    names = (str(data["a"]["model"]), str(data["b"]["model"]))
    return names if names[0] != names[1] else (str(data["a"]["run"]), str(data["b"]["run"]))


def comparison_entry(folder: Path, root: Path, images: ImageSource) -> dict[str, Any] | None:
    """A compare-* folder's table and plots (None, with a warning, when its comparison.json is unreadable)."""
    path = folder / "comparison.json"
    try:
        data = read_json(path)
        names = comparison_names(data)
        keys = list(data.get("group_by") or [])
        overall = display_rows(data["overall"], [], names)
        cells = display_rows(data.get("cells") or [], keys, names)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warn(f"{path}: not a readable comparison ({type(exc).__name__}: {exc}); left out")
        return None
    return {
        "name": relative_name(folder, root), "task": str(data.get("task", "?")), "names": list(names),
        "runs": [str(data["a"]["run"]), str(data["b"]["run"])], "alpha": data.get("alpha"),
        "overall": {"header": overall[0], "rows": overall[1]},
        "cells": {"header": cells[0], "rows": cells[1]},
        "effective": effective_lines(data.get("effective_length"), names),
        "heatmaps": cell_heatmaps(data.get("cells") or [], keys, headline(data)),
        "images": image_entries(folder, images),
    }


def effective_lines(effective: Any, names: tuple[str, str]) -> list[str]:
    """Each model's effective length and their difference, as comparison.json words them ([]: none)."""
    if not isinstance(effective, dict):
        return []
    sides = [effective.get(side) for side in ("a", "b")]
    lines = [f"{name}: {side['text']}" for name, side in zip(names, sides) if isinstance(side, dict) and "text" in side]
    if "text" in effective:
        lines.append(f"{names[0]} minus {names[1]}: {effective['text']}")
    return [f"{effective.get('metric', '?')}, {line}" for line in lines]


def headline(data: Mapping[str, Any]) -> str | None:
    """The metric a comparison's heatmaps show: its effective length's, else its cells' first."""
    effective = data.get("effective_length")
    if isinstance(effective, dict) and isinstance(effective.get("metric"), str):
        return str(effective["metric"])
    cells = data.get("cells") or []
    return str(cells[0]["metric"]) if cells and isinstance(cells[0], dict) and "metric" in cells[0] else None


def cell_heatmaps(cells: Sequence[Mapping[str, Any]], keys: Sequence[str], metric: str | None) -> dict[str, Any] | None:
    """The per-cell differences of `metric` as grids: columns the context length (else the first axis
    that varies), rows the last other axis that varies, one grid per value of the axes left. Each
    cell: the difference, whether it is significant, and its means, n and p as a tooltip."""
    mine = [c for c in cells if c.get("metric") == metric]
    varying = [k for k in keys if len({str(c.get(k)) for c in mine}) > 1]
    if not mine or not varying:
        return None
    columns = "context_length" if "context_length" in varying else varying[0]
    others = [k for k in varying if k != columns]
    rows = others[-1] if others else None
    rest = [k for k in others if k != rows]
    grids: dict[str, dict[str, Any]] = {}
    for cell in mine:
        label = ", ".join(f"{k}={cell.get(k)}" for k in rest) or "all"
        grid = grids.setdefault(label, {"label": label, "cells": {}})
        grid["cells"][(str(cell.get(rows)) if rows else "", str(cell.get(columns)))] = {
            "diff": cell.get("diff"), "significant": bool(cell.get("significant")),
            "title": f"{cell.get('mean_a')} vs {cell.get('mean_b')}, n={cell.get('n')}, p={cell.get('p_value')}"}
    column_values = _ordered({str(c.get(columns)) for c in mine}, mine, columns)
    row_values = _ordered({str(c.get(rows)) for c in mine}, mine, rows) if rows else [""]
    return {"metric": metric, "columns": columns, "rows": rows, "column_values": column_values,
            "grids": [{"label": g["label"], "rows": [[g["cells"].get((r, c)) for c in column_values] for r in row_values],
                       "row_values": row_values} for g in grids.values()]}


def _ordered(values: set[str], cells: Sequence[Mapping[str, Any]], axis: str) -> list[str]:
    """An axis's values in their numeric order where they are numbers, else as text."""
    numbers = {str(c.get(axis)): float(c[axis]) for c in cells if isinstance(c.get(axis), (int, float))}
    return sorted(values, key=lambda v: (0, numbers[v], v) if v in numbers else (1, 0.0, v))


def collect(results: str | Path, embed_images: bool = True, page: Path | None = None) -> dict[str, Any]:
    """The runs and comparisons under `results`, as the page's data: for a page written to the file
    `page`, with at most WRITTEN_SAMPLES samples a run and its images embedded (linked from the
    page beyond EMBED_RUNS runs); for the served viewer, every sample and the server's image paths."""
    root = Path(results)
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such results folder"
        raise UserError(f"{what}: {results} (give the --out folder of evalsuite run, or one run folder)")
    root = root.resolve()
    found, entries = find_runs(root), suite_entries(root)
    images: ImageSource = embedded if embed_images else served(root)
    if page is not None and len(found) > EMBED_RUNS:
        images = linked(page.resolve().parent)
        warn(f"the page links the plots of its {len(found)} runs (more than {EMBED_RUNS}) from {root} rather than "
             "holding them: open it where that folder is")
    most = WRITTEN_SAMPLES if page is not None else None
    runs = [run_entry(run, root, images, most, entries.get(str(run.path.resolve()))) for run in found]
    pair_runs(runs)
    folders = sorted(p.parent for p in root.rglob("comparison.json") if p.parent.name.startswith("compare-"))
    comparisons = [entry for folder in folders if (entry := comparison_entry(folder, root, images))]
    if not runs and not comparisons:
        raise UserError(f"{results} holds no run folders (config.json) and no compare-* folders; "
                        "point evalsuite view at the --out folder of evalsuite run")
    # a run's folder name is its name in comparison.json: link a comparison to its runs by it
    by_folder = {Path(r["folder"]).name: r["name"] for r in runs}
    for entry in comparisons:
        entry["run_links"] = [by_folder.get(name) for name in entry["runs"]]
    return {"root": str(root), "version": __version__, "runs": runs, "comparisons": comparisons}
