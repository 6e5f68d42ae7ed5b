"""One checkpoint's evaluation as a job, and where jobs run: here, or through `submitit`.

`EvalJob` is what `evalsuite watch` was told to run (a task with its `-T` parameters, or a
suite) and how (`-M`, device, batch size, limit, seed, trackers); called with a checkpoint
folder, it runs exactly what `evalsuite run --model CHECKPOINT` runs, into the same `--out`
folder, so the run folders, their names and their resume are the same wherever the job ran.

Executors:

- `local` (the default): each job in the watcher's own process, one at a time;
- `slurm`: one SLURM job per checkpoint through `submitit`, with the resources given as
  `--executor-option key=value` (submitit's own names: timeout_min, gpus_per_node,
  cpus_per_task, mem_gb, slurm_partition...); its logs go under OUT/watch/jobs;
- `local-submitit`: the same submitit path with its local executor (a process per job on this
  machine): what tests a cluster set-up without a cluster.

A job returns what it made, or the one-line reason it failed (a checkpoint that does not
load): a failure is the checkpoint's, never the watcher's. A run folder that another process
holds (a second watcher on the same OUT) is neither: the job says it is busy, and the watcher
tries the checkpoint again at a later look.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, first_line

EXECUTORS = ("local", "local-submitit", "slurm")


@dataclass(frozen=True)
class EvalJob:
    """What to evaluate each checkpoint with: `task` and its `params`, or `suite`."""

    out: str
    task: str | None = None
    suite: str | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    model_options: Mapping[str, str] = field(default_factory=dict)
    device: str = "auto"
    batch_size: int = 8
    limit: int | None = None
    seed: int | None = None
    log_to: tuple[str, ...] = ()
    scale: str | None = None
    data_dir: str | None = None
    progress: bool = False

    def digest(self) -> str:
        """What the records depend on (not where or how fast they are made): another task, other
        parameters or another limit in the same OUT are other evaluations of each checkpoint."""
        import hashlib
        import json

        what = [self.task, self.suite, dict(self.params), dict(self.model_options), self.limit, self.seed,
                self.scale, self.data_dir]
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def run(self, checkpoint: str) -> list[Path]:
        """The run folders of `checkpoint`, made (or resumed, or found finished)."""
        from evalsuite.engine.runner import RunOptions, make_task, run_models
        from evalsuite.integrations.trackers import tracker_hook

        out = Path(self.out)
        options = RunOptions(out=out, limit=self.limit, progress=self.progress, chunk=self.batch_size,
                             finished=tracker_hook(self.log_to, out))
        if self.suite is None:
            assert self.task is not None, "a job has a task or a suite"
            task = make_task(self.task, self.params, self.seed)
            runs = run_models(task, [checkpoint], self.model_options, self.device, self.batch_size, options)
            return [run.path for run in runs]
        from evalsuite.engine.suite_run import run_suite
        from evalsuite.engine.suites import SuiteSettings, load_suite
        from evalsuite.runs.suite_result import suite_runs

        settings = SuiteSettings(scale=self.scale, data_dir=Path(self.data_dir) if self.data_dir else None)
        files = run_suite(load_suite(self.suite, self.seed, settings), [checkpoint], self.model_options, self.device,
                          self.batch_size, options)
        return [folder for result in files for _, folder in suite_runs(result)]

    def check(self) -> None:
        """What would make every job fail, refused before the first: an unknown task, a bad -T, a
        tracker without its package, a suite that does not load."""
        from evalsuite.engine.runner import make_task
        from evalsuite.integrations.trackers import check_trackers

        check_trackers(self.log_to)
        if self.suite is None:
            assert self.task is not None, "a job has a task or a suite"
            make_task(self.task, self.params, self.seed)
            return
        from evalsuite.engine.suites import SuiteSettings, load_suite

        load_suite(self.suite, self.seed, SuiteSettings(scale=self.scale,
                                                        data_dir=Path(self.data_dir) if self.data_dir else None))


def run_job(job: EvalJob, checkpoint: str) -> dict[str, Any]:
    """A job's outcome as plain data (what a submitit job sends back): {"runs": [...]}, {"error": why},
    or {"busy": why} when another process is writing one of its run folders (a wait, not a failure)."""
    from evalsuite.runs.records import RunBusy

    try:
        return {"runs": [str(path) for path in job.run(checkpoint)]}
    except KeyboardInterrupt:
        raise
    except RunBusy as exc:
        return {"busy": str(exc)}
    except UserError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # a checkpoint that breaks the model code: recorded, the watcher goes on
        return {"error": f"{type(exc).__name__}: {first_line(exc)}"}


Outcome = Callable[[], dict[str, Any]]  # waits for a job and returns run_job's answer


class LocalExecutor:
    """Each job in this process, when its outcome is asked for (so jobs run one at a time, in order)."""

    def __init__(self, job: EvalJob):
        self.job = job

    def submit(self, checkpoint: Path) -> Outcome:
        return lambda: run_job(self.job, str(checkpoint))


class SubmititExecutor:
    """Each job through submitit: SLURM, or submitit's local executor."""

    def __init__(self, job: EvalJob, cluster: str, options: Mapping[str, Any]):
        try:
            import submitit
        except ImportError:
            raise UserError(f'--executor {cluster} needs submitit: pip install "evalsuite[watch]"') from None
        self.job, self.cluster = job, cluster
        folder = Path(job.out) / "watch" / "jobs" / "%j"
        try:
            self.executor = submitit.AutoExecutor(folder=folder, cluster="local" if cluster == "local-submitit"
                                                  else cluster)
        except RuntimeError as exc:  # submitit's words for a machine without the scheduler's commands
            raise UserError(f"--executor {cluster}: {first_line(exc)}") from None
        try:
            self.executor.update_parameters(**dict(options))
        except (ValueError, TypeError, NameError) as exc:  # submitit's words for an unknown resource name
            raise UserError(f"--executor-option: {first_line(exc)}") from None

    def submit(self, checkpoint: Path) -> Outcome:
        import submitit

        try:
            handle = self.executor.submit(run_job, self.job, str(checkpoint))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # sbatch refused it: a set-up to fix
            raise UserError(f"--executor {self.cluster} could not submit {checkpoint.name}: {first_line(exc)}") from None
        print(f"submitted {checkpoint.name}: job {handle.job_id}", file=sys.stderr)

        def outcome() -> dict[str, Any]:
            try:
                answer: dict[str, Any] = handle.result()
            except submitit.core.utils.UncompletedJobError as exc:  # killed, out of time, never started
                return {"error": f"job {handle.job_id} did not finish: {first_line(exc)}"}
            except submitit.core.utils.FailedJobError as exc:
                lines = [line for line in str(exc).splitlines() if line.strip()]
                return {"error": f"job {handle.job_id} failed: {lines[-1] if lines else 'no reason given'}"}
            return answer

        return outcome


def executor_for(job: EvalJob, name: str, options: Mapping[str, Any]) -> LocalExecutor | SubmititExecutor:
    if name not in EXECUTORS:
        from evalsuite.errors import unknown

        raise unknown("executor", name, EXECUTORS)
    if name == "local":
        if options:
            raise UserError("--executor-option is for --executor slurm or local-submitit")
        return LocalExecutor(job)
    return SubmititExecutor(job, name, options)
