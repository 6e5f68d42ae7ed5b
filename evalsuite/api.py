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

from evalsuite.analysis.tolerances import DEFAULT_MAX_DROP, EFFECTIVE_BASE, EFFECTIVE_FLOOR, EFFECTIVE_SHARE
from evalsuite.engine.multi import compare_models, compare_suite_models, distinct_models
from evalsuite.engine.run_steps import FriendlyFlag, Scored, friendly_flags, score_runs, step_for
from evalsuite.integrations.watch_loop import watch_folder as watch  # noqa: F401  (evalsuite watch)
from evalsuite.runs.records import RunFolder, open_run

from .errors import UserError
from .params import option_text

if TYPE_CHECKING:
    import pandas as pd

    from evalsuite.analysis.check import CheckResult
    from evalsuite.analysis.compare import Comparison
    from evalsuite.analysis.trend import TrendResult



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
        prefix_cache: bool = True, allow_version_change: bool = False, **more: Any) -> Results:
    """Run (or resume) `task` on each model, as `evalsuite run` does; the task's parameters are
    Python values, as keywords (`lengths=[256, 512]`, `preset="paper-4k"`) or in `params` (for names
    this function takes itself, like `seed`). `step` holds the task's run-step options by name
    (`{"judge": "lexical"}`, as `--judge lexical`). Two or more models: each is compared with the
    `baseline` (the first model unless named; `engine/multi.py`), three or more drawn in one grid too.
    `checkpoint_step` is the training step (`--step`); None reads it from the checkpoint folder.
    `log_to` names trackers ("wandb", "tensorboard") each finished run folder is sent to; `prefix_cache`
    False encodes every prompt whole on adapters that would reuse a shared prefix (the same results).
    A run resumed under other library versions than its records so far is refused unless
    `allow_version_change` (`--allow-version-change`; config.json then says which versions wrote which)."""
    from evalsuite.engine.distributed import world_from_env
    from evalsuite.engine.runner import RunOptions, make_task, run_models
    from evalsuite.integrations.trackers import tracker_hook  # --log-to: packages checked before any run

    specs = distinct_models(models, out, baseline)  # a wrong --baseline is refused before any model runs
    task_obj = make_task(task, {k: option_text(v) for k, v in {**(params or {}), **more}.items()}, seed)
    run_step = step_for(task_obj, step or {}, out=Path(out), device=device, batch_size=batch_size)
    options = RunOptions(out=Path(out), limit=limit, log_prompts=log_prompts, progress=progress, chunk=batch_size,
                         step=run_step, checkpoint_step=checkpoint_step, finished=tracker_hook(log_to, Path(out)),
                         prefix_cache=prefix_cache, allow_version_change=allow_version_change)
    backend_options = {k: option_text(v) for k, v in (model_options or {}).items()}
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
                batch_size=batch_size, seed=seed, model_options={k: option_text(v) for k, v in (model_options or {}).items()},
                params={k: option_text(v) for k, v in (params or {}).items()}, scale=scale,
                data_dir=Path(data_dir) if data_dir is not None else None, step=dict(step or {}))


def load(*run_folders: str | Path) -> Results:
    """Finished run folders read back (no model, no torch)."""
    return Results(runs=tuple(open_run(folder) for folder in run_folders))


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
              step: Mapping[str, Any] | None = None, prefix_cache: bool = True,
              allow_version_change: bool = False) -> SuiteResults:
    """Every task of a suite (a TOML file or a shipped suite's name) on each model, as
    `evalsuite run --suite` does; two or more models: each model's runs compared with the baseline's
    (as `run` does) entry by entry. `scale` picks the suite's [run.scale.NAME] parameters, `data_dir`
    fills its {data_dir} paths, and `step` (`{"judge": "lexical"}`) is the run step of the entries
    whose task declares those options (`engine/suite_run.py`); `allow_version_change` as for `run`."""
    from evalsuite.engine.distributed import world_from_env
    from evalsuite.engine.runner import RunOptions
    from evalsuite.engine.suite_run import run_suite as run_entries
    from evalsuite.engine.suite_run import with_steps
    from evalsuite.engine.suites import SuiteSettings, load_suite
    from evalsuite.integrations.trackers import tracker_hook
    from evalsuite.runs.suite_result import skipped_entries, suite_runs

    specs = distinct_models(models, out, baseline)  # a wrong --baseline is refused before any model runs
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder")
    given = dict(step or {})
    settings = SuiteSettings(scale=scale, data_dir=Path(data_dir) if data_dir is not None else None, step=given)
    loaded = with_steps(load_suite(suite, seed, settings), given, out=Path(out), device=device, batch_size=batch_size)
    options = RunOptions(out=Path(out), limit=limit, log_prompts=log_prompts, progress=progress, chunk=batch_size,
                         checkpoint_step=checkpoint_step, finished=tracker_hook(log_to, Path(out)),
                         prefix_cache=prefix_cache, allow_version_change=allow_version_change)
    backend_options = {k: option_text(v) for k, v in (model_options or {}).items()}
    files = run_entries(loaded, specs, backend_options, device, batch_size, options)
    if not world_from_env().main:
        return SuiteResults(name=loaded.name, results=(), main=False)
    results = tuple(SuiteResult(path, tuple(suite_runs(path))) for path in files)
    compared = compare_suite_models(specs, [r.path for r in results], [r.runs for r in results], baseline, out)
    skipped = tuple(skipped_entries(results[0].path)) if results else ()
    return SuiteResults(name=loaded.name, results=results, comparisons=compared.folders, grids=compared.grids,
                        skipped=skipped)


# ---- run steps: options the tasks add (engine/run_steps.py), and `score` ----------------------


def step_flags() -> list[FriendlyFlag]:
    """The flags the registered tasks name for their run-step options (`--judge`), for the command line."""
    return friendly_flags()


def score(runs: Sequence[str | Path], step: Mapping[str, Any], *, device: str = "auto", batch_size: int = 8,
          progress: bool = False, on_run: Callable[[Path, str], None] | None = None) -> Scored:
    """Apply the run step that `step` asks for (`{"judge": "openai:gpt-4o"}`) to finished runs, again,
    without loading the evaluated model, and rewrite their summaries; `on_run(path, line)` hears of
    each run as it is done."""
    return score_runs(runs, step, device=device, batch_size=batch_size, progress=progress, on_run=on_run)


# ---- reading finished runs -------------------------------------------------------------------


def report(runs: Sequence[str | Path], *, plots: bool = True, effective_share: float = EFFECTIVE_SHARE,
           effective_base: Sequence[int] = EFFECTIVE_BASE, effective_floor: float = EFFECTIVE_FLOOR) -> str:
    """Markdown tables (rate, 95% interval, n per cell) for finished runs or suite results;
    each run's plots rewritten when `plots`; a length-swept run's effective length is the longest
    length from the last of `effective_base` whose score keeps `effective_share` of the base score (the
    score over the `effective_base` lengths), not measurable under a base of `effective_floor`:
    NoLiMa's 85% and 250, 500 and 1000 tokens by default (docs/nolima.md)."""
    from evalsuite.analysis.effective_length import definition
    from evalsuite.analysis.report import report_runs
    from evalsuite.runs.suite_result import run_folders

    effective = definition(effective_share, effective_base, effective_floor)
    return report_runs(run_folders(runs), plots, effective)


def html_report(runs: Sequence[str | Path], out_file: str | Path) -> Path:
    """One self-contained HTML page for finished runs or suite results; returns its path."""
    from evalsuite.analysis.html import write_html_report
    from evalsuite.runs.suite_result import run_folders

    return write_html_report(run_folders(runs), out_file)


def paper_report(results: str | Path, *, out: str | Path | None = None, baseline: str | None = None) -> Any:
    """The report shaped like the Differential Transformer paper from the diff-paper suite's results in
    `results`: one HTML page (`out`, default RESULTS/paper-report.html) and a markdown file beside it.
    Returns what was written (`.html`, `.markdown`, `.sections`)."""
    from evalsuite.paper import write_paper_report

    return write_paper_report(results, out, baseline)


def compare(run_a: str | Path, run_b: str | Path, *, out: str | Path = "results", alpha: float = 0.05,
            effective_share: float = EFFECTIVE_SHARE, effective_base: Sequence[int] = EFFECTIVE_BASE,
            effective_floor: float = EFFECTIVE_FLOOR) -> list[tuple[Comparison, Path]]:
    """Paired comparison of two runs (or two suite results, run by run), each written under `out`;
    effective lengths as in `report`, with the paired tests of both models' base scores and of each length."""
    from evalsuite.analysis.compare import compare_inputs
    from evalsuite.analysis.effective_length import definition

    if not str(out).strip():
        raise UserError("out must name a folder (an empty name would write into the current folder)")
    if Path(run_a).resolve() == Path(run_b).resolve():
        raise UserError(f"compare needs two different runs; both are {run_a}")
    return compare_inputs(run_a, run_b, out, alpha, definition(effective_share, effective_base, effective_floor))


def check(candidate: str | Path, baseline: str | Path, *, max_drop: float = DEFAULT_MAX_DROP,
          max_drop_by_metric: Mapping[str, float] | None = None, metrics: Sequence[str] = (), alpha: float = 0.05,
          require_non_inferiority: bool = False, allow_unjudged: bool = False,
          detects: str = "persist") -> CheckResult:
    """The regression gate: `.failed` lists the rows (metric, cell) of `candidate` that dropped below
    `baseline` (a run folder, suite result or baseline file) by more than their tolerance beyond noise:
    `max_drop`, or a metric's own in `max_drop_by_metric`. The task's primary metric is gated, and
    `metrics` too; runs with unjudged samples are refused unless `allow_unjudged`. `detects` is the
    alternative the table's detectable drop assumes: `persist` (ordinary disagreements persist, the
    conservative one) or `turn` (every disagreement turns against the candidate)."""
    from evalsuite.analysis.check import check as gate
    from evalsuite.analysis.tolerances import Tolerances

    tolerances = Tolerances(max_drop, dict(max_drop_by_metric or {}))
    return gate(candidate, baseline, tolerances, alpha, require_non_inferiority, metrics, allow_unjudged,
                alternative=detects)


def version_note(inputs: Sequence[str | Path], *, refuse: bool = False) -> str | None:
    """One line naming every difference of code (evalsuite, task versions, transformers, torch, lm-eval)
    among the runs `inputs` hold, None when they agree; with `refuse`, a UserError (`--same-versions`)."""
    from evalsuite.runs.versions import versions_note

    return versions_note(inputs, refuse=refuse)


def parse_max_drop(values: Sequence[str]) -> tuple[float, dict[str, float]]:
    """`--max-drop` texts ("0.02", "nll=0.05") as (the default tolerance, tolerances by metric)."""
    from evalsuite.analysis.tolerances import parse_max_drop as parse

    tolerances = parse(values)
    return tolerances.default, dict(tolerances.by_metric)


def trend(runs: Sequence[str | Path], *, out: str | Path = "trend", gate: str | None = None,
          max_drop: float = DEFAULT_MAX_DROP, max_drop_by_metric: Mapping[str, float] | None = None,
          metrics: Sequence[str] = (), alpha: float = 0.05,
          allow_unjudged: bool = False, latest_only: bool = False, pooled_only: bool = False) -> TrendResult:
    """Each metric against the training step for the runs with a step in `runs` (run folders, results
    folders, suite results), written under `out` (trend.csv, trend.md, trend_<metric>.png); with
    `gate` ("previous" or "best") every checkpoint checked against an earlier one as `check` does:
    `.failed` lists the checkpoints that regressed."""
    from evalsuite.analysis.tolerances import Tolerances
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
    from evalsuite.analysis.outcomes import export_baseline as export
    from evalsuite.analysis.outcomes import load_outcomes

    export(load_outcomes(candidate), Path(path), str(candidate))
    return Path(path)


def trend_text(result: TrendResult, *, most: int = 20) -> str:
    """What `evalsuite trend` prints of a trend: each series' table, then the gate's lines (`most` failures)."""
    from evalsuite.analysis.trend import gate_lines, series_tables

    return "\n".join(series_tables(result, cells=False) + gate_lines(result, most=most)).rstrip()


# ---- more commands: view, log, export, convert, lm-eval ------------------------------------------


def write_view(results: str | Path, out_file: str | Path) -> Path:
    """The viewer's page of a results folder as one self-contained HTML file; returns its path."""
    from evalsuite import viewer

    return Path(viewer.write_page(Path(results), Path(out_file)))


def serve_view(results: str | Path, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve the viewer of a results folder on 127.0.0.1:`port` until interrupted; `on_ready(url)` first."""
    from evalsuite import viewer

    server = viewer.make_server(Path(results), port)
    on_ready(server.url)
    viewer.serve(server)


def log(runs: Sequence[str | Path], trackers: Sequence[str], *, tensorboard_dir: str | Path | None = None,
        project: str | None = None, on_sent: Callable[[Path, str, str], None] | None = None) -> list[str]:
    """Send finished runs (folders or suite results) to W&B or TensorBoard; returns where each went."""
    from evalsuite.integrations.trackers import log_runs
    from evalsuite.runs.suite_result import run_folders

    return log_runs(run_folders(runs), trackers, tensorboard_dir=Path(tensorboard_dir) if tensorboard_dir else None,
                    project=project, on_sent=on_sent)


def export(runs: Sequence[str | Path], out: str | Path, *, fmt: str = "lm-eval") -> list[Path]:
    """Finished runs (folders or suite results) in another tool's layout under `out`: lm-eval's."""
    from evalsuite.integrations.lmeval_export import export_runs
    from evalsuite.runs.suite_result import run_folders

    if not str(out).strip():
        raise UserError("--out must name a folder")
    if fmt != "lm-eval":
        raise UserError(f"unknown export format {fmt!r}; formats: lm-eval")
    return export_runs(run_folders(runs), out)


def convert(state_dict: str | Path, out: str | Path, *, key_map: str | None = None,
            config_file: str | Path | None = None, arch: str | None = None, fields: Mapping[str, str] | None = None,
            tokenizer: str | Path | None = None, allow_pickle: bool = False) -> Any:
    """A plain state dict into a folder transformers loads (`modeling/convert.py`): tensors renamed by
    `key_map`, the config from `config_file` and/or `arch` with `fields` over it. Returns what was
    written (`.folder`, `.model_type`, `.tensors`, `.parameters`)."""
    from evalsuite.modeling.convert import convert as convert_state_dict

    return convert_state_dict(Path(state_dict), Path(out), key_map=key_map,
                              config_file=Path(config_file) if config_file is not None else None, arch=arch,
                              fields=fields, tokenizer=Path(tokenizer) if tokenizer is not None else None,
                              allow_pickle=allow_pickle)


def lm_eval(args: Sequence[str]) -> None:
    """lm-eval's own command line with evalsuite's model registered (`integrations/lmeval.py`)."""
    try:
        from evalsuite.integrations.lmeval import run_lm_eval_cli
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "lm_eval":
            raise
        raise UserError('evalsuite lm-eval needs lm-eval: pip install "evalsuite[lmeval]"') from None
    run_lm_eval_cli(args)


def describe() -> dict[str, Any]:
    """The registered tasks (with their presets), named models, backends and shipped suites."""
    from evalsuite.engine.suites import shipped_suites

    from .registry import describe as registered

    return {**registered(), "suites": shipped_suites()}
