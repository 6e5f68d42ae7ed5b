"""The zeroshot task's presentation: the paper's table (lm-eval's aggregate of each metric per
model, bits and benchmark) and the plot of accuracy against attention-logit bits."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.contracts import TaskView

if TYPE_CHECKING:
    import pandas as pd

    from evalsuite.runs.view import RunView

PAPER_BENCHMARKS = ("arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande")
PAPER_METRIC = {"hellaswag": "acc_norm"}  # every other benchmark: acc
BOOTSTRAP_ITERS = 100_000  # lm-eval's default, used only by metrics without a closed-form stderr


class ZeroShotView(TaskView):
    """The paper's table in reports and, for a bits sweep, accuracy against bits."""

    axis_labels = {"bits": "attention logit bits (16 = none)"}

    def report_section(self, run: RunView) -> str:
        from evalsuite.analysis.frame import run_frame

        return paper_table(aggregate_rows(run_frame(run)))

    def plots(self, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path]:
        if "bits" not in frame.columns:
            return []
        return [accuracy_vs_bits(aggregate_rows(frame), Path(folder) / "accuracy_vs_bits.png", title)]

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Both models in one table and, for a bits sweep, one line per model in one plot."""
        import pandas as pd

        frame_a, frame_b, names = comparison.frame_a, comparison.frame_b, comparison.names
        rows = aggregate_rows(pd.concat([frame_a, frame_b], ignore_index=True))
        table = Path(folder) / "zeroshot_table.md"
        table.write_text(paper_table(rows) + "\n", encoding="utf-8")
        written = [table]
        if "bits" in frame_a.columns:
            written.append(accuracy_vs_bits(rows, Path(folder) / "accuracy_vs_bits.png", " vs ".join(names)))
        return written


def lm_eval_aggregate(metric: str, values: list[float]) -> tuple[float, float | None]:
    """lm-eval's aggregation of a metric and its standard error (None for a single value)."""
    from evalsuite.modeling import lmeval_compat

    name = metric.split(",")[0]
    aggregate = lmeval_compat.metric_aggregation("acc" if name == "score" else name)  # score is acc or acc_norm
    stderr = lmeval_compat.stderr_function(aggregate, BOOTSTRAP_ITERS)
    return float(aggregate(values)), (float(stderr(values)) if stderr and len(values) > 1 else None)


def aggregate_rows(frame: Any) -> list[dict[str, Any]]:
    """Per model, bits and benchmark: each metric's lm-eval aggregate, its stderr and n."""
    from evalsuite.analysis.frame import plain

    keys = [k for k in ("model", "bits", "benchmark") if k in frame.columns]
    rows = []
    for key, part in frame.groupby(keys, sort=True):
        base = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for metric in ("score", "acc", "acc_norm"):
            if metric not in part.columns or part[metric].dropna().empty:
                continue
            values = part[metric].dropna().astype(float).tolist()
            value, stderr = lm_eval_aggregate(metric, values)
            rows.append({**{k: plain(v) for k, v in base.items()}, "metric": metric, "value": value,
                         "stderr": stderr, "n": len(values)})
    return rows


def paper_table(rows: list[dict[str, Any]]) -> str:
    """Markdown in the paper's shape: a row per model (and bits), a column per benchmark
    with the paper's metric x100 ± stderr, and the average over benchmarks."""
    scores = [r for r in rows if r["metric"] == "score"]
    benchmarks = [b for b in PAPER_BENCHMARKS if any(r["benchmark"] == b for r in scores)]
    benchmarks += sorted({r["benchmark"] for r in scores} - set(benchmarks))
    lines = ["| model | " + ("bits | " if any("bits" in r for r in scores) else "")
             + " | ".join(f"{b} ({PAPER_METRIC.get(b, 'acc')})" for b in benchmarks) + " | avg |"]
    lines.append("|" + "---|" * (len(lines[0].split("|")) - 2))
    line_keys = sorted({(r.get("model", ""), r.get("bits", 16)) for r in scores}, key=lambda k: (k[0], -k[1]))
    for model, bits in line_keys:
        cells = {r["benchmark"]: r for r in scores if r.get("model", "") == model and r.get("bits", 16) == bits}
        shown = [_cell(cells.get(b)) for b in benchmarks]
        values = [cells[b]["value"] for b in benchmarks if b in cells]
        average = f"{100 * sum(values) / len(values):.1f}" if len(values) == len(benchmarks) else "n/a"
        bits_cell = f"{bits} | " if any("bits" in r for r in scores) else ""
        lines.append(f"| {model} | {bits_cell}" + " | ".join(shown) + f" | {average} |")
    return "\n".join(lines)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "n/a"
    stderr = f" ± {100 * row['stderr']:.1f}" if row["stderr"] is not None else ""
    return f"{100 * row['value']:.1f}{stderr}"


def accuracy_vs_bits(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Zero-shot accuracy (the paper's metric, ±1 lm-eval stderr) against attention-logit
    bits, one line per model, one panel per benchmark; 16 bits (unquantized) on the left."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from evalsuite.analysis.plots import save

    scores = pd.DataFrame([r for r in rows if r["metric"] == "score"])
    benchmarks = list(dict.fromkeys(scores["benchmark"]))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(4.2 * len(benchmarks), 3.8), squeeze=False, sharey=True)
    for ax, benchmark in zip(axes[0], benchmarks):
        for model, line in scores[scores["benchmark"] == benchmark].groupby("model", sort=True):
            line = line.sort_values("bits", ascending=False)
            ax.errorbar(line["bits"].astype(str), line["value"], yerr=line["stderr"].fillna(0.0), marker="o",
                        capsize=3, label=str(model))
        ax.set_title(benchmark)
        ax.set_xlabel("attention logit bits (16 = none)")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("accuracy (acc_norm for hellaswag)")
    axes[0][-1].legend(fontsize="small")
    fig.suptitle(f"{title}: accuracy vs absmax-quantized attention logits")
    return save(fig, Path(path))
