"""A reasoning model's thinking: the span it writes before its answer, taken off before scoring.

    -M thinking=auto         (the default) on, with <think>...</think>, for a model whose tokenizer has
                             those tags in its vocabulary or its chat template writes them; else off
    -M thinking=on | think   on, with <think>...</think>; a word NAME: <NAME>...</NAME>
    -M thinking=START,END    on, with another pair of tags
    -M thinking=off          off: every output is scored as it is
    -M thinking_budget=N     N new tokens added to every generation request (default 0)

Both are the engine's, for every backend: they are taken out of the `-M` options before a
backend sees them (`split_options`). A task sizes its answer budget for the answer alone, so a
thinking model needs `thinking_budget` to hold its thinking too.

With thinking on, each open generation request (one without a closed answer set) goes to the
model with the budget added and no stop strings (`sent_request`): a task's stop string (the
needle task stops at a newline) would otherwise end the answer inside the thinking, which has
newlines of its own. The engine reads each output (`read_outputs`): the thinking is the span from
the start tag (or from the output's start, when the prompt itself opened the span, as some chat
templates do) to the end tag; the answer scored is the text after it, from its first character
that is not a space to the first stop string, the rule a backend applies to an answer. An output
that does not begin with the start tag (after spaces) has no thinking and is cut at its first
stop string, as a backend would cut it. An output whose thinking never ends has no answer: its
sample fails (its `error` is set, which counts as a fail on every metric) and is counted
(analysis/thinking.py). The record keeps the answers as its `outputs`, and the raw outputs and the
thinking's length in its `info`.

The run's config.json records the thinking (`thinking`: tags, budget, where they came from) and the
run hash covers tags and budget; a run with thinking off has neither, so its folder and records
are those of a run made before this option existed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from evalsuite.analysis.thinking import CHARS, RAW, UNENDED
from evalsuite.contracts import ModelAdapter
from evalsuite.errors import UserError
from evalsuite.params import build_params
from evalsuite.types import GenerationRequest, Output

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TAGS = ("<think>", "</think>")
OFF = ("off", "false", "no", "none")
ON = ("on", "true", "yes")
AUTO = "auto"
TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.|-]*")
Run = TypeVar("Run", bound="DataclassInstance")  # runner.RunOptions, which imports this module


@dataclass(frozen=True)
class ThinkingOptions:
    """The `-M thinking` and `-M thinking_budget` options as given."""

    name = "thinking"
    thinking: str = AUTO
    thinking_budget: int = 0

    def __post_init__(self) -> None:
        if self.thinking_budget < 0:
            raise UserError(f"-M thinking_budget must be 0 or more, got {self.thinking_budget}")
        given_tags(self.thinking)  # refuses a value that names no tags


def given_tags(value: str) -> tuple[str, str] | None:
    """The tags `-M thinking=VALUE` names; None for auto and off (`thinking_of` tells those apart)."""
    word = value.strip()
    if word.lower() in (AUTO, *OFF):
        return None
    if word.lower() in ON:
        return TAGS
    if "," in word:
        start, _, end = (part.strip() for part in word.partition(","))
        if start and end and start != end and "," not in end:
            return start, end
    elif TAG_NAME.fullmatch(word):
        return f"<{word}>", f"</{word}>"
    raise UserError(f"-M thinking={value!r}: give auto, off, on, a tag name (think: <think>...</think>) "
                    "or START,END (two different tags)")


def split_options(model_options: Mapping[str, str]) -> tuple[dict[str, str], ThinkingOptions | None]:
    """The `-M` options for the backend, and the thinking options among them (None: none given)."""
    keys = {f.name for f in dataclasses.fields(ThinkingOptions)}
    given = {k: v for k, v in model_options.items() if k in keys}
    backend = {k: v for k, v in model_options.items() if k not in keys}
    return backend, build_params(ThinkingOptions, given, flag="-M") if given else None


def with_thinking(model_options: Mapping[str, str], options: Run) -> tuple[dict[str, str], Run]:
    """The backend's `-M` options, and the run options (runner.RunOptions) with the thinking options
    given among them (as they were when none is given)."""
    backend, thinking = split_options(model_options)
    return backend, options if thinking is None else dataclasses.replace(options, thinking=thinking)


@dataclass(frozen=True)
class Thinking:
    """Thinking on: its tags, the new tokens added to every generation request, where the tags came from."""

    start: str
    end: str
    budget: int
    source: str  # "-M thinking", "tokenizer vocabulary" or "chat template"

    def recorded(self) -> dict[str, Any]:
        """config.json's `thinking` entry."""
        return {"start": self.start, "end": self.end, "budget": self.budget, "from": self.source}

    def identity(self) -> dict[str, Any]:
        """What the run hash covers: the tags and the budget (not where the tags came from)."""
        return {"start": self.start, "end": self.end, "budget": self.budget}


def thinking_of(options: ThinkingOptions, model: ModelAdapter) -> Thinking | None:
    """The run's thinking on `model` (None: off), from the options and, for auto, the model's tokenizer."""
    auto = options.thinking.strip().lower() == AUTO
    tags, source = detected(model) if auto else (given_tags(options.thinking), "-M thinking")
    if tags is None:
        if options.thinking_budget:
            why = "no <think> tags in its tokenizer or chat template" if auto else f"-M thinking={options.thinking}"
            raise UserError(f"-M thinking_budget is for a model that thinks, and thinking is off for {model.name} "
                            f"({why}); give -M thinking=think (or START,END) for a model that thinks")
        return None
    _refuse_dropped_tags(model, tags)
    return Thinking(tags[0], tags[1], options.thinking_budget, source)


def detected(model: ModelAdapter) -> tuple[tuple[str, str] | None, str]:
    """<think>...</think> when the adapter's tokenizer (hf, vllm; server with -M tokenizer) has both
    tags in its vocabulary or its chat template writes them, with which of the two said so."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None, ""
    vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if all(tag in vocabulary for tag in TAGS):
        return TAGS, "tokenizer vocabulary"
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, Mapping) else [template]
    if any(isinstance(text, str) and all(tag in text for tag in TAGS) for text in texts):
        return TAGS, "chat template"
    return None, ""


def _refuse_dropped_tags(model: ModelAdapter, tags: tuple[str, str]) -> None:
    """Backends decode answers without special tokens: tags that are special tokens never reach the
    engine, and the thinking could not be told from the answer."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {str(token.content) for token in added.values() if getattr(token, "special", False)}
    dropped = [tag for tag in tags if tag in special]
    if dropped:
        raise UserError(f"{model.name}'s tokenizer makes {' and '.join(dropped)} a special token, which decoded "
                        "answers leave out, so its thinking cannot be told from its answer; give -M thinking=off "
                        "to score whole outputs")


def thinks(thinking: Thinking | None, request: Any) -> bool:
    """Whether the engine reads `request`'s output for thinking: an open generation request."""
    return (thinking is not None and isinstance(request, GenerationRequest) and request.choices is None
            and request.max_new_tokens > 0)


def sent_request(thinking: Thinking | None, request: Any) -> Any:
    """The request as the model gets it: with thinking on, the budget added and no stop strings
    (the engine cuts the answer after the thinking, `read_output`)."""
    if not thinks(thinking, request):
        return request
    assert thinking is not None
    return dataclasses.replace(request, max_new_tokens=request.max_new_tokens + thinking.budget, stop=())


@dataclass(frozen=True)
class Thought:
    """One output read: the answer scored (None: the thinking never ended) and the thinking's characters."""

    answer: str | None
    chars: int


def read_output(thinking: Thinking, request: GenerationRequest, output: str) -> Thought:
    """The answer after the thinking, cut at the request's first stop string (module docstring)."""
    prompt = request.prefix + request.prompt
    opened = prompt.rfind(thinking.start) > prompt.rfind(thinking.end)  # the prompt ends inside a span
    begin = 0 if opened else _start_after(thinking.start, output)
    if begin is None:
        return Thought(_cut(output, request.stop), 0)
    close = output.find(thinking.end, begin)
    if close < 0:
        return Thought(None, len(output) - begin)
    return Thought(_cut(output[close + len(thinking.end):].lstrip(), request.stop), close - begin)


def _start_after(start: str, output: str) -> int | None:
    """Where the thinking begins: after the start tag the output opens with (spaces before it), else None."""
    body = output.lstrip()
    return len(output) - len(body) + len(start) if body.startswith(start) else None


def _cut(text: str, stop: Sequence[str]) -> str:
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


@dataclass(frozen=True)
class Read:
    """A sample's outputs read: what its scorer gets, what its record's info adds, its error."""

    outputs: list[Output]
    info: dict[str, Any]
    error: str | None = None


def read_outputs(thinking: Thinking | None, requests: Sequence[Any], outputs: Sequence[Output]) -> Read:
    """A sample's outputs with each thinking taken off (unchanged with thinking off). An output whose
    thinking never ended leaves the sample with no outputs to score and an error."""
    if thinking is None:
        return Read(list(outputs), {})
    read = [read_output(thinking, r, str(o)) if thinks(thinking, r) else None for r, o in zip(requests, outputs)]
    info = {CHARS: sum(t.chars for t in read if t is not None),
            UNENDED: sum(t is not None and t.answer is None for t in read),
            RAW: [o if t is not None else None for t, o in zip(read, outputs)]}
    if info[UNENDED]:
        error = (f"ThinkingUnended: {info[UNENDED]} output(s) never ended their thinking with {thinking.end} "
                 f"(-M thinking_budget={thinking.budget})")
        return Read([], info, error)
    answers: list[Output] = [o if t is None or t.answer is None else t.answer for t, o in zip(read, outputs)]
    return Read(answers, info)


def from_config(config: Mapping[str, Any]) -> Thinking | None:
    """The thinking a run's config.json records (None: off)."""
    entry = config.get("thinking")
    if not isinstance(entry, Mapping):
        return None
    return Thinking(str(entry["start"]), str(entry["end"]), int(entry["budget"]), str(entry.get("from", "")))


def identity_with_thinking(identity: dict[str, Any], thinking: Thinking | None) -> dict[str, Any]:
    """The run identity with the thinking added when it is on (unchanged otherwise: the same hash)."""
    return identity if thinking is None else {**identity, "thinking": thinking.identity()}


def budget_note(thinking: Thinking | None, model: ModelAdapter) -> str | None:
    """A line when thinking is on with no budget: each answer's few tokens must then hold the thinking too."""
    if thinking is None or thinking.budget:
        return None
    return (f"note: thinking is on for {model.name} ({thinking.start}...{thinking.end}; {thinking.source}) and "
            "-M thinking_budget is 0: an answer's few new tokens must hold its thinking too, and most will "
            "never end it; give -M thinking_budget=N (or -M thinking=off)")
