"""The `evalsuite` command line.

Every user-facing error is one line on stderr with exit code 2; tracebacks
are for bugs only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from . import api
from .errors import UserError
from .params import split_pairs

OPTION_HELP = {
    "model": "Model to evaluate: a built-in name (toy-diff, toy-base, smollm2), a HF folder or hub id, "
             "gguf:PATH, NAME:... for any registered backend, or fake[:target|oracle|wrong|echo]. Give two or more "
             "times to run each on identical samples and compare each with the baseline (--baseline).",
    "task": "Task to run (see `evalsuite list`).",
    "T": "Task parameter key=value, repeatable (e.g. -T lengths=1024,2048 -T preset=paper-4k).",
    "M": "Model/backend option key=value, repeatable (e.g. -M dtype=bfloat16 -M chat_template=true); a reasoning "
         "model's -M thinking=auto|off|think|START,END and -M thinking_budget=N (docs/reasoning-models.md).",
    "J": "Run-step option key=value, repeatable: a task's step over the saved outputs, such as the hallucination "
         "task's judge (e.g. -J judge=lexical -J judge_concurrency=8; each also has its flag, --judge ...).",
}
EFFECTIVE_HELP = {
    "share": "Effective length of a length-swept run (NoLiMa's by default): the longest length from the last base "
             "length whose score keeps this share of the base score.",
    "base": "The lengths, in tokens, whose pooled score is the effective length's base score (default: NoLiMa's); "
            "a run without them all takes its shortest length instead, and says so.",
    "floor": "A base score under this gives \"not measurable\" instead of an effective length.",
}


def effective_options(command: Any) -> Any:
    """--effective-share, --effective-base and --effective-floor, of `report` and `compare`."""
    command = click.option("--effective-floor", type=float, default=api.EFFECTIVE_FLOOR, show_default=True,
                           help=EFFECTIVE_HELP["floor"])(command)
    command = click.option("--effective-base", default=",".join(map(str, api.EFFECTIVE_BASE)), show_default=True,
                           metavar="N,N,...", help=EFFECTIVE_HELP["base"])(command)
    return click.option("--effective-share", type=float, default=api.EFFECTIVE_SHARE, show_default=True,
                        help=EFFECTIVE_HELP["share"])(command)


def effective_settings(share: float, base: str, floor: float) -> dict[str, Any]:
    """The effective options as api.report's and api.compare's keyword arguments."""
    from .analysis.tolerances import parse_effective_base

    return {"effective_share": share, "effective_base": parse_effective_base(base), "effective_floor": floor}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="evalsuite")
def cli() -> None:
    """Evaluate DIFF and baseline Transformer checkpoints on long-context tasks."""


@cli.command("list")
def list_cmd() -> None:
    """List tasks, named models, presets and shipped suites."""
    info = api.describe()
    click.echo("Tasks:")
    for name, doc in info["tasks"].items():
        presets = info["presets"].get(name)
        click.echo(f"  {name:<14} {doc}" + (f"  [presets: {', '.join(presets)}]" if presets else ""))
    click.echo("Models:")
    for name, doc in info["models"].items():
        click.echo(f"  {name:<14} {doc}")
    click.echo("Backends (model specs NAME:...):")
    click.echo("  " + ", ".join(info["backends"]))
    click.echo("Suites:")
    for name in info["suites"]:
        click.echo(f"  {name}")


def out_folder(ctx: click.Context, param: click.Parameter, value: str) -> Path:
    """An --out that names a folder: an empty one would write into the working directory."""
    if not value.strip():
        raise click.BadParameter("must name a folder (an empty name would write into the current folder)")
    return Path(value)


class WithStepOptions(click.Command):
    """A command that takes run-step options: `-J key=value`, and the flag the registered tasks name
    for each of theirs (`--judge J` is `-J judge=J`). The flags are plain text, parsed with -J's
    values; they are added when the command parses its arguments or shows its help, so that other
    commands never load the tasks."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not getattr(self, "_step_flags_added", False):
            self._step_flags_added = True
            taken = {name for param in self.params for name in (param.name, *param.opts)}
            for flag in api.step_flags():
                if flag.flag not in taken and flag.key not in taken:
                    self.params.append(click.Option([flag.flag, flag.key], default=None, multiple=flag.repeatable,
                                                    metavar="KEY=VALUE" if flag.repeatable else "VALUE", help=flag.help))
        return super().get_params(ctx)


def step_values(pairs: tuple[str, ...], flagged: dict[str, Any]) -> dict[str, str]:
    """The run-step options given: -J pairs, and the flags given (a repeatable one's values joined)."""
    given = {key: ",".join(value) if isinstance(value, tuple) else value for key, value in flagged.items()
             if value is not None and value != ()}
    return {**given, **split_pairs(pairs, "-J")}


@cli.command(cls=WithStepOptions)
@click.option("--model", "models", multiple=True, required=True, help=OPTION_HELP["model"])
@click.option("--baseline", default=None, metavar="MODEL",
              help="The --model every other model is compared with (default: the first --model). Each comparison "
              "is what `evalsuite compare BASELINE_RUN RUN` writes; three or more models also get one grid of all.")
@click.option("--task", default=None, help=OPTION_HELP["task"])
@click.option("--suite", default=None, help="Run every task of a suite instead of one --task: a TOML file or a "
              "shipped suite name (ci-smoke). Writes suite-<suite>-<model>.json under --out.")
@click.option("--scale", default=None, metavar="NAME",
              help="The suite's scale (its [run.scale.NAME] parameters), e.g. quick or paper for diff-paper.")
@click.option("--data-dir", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Folder of local data files that the suite names with {data_dir} (see docs/paper-suite.md).")
@click.option("-T", "task_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["T"])
@click.option("-M", "model_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["M"])
@click.option("-J", "step_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["J"])
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Evaluate only the first N samples of the plan (smoke tests).")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests per forward pass. Results do not depend on it.")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--seed", type=int, default=None, help="Seed for sample generation (the task's seed parameter).")
@click.option("--out", type=click.Path(), default="results", show_default=True, callback=out_folder,
              help="Folder under which run folders are written.")
@click.option("--log-prompts", is_flag=True, help="Store full prompt texts in samples.jsonl (large for long runs).")
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
@click.option("--no-prefix-cache", is_flag=True,
              help="Encode every prompt whole instead of reusing a shared prefix's KV cache (same results, slower).")
@click.option("--allow-version-change", is_flag=True,
              help="Resume a run under other library versions than those that wrote its records so far (refused "
              "otherwise); config.json then records which versions wrote which samples.")
@click.option("--step", "checkpoint_step", type=click.IntRange(min=0), default=None,
              help="Training step of the checkpoint, for `evalsuite trend` (default: read from the folder's name, "
              "checkpoint-1500, or its trainer_state.json).")
@click.option("--log-to", "log_to", multiple=True, type=click.Choice(["wandb", "tensorboard"]),
              help="Send each finished run to a tracker (repeatable): metrics, plots and samples at the run's step; "
              "TensorBoard files go under OUT/tensorboard.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (samples, prompt and new tokens) and a time estimate measured on the loaded model; "
              "run and write nothing.")
def run(models: tuple[str, ...], baseline: str | None, task: str | None, suite: str | None, scale: str | None,
        data_dir: Path | None, task_options: tuple[str, ...], model_options: tuple[str, ...],
        step_options: tuple[str, ...], limit: int | None,
        batch_size: int, device: str, seed: int | None, out: Path,
        log_prompts: bool, no_progress: bool, no_prefix_cache: bool, allow_version_change: bool,
        checkpoint_step: int | None, log_to: tuple[str, ...], dry_run: bool, **step_flags: Any) -> None:
    """Run a task (or a suite of tasks) on one or more models; the same command resumes an interrupted run."""
    # one batch per append (the API's chunk): a killed run loses at most the batch in flight
    common: dict[str, Any] = dict(out=out, limit=limit, device=device, batch_size=batch_size, seed=seed,
                                  log_prompts=log_prompts, progress=not no_progress, checkpoint_step=checkpoint_step)
    common["baseline"] = baseline  # two or more models: each compared with it (engine/multi.py)
    backend_options = split_pairs(model_options, "-M")
    step = step_values(step_options, step_flags)
    if dry_run:  # the run-step options too: a suite's judged entries are planned when --judge is given
        click.echo(api.dry_run(task, models, suite=suite, limit=limit, device=device, batch_size=batch_size, seed=seed,
                               model_options=backend_options, params=split_pairs(task_options, "-T"), scale=scale,
                               data_dir=data_dir, step=step))
        return
    common["log_to"] = log_to  # each finished run folder is sent to these trackers
    common["prefix_cache"] = not no_prefix_cache  # adapters that reuse shared prefixes; never part of the run hash
    common["allow_version_change"] = allow_version_change  # a resume under other library versions goes on
    if suite is not None or task is None:  # run-step options apply to the entries whose task declares them
        _run_suite(suite, task, task_options, models, backend_options, {**common, "step": step, "scale": scale,
                                                                          "data_dir": data_dir})
        return
    if scale is not None or data_dir is not None:
        raise UserError("--scale and --data-dir are for --suite; with --task give its parameters with -T")
    results = api.run(task, models, model_options=backend_options, step=step,
                      params=split_pairs(task_options, "-T"), **common)
    if not results.main:
        return  # under torchrun, rank 0 reports for every rank
    for run_folder, summary in zip(results.runs, results.summaries):
        click.echo(f"{run_folder.path}: {_headline(summary)}")
    if results.step_table is not None:
        click.echo(results.step_table)
    for _, folder in results.comparisons:
        click.echo(f"comparison: {folder}")
    if results.grid is not None:
        click.echo(f"grid: {results.grid}")


def _run_suite(suite: str | None, task: str | None, task_options: tuple[str, ...], models: tuple[str, ...],
               model_options: dict[str, str], common: dict[str, Any]) -> None:
    if suite is None:
        raise UserError("give --task NAME (see `evalsuite list`) or --suite FILE")
    if task is not None or task_options:
        raise UserError("--suite sets the tasks and their parameters: drop --task and -T, or edit the suite file")
    results = api.run_suite(suite, models, model_options=model_options, **common)
    if not results.main:
        return
    for result in results.results:
        click.echo(f"suite {results.name}: {result.path}")
        for name, folder in result.runs:
            click.echo(f"  {name}: {folder}: {_headline(json.loads((folder / 'summary.json').read_text()))}")
    for name, folder in results.comparisons:
        click.echo(f"comparison {name}: {folder}")
    for name, folder in results.grids:
        click.echo(f"grid {name}: {folder}")
    for name, why in results.skipped:
        click.echo(f"skipped {name}: {why}")


def _headline(summary: dict) -> str:
    overall = summary.get("overall", {})
    parts = [f"n={overall.get('n', summary.get('n'))}"]
    if overall.get("n", summary.get("n")) != summary.get("n"):  # samples the task skipped on purpose
        parts.append(f"records={summary.get('n')}")
    for key, value in overall.items():
        if isinstance(value, float) and not key.endswith(("_low", "_high")):
            parts.append(f"{key}={value:.3f}")
    return ", ".join(parts)


@cli.command()
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--plots/--no-plots", default=True, show_default=True, help="Also (re)write each run's plots.")
@click.option("--html", "html_file", type=click.Path(path_type=Path), default=None,
              help="Also write one self-contained HTML page: tables, plots, configurations, worst needle samples.")
@click.option("--paper", "paper_dir", type=click.Path(path_type=Path), default=None, metavar="RESULTS_DIR",
              help="Instead: the report shaped like the Differential Transformer paper from the diff-paper suite's "
              "results in RESULTS_DIR (HTML and markdown; see docs/paper-suite.md).")
@click.option("--out", "paper_out", type=click.Path(path_type=Path), default=None,
              help="With --paper: the HTML file to write (default RESULTS_DIR/paper-report.html; the .md beside it).")
@click.option("--baseline", "paper_baseline", default=None, metavar="MODEL",
              help="With --paper: the baseline model (default: the one the suite run compared the others with).")
@effective_options
def report(runs: tuple[Path, ...], plots: bool, html_file: Path | None, paper_dir: Path | None,
           paper_out: Path | None, paper_baseline: str | None, effective_share: float, effective_base: str,
           effective_floor: float) -> None:
    """Print a markdown table (rate, 95% interval, n per cell) for finished runs (folders or suite results);
    with --paper RESULTS_DIR, write the report shaped like the Differential Transformer paper instead."""
    if paper_dir is not None or paper_out is not None or paper_baseline is not None:
        _paper_report(runs, html_file, paper_dir, paper_out, paper_baseline)
        return
    if not runs:
        raise UserError("give run folders or suite results to report on (or --paper RESULTS_DIR)")
    click.echo(api.report(runs, plots=plots, **effective_settings(effective_share, effective_base, effective_floor)))
    if html_file is not None:
        click.echo(f"html report: {api.html_report(runs, html_file)}")


def _paper_report(runs: tuple[Path, ...], html_file: Path | None, paper_dir: Path | None, out: Path | None,
                  baseline: str | None) -> None:
    if paper_dir is None:
        raise UserError("--out and --baseline of report go with --paper RESULTS_DIR")
    if runs or html_file is not None:
        raise UserError("--paper reads every suite result in RESULTS_DIR: drop the run arguments and --html")
    written = api.paper_report(paper_dir, out=out, baseline=baseline)
    measured = [s for s in written.sections if s.absent is None]
    for section in measured:  # what was measured first; the sections not run in one line after it
        click.echo(f"{section.title}: {'; '.join(section.readings) or 'nothing to compare'}")
    absent = [s.title for s in written.sections if s.absent is not None]
    if absent:
        click.echo(f"not in these results ({len(absent)} of {len(written.sections)}, see the report): "
                   f"{'; '.join(absent)}")
    click.echo(f"paper report: {written.html} and {written.markdown}")


@cli.command("compare")
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(), default="results", show_default=True, callback=out_folder,
              help="Folder under which the comparison folder is written.")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="Significance level of the paired tests.")
@effective_options
def compare_cmd(run_a: Path, run_b: Path, out: Path, alpha: float, effective_share: float, effective_base: str,
                effective_floor: float) -> None:
    """Paired comparison of two runs of one task configuration (or of two suite results, run by run):
    tables in markdown, CSV and LaTeX, and difference plots."""
    note = api.version_note([run_a, run_b])
    if note is not None:
        click.echo(note, err=True)
    effective = effective_settings(effective_share, effective_base, effective_floor)
    for comparison, folder in api.compare(run_a, run_b, out=out, alpha=alpha, **effective):
        click.echo(comparison.markdown(cells=False))
        click.echo(f"written: {folder}\n")


@cli.command("check")
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="Run folder, suite result or exported baseline file to check against.")
@click.option("--max-drop", "max_drop", multiple=True, metavar="[METRIC=]VALUE",
              help="Tolerated drop, in the metric's own units (0.02 = two points of accuracy; default "
              f"{api.DEFAULT_MAX_DROP:g}): a bare number for every metric, METRIC=VALUE for one (repeatable).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="Also gate this metric, per cell like the task's primary one (repeatable); others are reported.")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="Significance level of the one-sided tests (family-wise over the rows gated, by Holm).")
@click.option("--allow-unjudged", is_flag=True,
              help="Gate judged metrics on the judged samples only, instead of refusing a run with unjudged samples.")
@click.option("--junit", type=click.Path(path_type=Path), default=None, help="Also write the result as JUnit XML.")
@click.option("--export-baseline", type=click.Path(path_type=Path), default=None,
              help="Write CANDIDATE's per-sample outcomes as a baseline file (JSON, small enough to commit).")
@click.option("--require-non-inferiority", is_flag=True,
              help="Release gate: pass only when each metric's drop is shown to be within --max-drop.")
@click.option("--same-versions", is_flag=True,
              help="Refuse (exit 2) runs made by different evalsuite, task, transformers, torch or lm-eval versions.")
@click.option("--detects", type=click.Choice(["persist", "turn"]), default="persist", show_default=True,
              help="What the table's detectable drop (80% power) assumes: ordinary disagreements persist under the "
              "drop (conservative), or every disagreement turns against the candidate.")
def check_cmd(candidate: Path, baseline: Path | None, max_drop: tuple[str, ...], metrics: tuple[str, ...],
              alpha: float, allow_unjudged: bool, junit: Path | None, export_baseline: Path | None,
              require_non_inferiority: bool, same_versions: bool, detects: str) -> None:
    """Regression gate: exit 1 when the task's primary metric of CANDIDATE (run folder or suite result), over
    all samples or in a cell of the task's gating axes, dropped below the baseline by more than --max-drop
    beyond noise (Holm-adjusted p < --alpha); 0 otherwise; 2 on bad input or nothing to test."""
    if baseline is None and export_baseline is None:
        raise UserError("check needs --baseline (run folder, suite result or baseline file) or --export-baseline FILE")
    if export_baseline is not None:
        click.echo(f"baseline written: {api.export_baseline(candidate, export_baseline)}")
    if baseline is None:
        return
    note = api.version_note([candidate, baseline], refuse=same_versions)
    if note is not None:
        click.echo(note, err=True)
    default, by_metric = api.parse_max_drop(max_drop)
    result = api.check(candidate, baseline, max_drop=default, max_drop_by_metric=by_metric, metrics=metrics,
                       alpha=alpha, require_non_inferiority=require_non_inferiority, allow_unjudged=allow_unjudged,
                       detects=detects)
    click.echo(result.markdown())
    api.publish_check(result, junit)
    if result.failed:
        sys.exit(1)


@cli.command(cls=WithStepOptions)
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--device", default="auto", show_default=True, help="Device of the step's model (an hf judge).")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Batch of the step's model (an hf judge).")
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
@click.option("-J", "step_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["J"])
def score(runs: tuple[Path, ...], device: str, batch_size: int, no_progress: bool, step_options: tuple[str, ...],
          **step_flags: Any) -> None:
    """Judge the saved outputs of finished runs (again) without loading the evaluated model: a task's
    run step, such as --judge J, whose verdicts go to RUN/judgements/<judge>.jsonl beside earlier
    judges'; a rerun judges only what has no verdict."""
    scored = api.score(runs, step_values(step_options, step_flags), device=device, batch_size=batch_size,
                       progress=not no_progress, on_run=lambda path, line: click.echo(f"{path}: {line}"))
    click.echo(scored.table)


@cli.command("lm-eval", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                          "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lm_eval_cmd(args: tuple[str, ...]) -> None:
    """lm-eval's own command line with evalsuite's model registered: every argument goes to
    lm-eval unchanged (e.g. --model evalsuite --model_args model=toy-diff --tasks hellaswag)."""
    api.lm_eval(args)


def _add_commands() -> None:
    from .commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


_add_commands()


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted: rerun the same command to resume", err=True)
        sys.exit(130)
    except OSError as exc:  # a path the user gave that cannot be read or written (a folder, no permission...)
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"error: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
