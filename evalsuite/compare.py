"""Two runs of one task on the same samples, side by side.

Runs are joined on sample id; runs made with different task configurations
are refused. Pass/fail outcomes are compared with the exact McNemar test.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import UserError
from .records import RunFolder, config_hash, open_run
from .report import run_frame
from .stats import mcnemar_exact


def paired_frames(run_a: RunFolder, run_b: RunFolder) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two runs' frames restricted to their common samples, in the same order."""
    config_a, config_b = run_a.read_config(), run_b.read_config()
    if (config_a["task"], config_a["params"], config_a.get("limit")) != (
        config_b["task"], config_b["params"], config_b.get("limit")
    ):
        raise UserError(f"{run_a.path.name} and {run_b.path.name} were run with different task configurations")
    frame_a, frame_b = run_frame(run_a), run_frame(run_b)
    common = sorted(set(frame_a["id"]) & set(frame_b["id"]))
    if not common:
        raise UserError(f"{run_a.path.name} and {run_b.path.name} share no samples")
    frame_a = frame_a.set_index("id").loc[common].reset_index()
    frame_b = frame_b.set_index("id").loc[common].reset_index()
    return frame_a, frame_b


def significant_cells(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str, alpha: float = 0.05
                      ) -> pd.DataFrame:
    """depth x length booleans: does McNemar find the paired outcomes differ?"""
    rows = []
    for (depth, length), part_a in frame_a.groupby(["depth", "context_length"]):
        part_b = frame_b.set_index("id").loc[part_a["id"]]
        test = mcnemar_exact(part_a[metric].astype(bool).tolist(), part_b[metric].astype(bool).tolist())
        rows.append({"depth": depth, "context_length": length, "significant": test["p_value"] < alpha})
    table = pd.DataFrame(rows)
    return table.pivot(index="depth", columns="context_length", values="significant")


def compare_runs(path_a: str | Path, path_b: str | Path, out: str | Path) -> Path:
    """Write the comparison of two runs; returns its folder."""
    run_a, run_b = open_run(path_a), open_run(path_b)
    frame_a, frame_b = paired_frames(run_a, run_b)
    names = (str(frame_a["model"].iloc[0]), str(frame_b["model"].iloc[0]))
    digest = config_hash({"a": run_a.path.name, "b": run_b.path.name})[:8]
    folder = Path(out) / f"compare-{run_a.read_config()['task']}-{names[0]}-vs-{names[1]}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    if frame_a["task"].iloc[0] == "needle":
        from .plots import needle_pair_heatmaps

        parts = []
        for (n, r), part_a in frame_a.groupby(["n_needles", "n_queries"]):
            part_b = frame_b.set_index("id").loc[part_a["id"]].reset_index()
            parts.append(significant_cells(part_a, part_b, "correct_all"))
        marks = parts[0] if len(parts) == 1 else None
        needle_pair_heatmaps(frame_a, frame_b, folder, names, marks=marks)
    return folder
