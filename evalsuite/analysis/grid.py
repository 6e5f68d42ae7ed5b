"""Several runs of one task, each compared with one baseline run, and the grid of all of them.

The rule is the same for any number of models: every other run is paired with the
baseline exactly as `evalsuite compare BASELINE RUN` pairs two runs (the baseline is the
first run, so each difference reads baseline minus model), and its comparison folder is
written as that command writes it. With three or more models, one more folder holds an
overview of every comparison (grid.md, grid.json) and what the task's view draws of all
models at once (`TaskView.grid_report`: for the needle task, every model's heatmap side by
side and each model's difference from the baseline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalsuite.analysis.task_of import installed_task
from evalsuite.runs.confine import file_name
from evalsuite.runs.records import config_hash, write_json_atomic

from .compare import Comparison, compare, comparison_folder, write_comparison
from .tables import display_rows, markdown


@dataclass(frozen=True)
class BaselineComparisons:
    """The comparison folder of each other run with the baseline (in the order given), and the
    grid folder (None for fewer than two comparisons)."""

    folders: tuple[Path, ...]
    grid: Path | None


def compare_with_baseline(baseline: str | Path, others: Sequence[str | Path], out: str | Path,
                          alpha: float = 0.05) -> BaselineComparisons:
    """Compare every run of `others` with `baseline`, write each comparison under `out`, and,
    for two or more comparisons, the grid of all of them."""
    comparisons = [compare(baseline, other, alpha) for other in others]
    folders = []
    for comparison in comparisons:
        folder = comparison_folder(comparison, out)
        write_comparison(comparison, folder)
        folders.append(folder)
    grid = write_grid(comparisons, folders, out) if len(comparisons) > 1 else None
    return BaselineComparisons(folders=tuple(folders), grid=grid)


def grid_folder(comparisons: Sequence[Comparison], out: str | Path) -> Path:
    """grid-<task>-<baseline>-and-<n>-models-<hash of the run folders>."""
    runs = [comparisons[0].run_a.path.name, *(c.run_b.path.name for c in comparisons)]
    baseline = comparisons[0].names[0].replace("/", "_")
    digest = config_hash({"baseline": runs[0], "runs": runs[1:]})[:8]
    return Path(out) / file_name(f"grid-{comparisons[0].task}-{baseline}-and-{len(comparisons)}-models-{digest}")


def write_grid(comparisons: Sequence[Comparison], folders: Sequence[Path], out: str | Path) -> Path:
    """grid.md and grid.json (every comparison's overall rows, with its folder) and the view's figures."""
    folder = grid_folder(comparisons, out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grid.md").write_text(grid_markdown(comparisons, folders), encoding="utf-8")
    first = comparisons[0]
    write_json_atomic(folder / "grid.json", {
        "task": first.task, "baseline": {"run": first.run_a.path.name, "model": first.names[0]}, "alpha": first.alpha,
        "comparisons": [{"run": c.run_b.path.name, "model": c.names[1], "folder": f.name, "overall": c.overall}
                        for c, f in zip(comparisons, folders)]})
    task = installed_task(first.run_a)
    if task is not None:
        task.view(task).grid_report(list(comparisons), folder)
    return folder


def grid_markdown(comparisons: Sequence[Comparison], folders: Sequence[Path]) -> str:
    """Each model against the baseline: its overall table, and where its cells are."""
    first = comparisons[0]
    models = ", ".join(c.names[1] for c in comparisons)
    parts = [f"# {first.task}: {len(comparisons) + 1} models, baseline {first.names[0]}", "",
             f"- every other model ({models}) is paired with the baseline on sample id, as `evalsuite compare "
             f"BASELINE RUN` pairs two runs: difference = {first.names[0]} minus the model",
             "- per-cell tables and figures: each comparison's folder; p-values are per comparison, "
             "without correction for the number of models"]
    for comparison, folder in zip(comparisons, folders):
        parts += ["", f"## {comparison.names[0]} vs {comparison.names[1]}", "", f"folder: {folder.name}", "",
                  *(f"- {note}" for note in comparison.notes()[:1]), "",
                  markdown(*display_rows(comparison.overall, [], comparison.names))]
    return "\n".join(parts) + "\n"
