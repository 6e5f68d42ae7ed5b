"""The task contract: a Task of three methods, the defaults of its optional hooks, and its view.

A task is a frozen dataclass of parameters (what `-T key=value` sets) that
subclasses `TaskBase` and writes the three methods of `Task`:

    prepare(model) -> state          (TaskBase: None) what depends on the model or on loaded data
    plan(state) -> Sample...         every sample, deterministic from the parameters and seed
    requests(sample, model, state)   -> (requests, facts for the record)
    the model adapter answers each request (types.py: one output type per request kind)
    score(sample, outputs) -> scores, stored with the record

Every optional hook and member has a default on `TaskBase`, so the engine and the analysis call hooks
without asking whether a task has them; the members (name, metrics, group_by, versions, smoke plan...)
are given as keywords of the task's class statement, its header. A task's presentation (plots, report
section, HTML samples, the view of a pair of runs) lives in its `view`, a `TaskView` subclass. A
hook that reads a finished run is handed its read-only view (`runs.view.RunView`: its folder, config
and records). `validate_task` runs when a task registers: a missing member, a hook of the wrong kind
or with the wrong parameters, a near miss of a hook's name, or a member of the old contract is one
line naming what to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from evalsuite.runs.records import Record
from evalsuite.runs.view import RunView
from evalsuite.types import Sample

from .adapter import ContractError, ModelAdapter

if TYPE_CHECKING:
    import pandas as pd


@runtime_checkable
class Task(Protocol):
    """Required of every task: three class attributes and three methods."""

    name: ClassVar[str]  # what `--task` selects
    metrics: ClassVar[tuple[str, ...]]  # score keys that reports, compare and check aggregate
    group_by: ClassVar[tuple[str, ...]]  # sample axes that tables and plots group by

    def plan(self, state: Any) -> Iterable[Sample]:
        """Every sample, in a deterministic order, from the parameters, the seed and `state`
        (what `prepare` returned). A generator is best: the runner takes only what `--limit` keeps."""
        ...

    def requests(self, sample: Sample, model: ModelAdapter, state: Any) -> tuple[Sequence[Any], Mapping[str, Any]]:
        """The model requests for one sample (`GenerationRequest`, `LoglikelihoodRequest` or a
        `ProbeRequest`; none carries the answer), and measured facts (prompt tokens...) for its record."""
        ...

    def score(self, sample: Sample, outputs: Sequence[Any]) -> Mapping[str, Any]:
        """Scores of one sample from the outputs of its requests, in order (types.py's output types)."""
        ...


class TaskView:
    """A task's presentation. The defaults draw nothing and add nothing; a task names its own
    subclass as `view`. Views are built on the task (`view = task.view(task)`) and read its parameters."""
    axis_labels: ClassVar[Mapping[str, str]] = {}  # a sample axis -> its name in words on plots

    def __init__(self, task: Any):
        self.task = task

    def plots(self, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path]:
        """Plots of one run (`frame`: its records as a table), written into `folder` (which exists);
        returns the files."""
        return []

    def report_section(self, run: RunView) -> str:
        """Markdown for `evalsuite report`, after the metric table ('' for none)."""
        return ""

    def html_samples(self, records: Sequence[Record]) -> str | None:
        """HTML showing the samples worth a look (None: the HTML report's generic table)."""
        return None

    def pair_report(self, comparison: Any, folder: Path) -> list[Path]:
        """Side-by-side outputs of two runs of this task (an `analysis.compare.Comparison`)."""
        return []

    def grid_report(self, comparisons: Sequence[Any], folder: Path) -> list[Path]:
        """Figures of three or more models at once: `comparisons` each pair the one baseline (first) with a model."""
        return []


class RunStep(Protocol):
    """A step of a task's own over a run's saved outputs, after the model is done (judging
    summaries): rerunnable on its own with `evalsuite score`."""

    label: str

    def apply(self, run: RunView, progress: bool) -> str:
        """Do the step on one finished run; one line saying what it did."""
        ...

    def table(self, runs: Sequence[Path]) -> str:
        """Markdown of the step's results over these runs."""
        ...


_INHERITED: Any = object()  # a header keyword not given: the member is what the class inherits


class TaskBase:
    """Defaults of every optional hook and member. Subclass it; override what your task needs.

    Every member the house reads is listed here, with its default (the required three have none), and
    each may be given as a keyword of the class statement, its header, instead of a class attribute:

        class Passkey(TaskBase, name="passkey", metrics=("correct",), group_by=("context_length",),
                      smoke_plan={"lengths": "2000,3000", "samples": "1"}):
    """

    name: ClassVar[str]  # required: what `--task` selects
    metrics: ClassVar[tuple[str, ...]]  # required: score keys that reports, compare and check aggregate
    group_by: ClassVar[tuple[str, ...]]  # required: sample axes that tables and plots group by
    presets: ClassVar[dict[str, dict[str, str]]] = {}  # name -> {param: value}: defaults -T options override
    lower_is_better: ClassVar[tuple[str, ...]] = ()  # metrics where a drop is an improvement
    cluster_key: ClassVar[str | None] = None  # the sample axis that groups dependent samples
    gating_axes: ClassVar[tuple[str, ...] | None] = None  # `check` gates each cell of these (None: group_by)
    primary_metric: ClassVar[str | None] = None  # the metric `check` gates by default (None: metrics[0])
    view: ClassVar[type[TaskView]] = TaskView  # the task's presentation
    # the options of its run step: a frozen dataclass whose fields (each with a default) are given as
    # -J key=value and parsed like -T; a field's metadata may name a flag of its own ({"flag": "--judge",
    # "help": ...}), its friendly form on the command line (engine/run_steps.py). None: no run step.
    step_options: ClassVar[type | None] = None
    plan_version: ClassVar[int] = 1  # bump when samples or prompts change: a new run folder (code_versions.py)
    score_version: ClassVar[int] = 1  # bump when scoring changes: resumed runs are scored again
    # parameters added after runs were recorded, at the value that keeps those runs' samples: a run's
    # params leave them out at that value, so its identity and hash stay (params.to_jsonable)
    quiet_defaults: ClassVar[Mapping[str, Any]] = {}
    # -T values of a small plan that the conformance suite runs on the byte-tokenized fake model (or the
    # toy pair, for a task that needs a capability) and whose prompt hashes golden.json holds beside the
    # task; "{data}" stands for the folder tests/paper_data.py writes. None: not declared (a built-in
    # task must declare one; an outside task is run at its defaults, cut to a few samples)
    smoke_plan: ClassVar[Mapping[str, str] | None] = None

    def __init_subclass__(cls, *, name: str = _INHERITED, metrics: tuple[str, ...] = _INHERITED,
                          group_by: tuple[str, ...] = _INHERITED, presets: dict[str, dict[str, str]] = _INHERITED,
                          lower_is_better: tuple[str, ...] = _INHERITED, cluster_key: str | None = _INHERITED,
                          gating_axes: tuple[str, ...] | None = _INHERITED, primary_metric: str | None = _INHERITED,
                          view: type[TaskView] = _INHERITED, step_options: type | None = _INHERITED,
                          plan_version: int = _INHERITED, score_version: int = _INHERITED,
                          quiet_defaults: Mapping[str, Any] = _INHERITED,
                          smoke_plan: Mapping[str, str] | None = _INHERITED, **rest: Any) -> None:
        """The class statement's keywords (its header) set the members they name; validate_task
        checks them when the task registers."""
        if rest:  # a misspelt member: the one line names the member it was meant to be
            unknown = next(iter(rest))
            close = difflib.get_close_matches(unknown, KNOWN, n=1, cutoff=0.6)
            raise ContractError(f"task class {cls.__qualname__}: {unknown!r} is no member of the Task contract"
                                + (f": did you mean {close[0]!r}?" if close else ""))
        super().__init_subclass__()
        header = {"name": name, "metrics": metrics, "group_by": group_by, "presets": presets,
                  "lower_is_better": lower_is_better, "cluster_key": cluster_key, "gating_axes": gating_axes,
                  "primary_metric": primary_metric, "view": view, "step_options": step_options,
                  "plan_version": plan_version, "score_version": score_version,
                  "quiet_defaults": quiet_defaults, "smoke_plan": smoke_plan}
        for member, value in header.items():
            if value is not _INHERITED:
                setattr(cls, member, value)

    def prepare(self, model: ModelAdapter | None) -> Any:
        """What `plan` and `requests` read that depends on the model or on loaded data (shot counts,
        answer sets, a haystack's text), as a plain object; raise UserError here when this model
        cannot run this task. `model` is None where no model is loaded (reading a finished run)."""
        return None

    def required_capabilities(self) -> tuple[str, ...]:
        """Adapter capabilities (contracts.CAPABILITIES) the task calls with these parameters."""
        return ()

    def model_setting(self, sample: Sample) -> Hashable:
        """The setting the model needs for this sample (zeroshot: attention bits); the runner never
        mixes two settings in one model call."""
        return None

    def apply_model_setting(self, model: ModelAdapter, setting: Hashable) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def shard_key(self, sample: Sample) -> Hashable:
        """Samples with the same key run on the same data-parallel rank (e.g. a shared prefix)."""
        return sample.id

    def summary(self, frame: pd.DataFrame, run: RunView) -> Mapping[str, Any]:
        """Extra entries for summary.json, from the run's frame (and its records, where the frame's
        columns do not hold what a summary needs)."""
        return {}

    def side_scores(self, run: RunView) -> dict[str, dict[str, float | None]]:
        """Per-sample scores kept beside the records (judge verdicts), by sample id; their metrics join
        the declared ones for this run in report, compare, check and HTML (None: no value)."""
        return {}

    def run_step(self, options: Any, *, out: Path, device: str, batch_size: int) -> RunStep | None:
        """The step that `options` (a `step_options` instance: the values given, defaults for the
        rest) asks for (None: none asked)."""
        return None


REQUIRED_ATTRIBUTES = ("name", "metrics", "group_by")
REQUIRED_METHODS = {"plan": ("state",), "requests": ("sample", "model", "state"), "score": ("sample", "outputs")}
HOOKS = tuple(name for name, value in vars(TaskBase).items() if inspect.isfunction(value) and not name.startswith("_"))
OLD_HOOKS = {  # hooks of the earlier contract, and where they went
    "check": "raise UserError from prepare(model) instead",
    "plots": "move it to a TaskView subclass named as the task's `view`",
    "report_section": "move it to a TaskView subclass named as the task's `view`",
    "html_samples": "move it to a TaskView subclass named as the task's `view`",
    "pair_report": "move it to a TaskView subclass named as the task's `view`",
    "judge_step": "return a RunStep from run_step(options, ...) instead",
    "judge_table": "return a RunStep from run_step(options, ...) instead",
    "options": "declare the run step's options as a dataclass named `step_options` (given as -J key=value)",
}
MEMBERS = ("presets", "lower_is_better", "cluster_key", "gating_axes", "primary_metric", "view", "step_options",
           "plan_version", "score_version", "quiet_defaults", "smoke_plan")  # optional, each with its default
KNOWN = {*REQUIRED_ATTRIBUTES, *REQUIRED_METHODS, *HOOKS, *MEMBERS}


def validate_task(cls: type) -> None:
    """Raise ContractError naming the first thing `cls` lacks, misspells or writes the old way."""
    label = f"task class {cls.__qualname__}"
    if not dataclasses.is_dataclass(cls):
        raise ContractError(f"{label} must be a dataclass (its fields are the -T parameters)")
    if not issubclass(cls, TaskBase):
        raise ContractError(f"{label} must subclass evalsuite.TaskBase (it gives every optional hook a default)")
    for member in (*REQUIRED_ATTRIBUTES, *REQUIRED_METHODS):
        if not hasattr(cls, member):
            raise ContractError(f"{label} is missing {member!r}, which the Task contract requires")
    task: Any = cls  # checked member by member below
    if not isinstance(task.name, str) or not task.name:
        raise ContractError(f"{label}: 'name' must be a non-empty string")
    for member in ("metrics", "group_by"):
        value = getattr(cls, member)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise ContractError(f"{label}: {member!r} must be a tuple of strings, got {value!r}")
    if not task.metrics:
        raise ContractError(f"{label}: 'metrics' must name at least one score")
    _check_methods(cls, label)
    _check_attributes(cls, label)
    _check_spelling(cls, label)


def _check_methods(cls: type, label: str) -> None:
    for member, parameters in REQUIRED_METHODS.items():
        method = inspect.getattr_static(cls, member)
        if not inspect.isfunction(method):
            raise ContractError(f"{label}: {member!r} must be an ordinary method")
        given = [p for p in inspect.signature(method).parameters][1:]
        if len(given) != len(parameters):
            raise ContractError(f"{label}: write {member}(self, {', '.join(parameters)}) (it takes "
                                f"({', '.join(['self', *given])})); `state` is what prepare(model) returns")
    for member in HOOKS:
        if not inspect.isfunction(inspect.getattr_static(cls, member)):
            raise ContractError(f"{label}: {member!r} must be an ordinary method (not static or a class method)")
    _check_signatures(cls, TaskBase, label)
    for member, where in OLD_HOOKS.items():
        if member in vars(cls) or any(member in vars(k) for k in cls.__mro__[1:-1] if k is not TaskBase):
            raise ContractError(f"{label} defines {member!r} of the earlier contract: {where}")


def _check_attributes(cls: type, label: str) -> None:
    task: Any = cls
    if not isinstance(task.presets, dict) or not isinstance(task.lower_is_better, tuple):
        raise ContractError(f"{label}: 'presets' must be a dict and 'lower_is_better' a tuple")
    if task.cluster_key is not None and not isinstance(task.cluster_key, str):
        raise ContractError(f"{label}: 'cluster_key' must be a str or None")
    axes = task.gating_axes
    if axes is not None and not (isinstance(axes, tuple) and all(isinstance(a, str) for a in axes)):
        raise ContractError(f"{label}: 'gating_axes' must be a tuple of strings or None, got {axes!r}")
    if task.primary_metric is not None and task.primary_metric not in task.metrics:
        raise ContractError(f"{label}: 'primary_metric' {task.primary_metric!r} is not one of its metrics")
    if not (isinstance(task.view, type) and issubclass(task.view, TaskView)):
        raise ContractError(f"{label}: 'view' must be a TaskView subclass")
    _check_signatures(task.view, TaskView, f"{label}, its view {task.view.__qualname__}")
    _check_step_options(task.step_options, label)
    _check_parameter_maps(cls, label)


def _check_parameter_maps(cls: type, label: str) -> None:
    """The versions are whole numbers from 1; `quiet_defaults` and `smoke_plan` name parameters that exist."""
    task: Any = cls
    for member in ("plan_version", "score_version"):
        value = getattr(task, member)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ContractError(f"{label}: {member!r} must be a whole number from 1, got {value!r}")
    fields = {f.name for f in dataclasses.fields(cls)}
    plan = task.smoke_plan
    if plan is not None and not (isinstance(plan, Mapping) and all(isinstance(v, str) for v in plan.values())):
        raise ContractError(f"{label}: 'smoke_plan' must map parameters to -T text, e.g. {{'samples': '2'}}")
    for member, given in (("quiet_defaults", task.quiet_defaults), ("smoke_plan", plan or {})):
        unknown = sorted(set(given) - fields)
        if unknown:
            raise ContractError(f"{label}: {member!r} names {unknown[0]!r}, which is not one of its parameters "
                                f"({', '.join(sorted(fields))})")


def _positional(function: Any) -> list[str] | None:
    """The positional parameters after `self` (None: it takes *args, so any number)."""
    parameters = list(inspect.signature(function).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _check_signatures(cls: type, base: type, label: str) -> None:
    """A hook overridden with another number of parameters than the contract passes it (a hook of
    an earlier release, which took no `run`) is one line naming the signature to write."""
    for member, default in vars(base).items():
        if member.startswith("_") or not inspect.isfunction(default):
            continue
        own = inspect.getattr_static(cls, member)
        if own is default or not inspect.isfunction(own):
            continue
        want, given = _positional(default), _positional(own)
        if given is not None and want is not None and len(given) != len(want):
            raise ContractError(f"{label}: write {member}(self, {', '.join(want)}) (it takes "
                                f"({', '.join(['self', *given])})); `run` is the run's read-only view")


def _check_step_options(options: Any, label: str) -> None:
    if options is None:
        return
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise ContractError(f"{label}: 'step_options' must be a dataclass (its fields are the -J options) or None")
    for option in dataclasses.fields(options):
        if option.default is dataclasses.MISSING and option.default_factory is dataclasses.MISSING:
            raise ContractError(f"{label}: step option {option.name!r} needs a default (an option not given takes it)")


def _check_spelling(cls: type, label: str) -> None:
    """A public member that is not part of the contract but nearly spells one is a typo."""
    fields = {f.name for f in dataclasses.fields(cls)}
    own = {name for klass in inspect.getmro(cls)[:-1] if klass is not TaskBase for name in vars(klass)}
    for name in sorted(own - KNOWN - fields):
        if name.startswith("_"):
            continue
        close = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.8)
        if close:
            raise ContractError(f"{label} defines {name!r}: did you mean {close[0]!r}?")
