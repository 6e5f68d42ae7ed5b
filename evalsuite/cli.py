"""The `evalsuite` command line.

Every user-facing error is one line on stderr with exit code 2; tracebacks
are for bugs only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .errors import UserError
from .params import split_pairs

OPTION_HELP = {
    "model": "Model to evaluate: a built-in name (toy-diff, toy-base, smollm2), a HF folder or hub id, "
             "gguf:PATH, or fake[:oracle|wrong|echo]. Give twice to compare two models on identical samples.",
    "task": "Task to run (see `evalsuite list`).",
    "T": "Task parameter key=value, repeatable (e.g. -T lengths=1024,2048 -T preset=paper-4k).",
    "M": "Model/backend option key=value, repeatable (e.g. -M dtype=bfloat16 -M chat_template=true).",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="evalsuite")
def cli() -> None:
    """Evaluate DIFF and baseline Transformer checkpoints on long-context tasks."""


@cli.command("list")
def list_cmd() -> None:
    """List tasks, named models and presets."""
    from .registry import describe

    info = describe()
    click.echo("Tasks:")
    for name, doc in info["tasks"].items():
        presets = info["presets"].get(name)
        click.echo(f"  {name:<14} {doc}" + (f"  [presets: {', '.join(presets)}]" if presets else ""))
    click.echo("Models:")
    for name, doc in info["models"].items():
        click.echo(f"  {name:<14} {doc}")


@cli.command()
@click.option("--model", "models", multiple=True, required=True, help=OPTION_HELP["model"])
@click.option("--task", required=True, help=OPTION_HELP["task"])
@click.option("-T", "task_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["T"])
@click.option("-M", "model_options", multiple=True, metavar="KEY=VALUE", help=OPTION_HELP["M"])
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Evaluate only the first N samples of the plan (smoke tests).")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests per forward pass. Results do not depend on it.")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--seed", type=int, default=None, help="Seed for sample generation (the task's seed parameter).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results"), show_default=True,
              help="Folder under which run folders are written.")
@click.option("--log-prompts", is_flag=True, help="Store full prompt texts in samples.jsonl (large for long runs).")
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
def run(models: tuple[str, ...], task: str, task_options: tuple[str, ...], model_options: tuple[str, ...],
        limit: int | None, batch_size: int, device: str, seed: int | None, out: Path, log_prompts: bool,
        no_progress: bool) -> None:
    """Run a task on one or two models; the same command resumes an interrupted run."""
    from .runner import RunOptions, make_task, run_models

    task_obj = make_task(task, split_pairs(task_options, "-T"), seed)
    # one batch per append: a killed run loses at most the batch in flight
    options = RunOptions(out=out, limit=limit, log_prompts=log_prompts, progress=not no_progress, chunk=batch_size)
    runs = run_models(task_obj, models, split_pairs(model_options, "-M"), device, batch_size, options)
    for run_folder in runs:
        summary = json.loads(run_folder.summary_path.read_text())
        click.echo(f"{run_folder.path}: {_headline(summary)}")
    if len(runs) == 2:
        from .compare import compare_runs

        folder = compare_runs(runs[0].path, runs[1].path, out)
        click.echo(f"comparison: {folder}")


def _headline(summary: dict) -> str:
    overall = summary.get("overall", {})
    parts = [f"n={summary.get('n')}"]
    for key, value in overall.items():
        if isinstance(value, float) and not key.endswith(("_low", "_high")):
            parts.append(f"{key}={value:.3f}")
    return ", ".join(parts)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--plots/--no-plots", default=True, show_default=True, help="Also (re)write each run's plots.")
def report(runs: tuple[Path, ...], plots: bool) -> None:
    """Print a markdown table (rate, 95% interval, n per cell) for finished runs."""
    from .report import report_runs

    click.echo(report_runs(runs, plots))


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


if __name__ == "__main__":
    main()
