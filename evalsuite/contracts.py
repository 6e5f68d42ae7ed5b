"""The contracts: a Task of three methods, the defaults of its optional hooks, and the model adapter.

A task is a frozen dataclass of parameters (what `-T key=value` sets) that
subclasses `TaskBase` and writes the three methods of `Task`:

    prepare(model) -> state          (TaskBase: None) what depends on the model or on loaded data
    plan(state) -> Sample...         every sample, deterministic from the parameters and seed
    requests(sample, model, state)   -> (requests, facts for the record)
    the model adapter answers each request (types.py: one output type per request kind)
    score(sample, outputs) -> scores, stored with the record

Every optional hook has a default on `TaskBase`, so the engine and the analysis call hooks without
asking whether a task has them. A task's presentation (plots, report section, HTML samples, the view
of a pair of runs) lives in its `view`, a `TaskView` subclass. `validate_task` runs when a task
registers: a missing member, a hook of the wrong kind, a near miss of a hook's name, or a method
written against the old contract is one line naming what to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

from .errors import UserError
from .types import AttentionMass, GenerationRequest, Loglikelihood, LoglikelihoodRequest, Sample

if TYPE_CHECKING:
    import pandas as pd

    from evalsuite.engine.records import Record, RunFolder


class ContractError(UserError, TypeError):
    """A task or backend that does not meet its contract (shown as one line)."""


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

    def plots(self, frame: pd.DataFrame, folder: Path, title: str) -> list[Path]:
        """Plots of one run, written into `folder` (which exists); returns the files."""
        return []

    def report_section(self, run: RunFolder) -> str:
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

    def apply(self, run: RunFolder, progress: bool) -> str:
        """Do the step on one finished run; one line saying what it did."""
        ...

    def table(self, runs: Sequence[Path]) -> str:
        """Markdown of the step's results over these runs."""
        ...


@dataclasses.dataclass(frozen=True)
class TaskOption:
    """A command-line option a task adds to `evalsuite run` and `evalsuite score` for its run step
    (`flag` and click's keyword arguments). Its value reaches `TaskBase.run_step` by its Python name."""

    flag: str
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


class TaskBase:
    """Defaults of every optional hook. Subclass it; override what your task needs."""

    presets: ClassVar[dict[str, dict[str, str]]] = {}  # name -> {param: value}: defaults -T options override
    lower_is_better: ClassVar[tuple[str, ...]] = ()  # metrics where a drop is an improvement
    cluster_key: ClassVar[str | None] = None  # the sample axis that groups dependent samples
    gating_axes: ClassVar[tuple[str, ...] | None] = None  # `check` gates each cell of these (None: group_by)
    primary_metric: ClassVar[str | None] = None  # the metric `check` gates by default (None: metrics[0])
    view: ClassVar[type[TaskView]] = TaskView  # the task's presentation
    options: ClassVar[tuple[TaskOption, ...]] = ()  # command-line options of its run step
    plan_version: ClassVar[int] = 1  # bump when samples or prompts change: a new run folder (code_versions.py)
    score_version: ClassVar[int] = 1  # bump when scoring changes: resumed runs are scored again

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

    def summary(self, frame: pd.DataFrame) -> Mapping[str, Any]:
        """Extra entries for summary.json, from the run's frame."""
        return {}

    def side_scores(self, run: RunFolder) -> dict[str, dict[str, float | None]]:
        """Per-sample scores kept beside the records (judge verdicts), by sample id; their metrics join
        the declared ones for this run in report, compare, check and HTML (None: no value)."""
        return {}

    def run_step(self, options: Mapping[str, Any], *, out: Path, device: str, batch_size: int) -> RunStep | None:
        """The step the values of this task's `options` ask for (None: none asked)."""
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
}
KNOWN = {*REQUIRED_ATTRIBUTES, *REQUIRED_METHODS, *HOOKS, "presets", "lower_is_better", "cluster_key", "view",
         "options", "gating_axes", "primary_metric"}


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
    if not all(isinstance(o, TaskOption) for o in task.options):
        raise ContractError(f"{label}: 'options' must be a tuple of TaskOption")


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


# ---- the model adapter ----


@runtime_checkable
class ModelAdapter(Protocol):
    name: str  # short, file-name safe
    capabilities: frozenset[str]  # names from CAPABILITIES that this backend offers
    max_context: int  # tokens the model can attend over
    chat_template: bool  # prompts are wrapped in the model's chat template

    def fingerprint(self) -> dict[str, Any]:
        """What exactly was loaded: path, config and weights hashes, dtype, attention..."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` as a full prompt (special tokens the backend adds included)."""
        ...

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        """`user` wrapped as a chat turn when chat templates are on, else unchanged + prefix."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]: ...

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]: ...


@runtime_checkable
class TokenLoglikelihood(Protocol):
    """Optional: log-likelihoods of token-id pairs. The lm-eval wrapper scores rolling text
    with lm-eval's own token windows through it; without it, it cuts text at whitespace."""

    prefix_token_id: int  # what a text's first token is conditioned on (BOS, else EOS), as in lm-eval

    def encode(self, text: str, first: bool = True) -> list[int]: ...

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Loglikelihood]:
        """Each (context ids, continuation ids): log p(continuation | context), as `loglikelihood`."""
        ...


# ---- capabilities beyond generate/loglikelihood -----------------------------------------------

ATTENTION_QUANTIZATION = "attention_quantization"
ACTIVATION_PROBE = "activation_probe"
ATTENTION_ALLOCATION = "attention_allocation"
TOKEN_NLL = "token_nll"
SCRIPTED_ANSWERS = "scripted_answers"
CAPABILITIES = (ATTENTION_QUANTIZATION, ACTIVATION_PROBE, ATTENTION_ALLOCATION, TOKEN_NLL, SCRIPTED_ANSWERS)


@runtime_checkable
class QuantizedAttention(Protocol):
    """ATTENTION_QUANTIZATION: attention logits quantized to `bits` inside the context
    (None: as loaded). The granularity is the backend's own option."""

    def quantized_attention(self, bits: int | None) -> AbstractContextManager[None]: ...


# observe(kind, layer, values, valid): kind "hidden" (a layer's output) or "attention_logits"
# (pre-softmax q.k scaled); `valid` marks the causal entries of `values`, or None for all.
ActivationObserver = Callable[[str, int, Any, Any], None]


@runtime_checkable
class ActivationProbe(Protocol):
    """ACTIVATION_PROBE: token windows through the model, every layer's activations observed."""

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids of `text`; with `first`, the special tokens a prompt starts with (BOS)."""
        ...

    def probe_activations(self, windows: Sequence[Sequence[int]], observe: ActivationObserver) -> None:
        """Each window through the model; `observe` sees every layer's activations once per pass."""
        ...


@runtime_checkable
class AttentionAllocation(Protocol):
    """ATTENTION_ALLOCATION: the attention a few query rows pay to spans of key positions, per
    layer and head, computed from those rows only (memory linear in the prompt)."""

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` as a full prompt (what `count_tokens` counts) and each token's
        character span in `text` ((0, 0) for special tokens the tokenizer adds)."""
        ...

    def attention_layers(self) -> int:
        """How many layers have attention (valid layer indices are 0 .. this - 1)."""
        ...

    def attention_mass(self, ids: Sequence[int], queries: Sequence[int], spans: Sequence[tuple[int, int]],
                       layers: Sequence[int] | None = None, differential_norm: str = "lambda") -> AttentionMass:
        """Causal attention of the rows at positions `queries` of the prompt `ids` on each key span
        [start, end), for `layers` (None: all); DIFF layers give their differential heads, divided
        by the layer's 1 - λ (`differential_norm` "lambda"), 1 - λ_init ("lambda_init") or 1 ("none")."""
        ...


@runtime_checkable
class TokenNLL(Protocol):
    """TOKEN_NLL: the teacher-forced negative log-likelihood of every token of token windows,
    in memory linear in the window (no sequence x vocabulary logits tensor)."""

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids of `text`; with `first`, the special tokens a prompt starts with (BOS)."""
        ...

    def token_nll(self, windows: Sequence[Sequence[int]]) -> list[list[float]]:
        """For each window, -log p(window[i] | window[:i]) for i = 1 .. len - 1 (natural log)."""
        ...


@runtime_checkable
class ScriptedAnswers(Protocol):
    """SCRIPTED_ANSWERS: a scripted model (fake:target) that answers with the expected answers it is
    told before it is asked. Requests never carry them; a real model does not offer this."""

    def expect(self, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
        """The target of the sample of each request (same order), for the next calls with them."""
        ...


def tell_expected_answers(model: ModelAdapter, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
    """Tell a model offering SCRIPTED_ANSWERS what each request's sample expects; others are told nothing."""
    if not missing_capabilities(model, (SCRIPTED_ANSWERS,)):
        cast(ScriptedAnswers, model).expect(requests, targets)  # its declared capability says it can


class ProbeRequest(Protocol):
    """A request that measures the model itself through one capability."""

    capability: ClassVar[str]

    def measure(self, model: ModelAdapter) -> Mapping[str, Any]:
        """What the model showed, as a JSON-able mapping (stored as it is; types.py)."""
        ...


def missing_capabilities(model: ModelAdapter, needed: Sequence[str]) -> list[str]:
    offered: frozenset[str] = getattr(model, "capabilities", frozenset())
    return [name for name in needed if name not in offered]
