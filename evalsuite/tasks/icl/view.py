"""The icl task's presentation: the plots of accuracy against shots and of the spread over
demonstration orders, and, for a pair of runs, which model is the more robust to the order
(order.py's statistics, as a markdown and a CSV table). Plotting libraries load when a plot
is drawn, not when the task registers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.contracts import TaskView

if TYPE_CHECKING:
    import pandas as pd


class IclView(TaskView):
    """Accuracy against shots and the spread over demonstration orders, for one run or a pair."""

    axis_labels = {"n_shots": "demonstrations (shots)", "order": "order of the demonstrations",
                   "permutation": "demonstration order (permutation)"}

    def plots(self, frame: pd.DataFrame, run: Any, folder: Path, title: str) -> list[Path]:
        return draw_plots(frame, Path(folder), title)

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Both models in one accuracy-vs-shots plot (a line each) and one permutation-spread plot,
        and the order-robustness table (order_robustness.md / .csv)."""
        import pandas as pd

        names = comparison.names
        both = pd.concat([comparison.frame_a.assign(model=names[0]), comparison.frame_b.assign(model=names[1])],
                         ignore_index=True)
        tables = write_robustness(comparison.frame_a, comparison.frame_b, names, comparison.alpha, Path(folder))
        return tables + draw_plots(both, Path(folder), " vs ".join(names))


ROBUSTNESS_COLUMNS = ["order", "n_shots", "permutations", "n", "cluster", "clusters", "spread_a", "spread_b", "diff",
                      "floor_a", "floor_b", "excess_diff", "order_sd_a", "order_sd_b", "var_diff", "low", "high",
                      "p_value", "p_holm", "more_robust"]


def write_robustness(frame_a: pd.DataFrame, frame_b: pd.DataFrame, names: tuple[str, str], alpha: float,
                     folder: Path) -> list[Path]:
    """order_robustness.md and .csv: per (order, shot count), is one model's spread over the
    demonstration orders smaller than the other's beyond its noise floor."""
    import pandas as pd

    from .order import robustness_rows

    if "permutation" not in frame_a.columns or frame_a["permutation"].nunique() < 2:
        return []  # one order per question: no spread to compare
    rows = robustness_rows(frame_a, frame_b, alpha)
    csv_path, md_path = folder / "order_robustness.csv", folder / "order_robustness.md"
    table = pd.DataFrame(rows, columns=ROBUSTNESS_COLUMNS)
    table["more_robust"] = table["more_robust"].map({"a": names[0], "b": names[1]})
    table.to_csv(csv_path, index=False)
    md_path.write_text(robustness_markdown(rows, names, alpha), encoding="utf-8")
    return [md_path, csv_path]


def robustness_markdown(rows: list[dict[str, Any]], names: tuple[str, str], alpha: float) -> str:
    from evalsuite.analysis.tables import markdown, p_text

    def number(value: float | None, sign: str = "") -> str:
        return "n/a" if value is None else f"{value:{sign}.3f}"

    def vnum(value: float | None) -> str:  # variances of accuracy are small: three significant digits
        return "n/a" if value is None else f"{value:+.3g}"

    header = ["order", "shots", f"spread {names[0]}", f"spread {names[1]}", "difference",
              "noise floors", "excess difference", "order sd beyond noise", "order variance difference [95% CI]",
              "p (Holm)", "more robust"]
    body = []
    for row in rows:
        verdict = {"a": names[0], "b": names[1]}.get(row["more_robust"] or "", "no difference shown")
        if row["p_holm"] is None:
            verdict = "not testable"
        floors = f"{number(row['floor_a'])} / {number(row['floor_b'])}"
        variance = f"{vnum(row['var_diff'])} [{vnum(row['low'])}, {vnum(row['high'])}]"
        sds = f"{number(row['order_sd_a'])} / {number(row['order_sd_b'])}"
        p = "n/a" if row["p_holm"] is None else f"{p_text(row['p_value'])} ({p_text(row['p_holm'])})"
        body.append([row["order"], str(row["n_shots"]), number(row["spread_a"]), number(row["spread_b"]),
                     number(row["diff"], "+"), floors, number(row["excess_diff"], "+"), sds, variance, p, verdict])
    clusters = f"{rows[0]['clusters']} clusters of questions by `{rows[0]['cluster']}`" if rows else "no clusters"
    notes = [
        f"# Order robustness: {names[0]} vs {names[1]}", "",
        "- spread: best minus worst accuracy over the demonstration orders, on the questions both runs answered "
        "under every order; difference = first minus second",
        "- noise floor: the spread expected if the order did not matter (binomial noise, larger at lower accuracy); "
        "excess = spread minus floor",
        "- order sd beyond noise: the standard deviation of accuracy over the orders, noise taken out; the order "
        "variance difference is its square, first minus second",
        f"- interval and p: bootstrap of the order variance difference resampling the orders (a random sample "
        f"of the possible orders) and {clusters}, both models alike (9,999 resamples); Holm over the rows tested; "
        f"a model is more robust when the adjusted p < {alpha}",
        "", "",
    ]
    return "\n".join(notes) + markdown(header, body) + "\n"


def icl_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model and shot count: accuracy (mean over permutations) and its 95% interval,
    taken over test examples (each example's mean outcome over the permutations)."""
    import pandas as pd

    from evalsuite.analysis.stats import mean_interval

    rows = []
    for (model, n), part in frame.groupby(["model", "n_shots"], sort=True):
        per_example = part.groupby("test_index")["correct"].mean().astype(float)
        mean, low, high = mean_interval(per_example.tolist())
        rows.append({"model": model, "n_shots": int(n), "accuracy": mean, "low": low, "high": high})
    return pd.DataFrame(rows)


def icl_accuracy_vs_shots(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Accuracy against the number of demonstrations: one line per model, 95% band."""
    import matplotlib.pyplot as plt

    from evalsuite.analysis.plots import save

    curves = icl_curves(frame)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model, line in curves.groupby("model", sort=True):
        drawn = ax.plot(line["n_shots"], line["accuracy"], marker="o", label=str(model))
        ax.fill_between(line["n_shots"], line["low"], line["high"], color=drawn[0].get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(curves["n_shots"].unique()), [str(n) for n in sorted(curves["n_shots"].unique())])
    ax.set_ylim(0, 1)
    ax.set_xlabel("demonstrations (shots)")
    ax.set_ylabel("accuracy (mean over orders)")
    ax.set_title(f"{title}\nmany-shot ICL accuracy, 95% interval over test examples")
    ax.legend(fontsize="small")
    return save(fig, Path(path))


def icl_permutation_spread(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Accuracy of each demonstration order, per shot count and model (box + points);
    the spread (best - worst) is the height of each box's whiskers."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    from evalsuite.analysis.plots import save

    accuracy = frame.groupby(["model", "n_shots", "permutation"], sort=True)["correct"].mean().reset_index()
    accuracy["correct"] = accuracy["correct"].astype(float)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * accuracy["n_shots"].nunique() + 3), 4.5))
    sns.boxplot(data=accuracy, x="n_shots", y="correct", hue="model", ax=ax, whis=(0, 100), fill=False)
    state = np.random.get_state()  # seaborn jitters the points with numpy's global generator:
    np.random.seed(0)  # seeded here so that the same records draw the same figure, then restored
    try:
        sns.stripplot(data=accuracy, x="n_shots", y="correct", hue="model", ax=ax, dodge=True, legend=False,
                      size=5, alpha=0.8)
    finally:
        np.random.set_state(state)
    ax.set_ylim(0, 1)
    ax.set_xlabel("demonstrations (shots)")
    ax.set_ylabel("accuracy of one order")
    orders = accuracy.groupby(["model", "n_shots"])["permutation"].nunique().max()
    ax.set_title(f"{title}\naccuracy over {orders} demonstration orders (whiskers: best to worst)")
    return save(fig, Path(path))


def draw_plots(frame: Any, folder: Path, title: str) -> list[Path]:
    """Accuracy vs shots and the permutation spread, one line / box per model (and order, when a
    run holds several) in `frame`."""
    if "order" in frame.columns and frame["order"].nunique() > 1:
        frame = frame.assign(model=frame["model"].astype(str) + " (" + frame["order"].astype(str) + ")")
    return [icl_accuracy_vs_shots(frame, folder / "accuracy_vs_shots.png", title),
            icl_permutation_spread(frame, folder / "permutation_spread.png", title)]
