"""Evaluation inside a training loop: a `transformers.TrainerCallback`, and a Lightning one.

At each save the callback evaluates the checkpoint just written, in one of two ways:

- `mode="process"` (the default): `evalsuite watch OUTPUT_DIR --once` in a child process (on
  `device`, e.g. another GPU), so training goes on while it runs. One child at a time: a save
  made while one runs is picked up by the next, which evaluates every checkpoint not in the
  ledger yet. Nothing waits for a child until training has ended.
- `mode="in-process"`: the task on the trainer's own model object, between two steps (small
  tasks; training waits for it). The model is put in eval mode and back.

Either way the checkpoint goes through the watcher's ledger, trend and gate (OUT/watch,
OUT/trend), and its metrics go into the trainer's log history as `evalsuite/<task>/<metric>`
at the checkpoint's step, as soon as they are known, and into that checkpoint's own
trainer_state.json (the Trainer wrote it before the evaluation). The gate's verdict (and a
checkpoint that could not be evaluated) is said on the training console, not only in the
child's log file.

    from evalsuite.integrations.training import EvalsuiteCallback
    trainer.add_callback(EvalsuiteCallback(task="needle", params={"lengths": [1024]}, out="evals"))
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from evalsuite.engine.watch import Candidate, Ledger
from evalsuite.errors import UserError
from evalsuite.params import option_text
from evalsuite.runs.safe_json import DamagedJSON, read_json

MODES = ("process", "in-process")


class Evaluations:
    """The evaluations of one training run's saves, and the metrics not yet put in its logs."""

    def __init__(self, task: str | None = None, suite: str | None = None, *, out: str | Path = "results",
                 params: Mapping[str, Any] | None = None, model_options: Mapping[str, Any] | None = None,
                 mode: str = "process", device: str = "auto", batch_size: int = 8, limit: int | None = None,
                 watch_args: Sequence[str] = ()):
        if mode not in MODES:
            raise UserError(f"mode must be {' or '.join(MODES)}, got {mode!r}")
        if (task is None) == (suite is None):
            raise UserError("give a task (with its params) or a suite, one of them")
        if mode == "in-process" and task is None:
            raise UserError("mode='in-process' evaluates a task; a suite goes to mode='process'")
        self.task, self.suite, self.mode = task, suite, mode
        self.out = Path(out).resolve()
        self.params = {k: option_text(v) for k, v in (params or {}).items()}
        self.model_options = {k: option_text(v) for k, v in (model_options or {}).items()}
        self.device, self.batch_size, self.limit = device, batch_size, limit
        self.watch_args = tuple(watch_args)  # more `evalsuite watch` options: --webhook URL, --against best...
        self.child: subprocess.Popen[bytes] | None = None
        self.again: Path | None = None  # a save made while a child ran: the folder to look at next
        self.logged: set[str] = set()  # the checkpoints (paths) whose outcome was logged and said
        self.folders: dict[int, Path] = {}  # step -> the checkpoint folder evaluated at it
        self.stamp: tuple[int, int] | None = None  # the ledger's size and modification time when last read

    # ---- a save -----------------------------------------------------------------------------

    def saved(self, folder: Path, step: int, model: Any = None, tokenizer: Any = None) -> None:
        """The checkpoint `folder` (of training `step`) was just written."""
        if self.mode == "in-process":
            self.in_process(folder, step, model, tokenizer)
        elif self.child is not None and self.child.poll() is None:
            self.again = folder.parent
        else:
            self.start(folder.parent)

    def command(self, training_dir: Path) -> list[str]:
        which = ["--task", self.task] if self.task is not None else ["--suite", str(self.suite)]
        # --settle 2: the next save may be under way while the child looks; its files must hold still a moment
        args = [sys.executable, "-m", "evalsuite.cli", "watch", str(training_dir), *which, "--once", "--settle", "2",
                "--out", str(self.out), "--device", self.device, "--batch-size", str(self.batch_size), "--no-progress"]
        args += [item for k, v in self.params.items() for item in ("-T", f"{k}={v}")]
        args += [item for k, v in self.model_options.items() for item in ("-M", f"{k}={v}")]
        return args + (["--limit", str(self.limit)] if self.limit else []) + list(self.watch_args)

    def start(self, training_dir: Path) -> None:
        (self.out / "watch").mkdir(parents=True, exist_ok=True)
        with (self.out / "watch" / "callback.log").open("ab") as log:  # the child's lines, for when one fails
            self.child = subprocess.Popen(self.command(training_dir), stdout=log, stderr=subprocess.STDOUT)
        self.again = None

    def poll(self) -> None:
        """Between steps: a finished child's next round started, when a save came meanwhile."""
        if self.child is not None and self.child.poll() is not None and self.again is not None:
            self.start(self.again)

    def finish(self) -> None:
        """After training: every child waited for, the last saves evaluated too."""
        while self.child is not None:
            self.child.wait()
            self.child = None
            if self.again is not None:
                self.start(self.again)

    def in_process(self, folder: Path, step: int, model: Any, tokenizer: Any) -> None:
        from evalsuite.backends.hf.loading import HFOptions
        from evalsuite.backends.hf.model import HFModel
        from evalsuite.engine.runner import RunOptions, make_task, run_task
        from evalsuite.engine.thinking import with_thinking
        from evalsuite.params import build_params

        from .watch_jobs import EvalJob
        from .watch_loop import Watcher, WatchSettings

        assert self.task is not None, "in-process evaluates a task"
        if model is None:
            raise UserError("the trainer passed no model to the callback; use mode='process'")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        # the trainer's model as it is: no attention of evalsuite's own put into it
        run_options = RunOptions(out=self.out, limit=self.limit, progress=False, chunk=self.batch_size)
        backend, run_options = with_thinking(self.model_options, run_options)  # -M thinking(_budget): the engine's
        options = build_params(HFOptions, {"diff_attention": "transformers", **backend}, flag="-M")
        source = {"label": folder.name, "spec": str(folder), "path": str(folder.resolve()), "gguf_file": None}
        was_training = model.training
        model.eval()
        try:
            adapter = HFModel(model, tokenizer, options, source, self.batch_size)
            run = run_task(make_task(self.task, self.params), adapter, run_options)
        finally:
            model.train(was_training)
        job = EvalJob(out=str(self.out), task=self.task, params=self.params, model_options=self.model_options,
                      limit=self.limit)  # the job `mode="process"` would run: one ledger for both
        watcher = Watcher(job, WatchSettings(folder=folder.parent), echo=lambda line: None)
        watcher.record(Candidate(folder, step), {"runs": [str(run.path)]})

    # ---- the metrics ------------------------------------------------------------------------

    def new_logs(self) -> list[dict[str, Any]]:
        """One log row per checkpoint evaluated since the last call: its metrics at its step. Its
        gate's verdict, or why it could not be evaluated, is said on the console (stderr) once."""
        ledger = Ledger(self.out)
        try:
            stat = ledger.path.stat()
        except OSError:
            return []
        if (stat.st_size, stat.st_mtime_ns) == self.stamp:  # called at every step: read the ledger when it grew
            return []
        self.stamp = (stat.st_size, stat.st_mtime_ns)
        rows = []
        for entry in sorted(ledger.entries(), key=lambda e: e.step):
            if entry.path in self.logged:
                continue
            self.logged.add(entry.path)
            if entry.status != "ok":
                _say(f"evalsuite: {entry.checkpoint} (step {entry.step}) was not evaluated: {entry.reason} "
                     f"(details in {self.out / 'watch'})")
                continue
            self.folders[entry.step] = Path(entry.path)
            row: dict[str, Any] = {"step": entry.step}
            for metrics in entry.metrics.values():
                task = metrics.get("task") or "run"
                row.update({f"evalsuite/{task}/{k}": v for k, v in metrics.items()
                            if k != "task" and not k.endswith(("_low", "_high"))})
            if entry.gate is not None:
                row["evalsuite/gate_failed"] = int(bool(entry.gate.get("failed")))
                _say_gate(entry.gate)
            rows.append(row)
        return rows

    def keep_in_checkpoints(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Each row into the trainer_state.json of the checkpoint it measured: the Trainer wrote that
        file before the evaluation ended, so without this the metrics reach only later checkpoints'."""
        for row in rows:
            folder = self.folders.get(row["step"])
            if folder is not None:
                add_to_trainer_state(folder / "trainer_state.json", row)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _say_gate(gate: Mapping[str, Any]) -> None:
    """The watcher's verdict line, with the failed cells under a regression."""
    _say(str(gate.get("verdict", "")))
    if gate.get("failed"):
        for line in gate.get("cells") or ():
            _say(f"  {line}")


def add_to_trainer_state(path: Path, row: Mapping[str, Any]) -> None:
    """`row` appended to the log history of the Trainer state file at `path` (once), rewritten
    whole through a temporary file; a checkpoint already rotated away (save_total_limit), or a
    state file that is not the Trainer's, is left as it is."""
    try:
        state = read_json(path)
    except (OSError, DamagedJSON):
        return
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list) or dict(row) in history:
        return
    history.append(dict(row))
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # a full disk must not stop training: the log history still has the row
        tmp.unlink(missing_ok=True)
        _say(f"evalsuite: could not add the evaluation to {path}: {exc.strerror or exc}")


@cache
def _trainer_callback() -> type:
    from transformers import TrainerCallback

    class EvalsuiteCallback(TrainerCallback):
        """Evaluates each checkpoint the Trainer saves; arguments as `Evaluations`."""

        def __init__(self, task: str | None = None, suite: str | None = None, **options: Any):
            self.evaluations = Evaluations(task, suite, **options)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and folder.is_dir():
                model = kwargs.get("model")
                tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
                self.evaluations.saved(folder, state.global_step, model, tokenizer)
            self._log(state)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.evaluations.poll()
            self._log(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.evaluations.finish()
            self._log(state)

        def _log(self, state: Any) -> None:
            rows = self.evaluations.new_logs()
            state.log_history.extend(rows)  # what Trainer.log appends to, saved with the next checkpoint
            if state.is_world_process_zero:
                self.evaluations.keep_in_checkpoints(rows)

    return EvalsuiteCallback


@cache
def _lightning_callback() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        raise UserError("the Lightning callback needs Lightning: pip install lightning") from None

    class EvalsuiteLightningCallback(Callback):
        """Every `every_n_steps` steps, the module's transformers model (`attribute`) saved as
        DIRPATH/checkpoint-STEP with its tokenizer, then evaluated as the Trainer callback does;
        the metrics go to the trainer's logger at the checkpoint's step."""

        def __init__(self, dirpath: str | Path, every_n_steps: int, task: str | None = None,
                     suite: str | None = None, attribute: str = "model", tokenizer: Any = None, **options: Any):
            self.dirpath, self.every, self.attribute, self.tokenizer = Path(dirpath), every_n_steps, attribute, tokenizer
            self.evaluations = Evaluations(task, suite, **options)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            step = trainer.global_step
            if step and step % self.every == 0 and trainer.is_global_zero:
                folder = self.dirpath / f"checkpoint-{step}"
                model = getattr(pl_module, self.attribute)
                model.save_pretrained(folder)
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(folder)
                self.evaluations.saved(folder, step, model, self.tokenizer)
            self.evaluations.poll()
            self._log(trainer)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.evaluations.finish()
            self._log(trainer)

        def _log(self, trainer: Any) -> None:
            """Each evaluation once, at its checkpoint's step, straight to the trainer's logger
            (`log_dict` would stamp it with the current batch's step and repeat it)."""
            for row in self.evaluations.new_logs():
                if trainer.logger is not None:
                    trainer.logger.log_metrics({k: float(v) for k, v in row.items() if k != "step"}, step=row["step"])

    return EvalsuiteLightningCallback


def __getattr__(name: str) -> Any:
    """The callback classes, built when first asked for: importing this module imports neither
    transformers nor Lightning."""
    if name == "EvalsuiteCallback":
        return _trainer_callback()
    if name == "EvalsuiteLightningCallback":
        return _lightning_callback()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
