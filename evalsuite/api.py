"""The Python API: run, score, report, compare and check, as the command line does them.

The command line is a thin layer over these functions, so a notebook and `evalsuite run`
produce the same run folders, records, summaries and comparisons (`watch`: integrations/watch_loop.py).

    import evalsuite
    results = evalsuite.run("needle", ["toy-diff", "toy-base"], lengths=[256, 512])
    results.frame.groupby(["model", "context_length"])["correct_all"].mean()

Heavy modules (pandas, the runner, the backends) load in the functions that need them: importing this stays light.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.engine.multi import compare_models, compare_suite_models, distinct_models
from evalsuite.engine.records import RunFolder, open_run
from evalsuite.integrations.watch_loop import watch_folder as watch  # noqa: F401  (evalsuite watch)

from .errors import UserError, unknown

if TYPE_CHECKING:
    import pandas as pd

    from evalsuite.analysis.check import CheckResult
    from evalsuite.analysis.compare import Comparison
    from evalsuite.analysis.trend import TrendResult

    from .contracts import RunStep, TaskOption


@dataclass(frozen=True)
class Results:
    """Finished runs: their folders, their summaries and one tidy frame (a row per sample)."""

    runs: tuple[RunFolder, ...]
    comparison: Path | None = None  # two models: the comparison folder written under `out`
    step_table: str | None = None  # markdown of the run step's results (judged accuracy), when one ran
    main: bool = True  # False on the other ranks under torchrun, where rank 0 reports
    # two or more models: (model, its comparison folder with the baseline) each, and for three or more the grid
    comparisons: tuple[tuple[str, Path], ...] = ()
    grid: Path | None = None
    baseline: str | None = None  # the model every other one is compared with

    @cached_property
    def frame(self) -> pd.DataFrame:
        from evalsuite.analysis.frame import load_frame

        return load_frame([r.path for r in self.runs])

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [json.loads(run.summary_path.read_text(encoding="utf-8")) for run in self.runs]

    @property
    def paths(self) -> list[Path]:
        return [run.path for run in self.runs]


def run(task: str, models: str | Sequence[str], *, out: str | Path = "results", limit: int | None = None,
        device: str = "auto", batch_size: int = 8, seed: int | None = None,
        model_options: Mapping[str, Any] | None = None, log_prompts: bool = False, progress: bool = False,
        step: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
        checkpoint_step: int | None = None, baseline: str | None = None, log_to: Sequence[str] = (),
        **more: Any) -> Results:
    """Run (or resume) `task` on each model, as `evalsuite run` does; the task's parameters are
    Python values, as keywords (`lengths=[256, 512]`, `preset="paper-4k"`) or in `params` (for names
    this function takes itself, like `seed`). `step` holds the task's run-step options by name
    (`{"judge": "lexical"}`, as `--judge lexical`). Two or more models: each is compared with the
    `baseline` (the first model unless named; `engine/multi.py`), three or more drawn in one grid too.
    `checkpoint_step` is the training step (`--step`); None reads it from the checkpoint folder.
    `log_to` names trackers ("wandb", "tensorboard") each finished run folder is sent to."""
    from evalsuite.engine.distributed import world_from_env
    from evalsuite.engine.runner import RunOptions, make_task, run_models
    from evalsuite.integrations.trackers import tracker_hook  # --log-to: packages checked before any run

    specs = distinct_models(models, out, baseline)  # a wrong --baseline is refused before any model runs
    task_obj = make_task(task, {k: _option_text(v) for k, v in {**(params or {}), **more}.items()}, seed)
    run_step = _step_for(task_obj, step or {}, out=Path(out), device=device, batch_size=batch_size)
    options = RunOptions(out=Path(out), limit=limit, log_prompts=log_prompts, progress=progress, chunk=batch_size,
                         step=run_step, checkpoint_step=checkpoint_step, finished=tracker_hook(log_to, Path(out)))
    backend_options = {k: _option_text(v) for k, v in (model_options or {}).items()}
    runs = tuple(run_models(task_obj, specs, backend_options, device, batch_size, options))
    if not world_from_env().main:
        return Results(runs=runs, main=False)
    paths = [r.path for r in runs]
    table = run_step.table(paths) if run_step is not None else None
    compared = compare_models(specs, paths, baseline, out)
    comparison = compared.folders[0][1] if len(compared.folders) == 1 else None
    return Results(runs=runs, comparison=comparison, step_table=table, comparisons=compared.folders,
                   grid=compared.grid, baseline=compared.baseline)


def dry_run(task: str | None, models: str | Sequence[str], *, suite: str | Path | None = None, limit: int | None = None,
            device: str = "auto", batch_size: int = 8, seed: int | None = None,
            model_options: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
            scale: str | None = None, data_dir: str | Path | None = None, step: Mapping[str, Any] | None = None) -> str:
    """The plan of `run` (or of `run_suite` with `suite`, `scale`, `data_dir` and the run-step options
    `step`) and a time estimate measured on each loaded model, without running or writing anything."""
    from evalsuite.engine.plan_cost import dry_run as plan

    return plan(task, [models] if isinstance(models, str) else list(models), suite=suite, limit=limit, device=device,
                batch_size=batch_size, seed=seed, model_options={k: _option_text(v) for k, v in (model_options or {}).items()},
                params={k: _option_text(v) for k, v in (params or {}).items()}, scale=scale,
                data_dir=Path(data_dir) if data_dir is not None else None, step=dict(step or {}))


def load(*run_folders: str | Path) -> Results:
    """Finished run folders read back (no model, no torch)."""
    return Results(runs=tuple(open_run(folder) for folder in run_folders))


def _option_text(value: Any) -> str:
    """A Python value as the `key=value` text the CLI would take."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(v) for v in value)
    return str(value)


# ---- suites ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteResult:
    """One model's suite result file and its runs, by entry name."""

    path: Path
    runs: tuple[tuple[str, Path], ...]


@dataclass(frozen=True)
class SuiteResults:
    name: str
    results: tuple[SuiteResult, ...]  # one per model, in the order given
    comparisons: tuple[tuple[str, Path], ...] = ()  # two or more models: (entry name, comparison folder)
    main: bool = True  # False on the other ranks under torchrun, where rank 0 reports
    grids: tuple[tuple[str, Path], ...] = ()  # three or more models: (entry name, grid folder)
    skipped: tuple[tuple[str, str], ...] = ()  # (entry name, what to provide) of optional entries left out


def run_suite(suite: str | Path, models: str | Sequence[str], *, out: str | Path = "results",
              limit: int | None = None, device: str = "auto", batch_size: int = 8, seed: int | None = None,
              model_options: Mapping[str, Any] | None = None, log_prompts: bool = False,
              progress: bool = False, checkpoint_step: int | None = None, baseline: str | None = None,
              log_to: Sequence[str] = (), scale: str | None = None, data_dir: str | Path | None = None,
              step: Mapping[str, Any] | None = None) -> SuiteResults:
    """Every task of a suite (a TOML file or a shipped suite's name) on each model, as
    `evalsuite run --suite` does; two or more models: each model's runs compared with the baseline's
    (as `run` does) entry by entry. `scale` picks the suite's [run.scale.NAME] parameters, `data_dir`
    fills its {data_dir} paths, and `step` (`{"judge": "lexical"}`) is the run step of the entries
    whose task declares those options (`engine/suite_scales.py`)."""
    from evalsuite.analysis.inputs import suite_runs
    from evalsuite.engine.distributed import world_from_env
    from evalsuite.engine.runner import RunOptions
    from evalsuite.engine.suite_scales import SuiteSettings
    from evalsuite.engine.suites import load_suite, skipped_entries
    from evalsuite.engine.suites import run_suite as run_entries
    from evalsuite.integrations.trackers import tracker_hook

    specs = distinct_models(models, out, baseline)  # a wrong --baseline is refused before any model runs
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder")
    given = dict(step or {})
    settings = SuiteSettings(scale=scale, data_dir=Path(data_dir) if data_dir is not None else None, step=given)
    loaded = _with_steps(load_suite(suite, seed, settings), given, Path(out), device, batch_size)
    options = RunOptions(out=Path(out), limit=limit, log_prompts=log_prompts, progress=progress, chunk=batch_size,
                         checkpoint_step=checkpoint_step, finished=tracker_hook(log_to, Path(out)))
    backend_options = {k: _option_text(v) for k, v in (model_options or {}).items()}
    files = run_entries(loaded, specs, backend_options, device, batch_size, options)
    if not world_from_env().main:
        return SuiteResults(name=loaded.name, results=(), main=False)
    results = tuple(SuiteResult(path, tuple(suite_runs(path))) for path in files)
    compared = compare_suite_models(specs, [r.path for r in results], [r.runs for r in results], baseline, out)
    skipped = tuple(skipped_entries(results[0].path)) if results else ()
    return SuiteResults(name=loaded.name, results=results, comparisons=compared.folders, grids=compared.grids,
                        skipped=skipped)


def _with_steps(suite: Any, given: Mapping[str, Any], out: Path, device: str, batch_size: int) -> Any:
    """The suite with each entry's run step built from the run-step options `given` (`suite_scales.with_steps`)."""
    from evalsuite.engine.suite_scales import with_steps

    def build(task: Any, mine: Mapping[str, Any]) -> RunStep | None:
        return _step_for(task, mine, out=out, device=device, batch_size=batch_size)

    return with_steps(suite, given, build, lambda key: _owners().get(key, (key, ())))


# ---- run steps: options the tasks add, and `score` ---------------------------------------------


def step_options() -> dict[str, tuple[TaskOption, tuple[str, ...]]]:
    """Every run-step option of the registered tasks, by flag (the first task's settings win),
    with the names of the tasks that take it."""
    from .registry import TASKS, load_all

    load_all()
    found: dict[str, tuple[TaskOption, tuple[str, ...]]] = {}
    for name, cls in sorted(TASKS.items()):
        for option in cls.options:
            first, owners = found.get(option.flag, (option, ()))
            found[option.flag] = (first, (*owners, name))
    return found


def _step_for(task: Any, given: Mapping[str, Any], *, out: Path, device: str, batch_size: int) -> RunStep | None:
    """The task's run step for the `given` option values (the others take their defaults)."""
    _refuse_undeclared(task, given)
    values = {option.key: given.get(option.key, _default(option)) for option in task.options}
    step: RunStep | None = task.run_step(values, out=out, device=device, batch_size=batch_size)
    return step


def _default(option: TaskOption) -> Any:
    settings = option.settings
    if "default" in settings:
        return settings["default"]
    return () if settings.get("multiple") else False if settings.get("is_flag") else None


def _owners() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Option name -> (its flag, the tasks that take it)."""
    return {option.key: (option.flag, names) for option, names in step_options().values()}


def _refuse_undeclared(task: Any, given: Mapping[str, Any], where: str = "") -> None:
    """One line for a step option that the task does not take (`where`: the run it was made for)."""
    declared = {option.key for option in task.options}
    for key in given:
        if key in declared:
            continue
        owners = _owners()
        if key not in owners:
            raise unknown("run-step option", key, owners)
        if where:
            raise UserError(f"task {task.name}{where} has no judging step")
        flag, names = owners[key]
        raise UserError(f"task {task.name} has no judging step; {flag} is for tasks such as {', '.join(names)}")


@dataclass(frozen=True)
class Scored:
    """What `score` did: one line per run, then the step's table over all of them."""

    paths: tuple[Path, ...]
    lines: tuple[str, ...]
    table: str


def score(runs: Sequence[str | Path], step: Mapping[str, Any], *, device: str = "auto", batch_size: int = 8,
          progress: bool = False, on_run: Callable[[Path, str], None] | None = None) -> Scored:
    """Apply the run step that `step` asks for (`{"judge": "openai:gpt-4o"}`) to finished runs, again,
    without loading the evaluated model, and rewrite their summaries; `on_run(path, line)` hears of
    each run as it is done."""
    from evalsuite.engine.runner import finish

    from .registry import task_for_run

    folders = [open_run(path) for path in runs]
    tasks = []
    for folder in folders:
        if not folder.complete:
            raise UserError(f"run {folder.path} is not complete (no summary.json); rerun its command to finish it")
        task = task_for_run(folder)
        if not task.options:
            raise UserError(f"task {task.name} of {folder.path} has no judging step")
        _refuse_undeclared(task, step, f" of {folder.path}")
        tasks.append(task)
    # one step serves every run (what it loads, it loads once): a RunStep applies to any finished run
    built = _step_for(tasks[0], step, out=folders[0].path.parent, device=device, batch_size=batch_size)
    if built is None:
        raise UserError(f"nothing to do: give {tasks[0].options[0].flag} (see `evalsuite score --help`)")
    lines = []
    for folder in folders:
        line = built.apply(folder, progress)
        finish(task_for_run(folder), folder)
        lines.append(line)
        if on_run is not None:
            on_run(folder.path, line)
    paths = tuple(f.path for f in folders)
    return Scored(paths=paths, lines=tuple(lines), table=built.table(list(paths)))


# ---- reading finished runs -------------------------------------------------------------------


def report(runs: Sequence[str | Path], *, plots: bool = True) -> str:
    """Markdown tables (rate, 95% interval, n per cell) for finished runs or suite results;
    each run's plots rewritten when `plots`."""
    from evalsuite.analysis.inputs import run_folders
    from evalsuite.analysis.report import report_runs

    return report_runs(run_folders(runs), plots)


def html_report(runs: Sequence[str | Path], out_file: str | Path) -> Path:
    """One self-contained HTML page for finished runs or suite results; returns its path."""
    from evalsuite.analysis.html import write_html_report
    from evalsuite.analysis.inputs import run_folders

    return write_html_report(run_folders(runs), out_file)


def paper_report(results: str | Path, *, out: str | Path | None = None, baseline: str | None = None) -> Any:
    """The report shaped like the Differential Transformer paper from the diff-paper suite's results in
    `results`: one HTML page (`out`, default RESULTS/paper-report.html) and a markdown file beside it.
    Returns what was written (`.html`, `.markdown`, `.sections`)."""
    from evalsuite.analysis.paper import write_paper_report

    return write_paper_report(results, out, baseline)


def compare(run_a: str | Path, run_b: str | Path, *, out: str | Path = "results",
            alpha: float = 0.05) -> list[tuple[Comparison, Path]]:
    """Paired comparison of two runs (or two suite results, run by run), each written under `out`."""
    from evalsuite.analysis.compare import compare_inputs

    if not str(out).strip():
        raise UserError("out must name a folder (an empty name would write into the current folder)")
    if Path(run_a).resolve() == Path(run_b).resolve():
        raise UserError(f"compare needs two different runs; both are {run_a}")
    return compare_inputs(run_a, run_b, out, alpha)


def check(candidate: str | Path, baseline: str | Path, *, max_drop: float = 0.02,
          max_drop_by_metric: Mapping[str, float] | None = None, metrics: Sequence[str] = (), alpha: float = 0.05,
          require_non_inferiority: bool = False, allow_unjudged: bool = False) -> CheckResult:
    """The regression gate: `.failed` lists the rows (metric, cell) of `candidate` that dropped below
    `baseline` (a run folder, suite result or baseline file) by more than their tolerance beyond noise:
    `max_drop`, or a metric's own in `max_drop_by_metric`. The task's primary metric is gated, and
    `metrics` too; runs with unjudged samples are refused unless `allow_unjudged`."""
    from evalsuite.analysis.check import Tolerances
    from evalsuite.analysis.check import check as gate

    tolerances = Tolerances(max_drop, dict(max_drop_by_metric or {}))
    return gate(candidate, baseline, tolerances, alpha, require_non_inferiority, metrics, allow_unjudged)


def version_note(inputs: Sequence[str | Path], *, refuse: bool = False) -> str | None:
    """One line naming every difference of code (evalsuite, task versions, transformers, torch, lm-eval)
    among the runs `inputs` hold, None when they agree; with `refuse`, a UserError (`--same-versions`)."""
    from evalsuite.engine.code_versions import versions_note

    return versions_note(inputs, refuse=refuse)


def parse_max_drop(values: Sequence[str]) -> tuple[float, dict[str, float]]:
    """`--max-drop` texts ("0.02", "nll=0.05") as (the default tolerance, tolerances by metric)."""
    from evalsuite.analysis.check import parse_max_drop as parse

    tolerances = parse(values)
    return tolerances.default, dict(tolerances.by_metric)


def trend(runs: Sequence[str | Path], *, out: str | Path = "trend", gate: str | None = None, max_drop: float = 0.02,
          max_drop_by_metric: Mapping[str, float] | None = None, metrics: Sequence[str] = (), alpha: float = 0.05,
          allow_unjudged: bool = False, latest_only: bool = False, pooled_only: bool = False) -> TrendResult:
    """Each metric against the training step for the runs with a step in `runs` (run folders, results
    folders, suite results), written under `out` (trend.csv, trend.md, trend_<metric>.png); with
    `gate` ("previous" or "best") every checkpoint checked against an earlier one as `check` does:
    `.failed` lists the checkpoints that regressed."""
    from evalsuite.analysis.check import Tolerances
    from evalsuite.analysis.trend import trend as series_trend

    tolerances = Tolerances(max_drop, dict(max_drop_by_metric or {}))
    return series_trend(runs, Path(out), gate_against=gate, tolerances=tolerances, alpha=alpha, metrics=metrics,
                        allow_unjudged=allow_unjudged, latest_only=latest_only, pooled_only=pooled_only)


def publish_check(result: CheckResult, junit: str | Path | None = None) -> None:
    """A check's result into GitHub's step summary when running there, and JUnit XML when asked."""
    from evalsuite.analysis.check import publish

    publish(result, Path(junit) if junit is not None else None)


def export_baseline(candidate: str | Path, path: str | Path) -> Path:
    """The per-sample outcomes of `candidate` as a baseline file for `check` (small enough to commit)."""
    from evalsuite.analysis.check import export_baseline as export
    from evalsuite.analysis.check import load_outcomes

    export(load_outcomes(candidate), Path(path), str(candidate))
    return Path(path)


def describe() -> dict[str, Any]:
    """The registered tasks (with their presets), named models, backends and shipped suites."""
    from evalsuite.engine.suites import shipped_suites

    from .registry import describe as registered

    return {**registered(), "suites": shipped_suites()}
