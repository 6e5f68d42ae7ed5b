"""What a judge reads and says: the prompt, a verdict and how it is read, the settings
that reach and drive a judge (what --judge* options set), and the `Judge` protocol."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from evalsuite.backends.common.http import check_http_url
from evalsuite.errors import UserError, unknown

KINDS = ("openai", "hf", "lexical")
PROMPT_VERSION = 1  # bump when the judge prompt changes: verdicts of different prompts differ

SYSTEM = "You are a meticulous fact-checker who compares generated text against its source document."

INSTRUCTION = """\
Below are a source document{question_note}, a reference {kind} and a {kind} written by a model. \
Decide whether the model's {kind} is faithful to the document: every statement in it must be \
supported by the document, and it must not contain information that the document does not give \
(a hallucination). The model's {kind} may be worded differently from the reference and may be \
correct even where it differs from it; use the reference only as a guide to what a good {kind} \
looks like, and judge support against the document."""

ENDING = """\
First explain your reasoning step by step. Then finish with a final line that is exactly \
"Conclusion: True" if the model's {kind} is supported by the document and free of hallucination, \
or exactly "Conclusion: False" otherwise."""


class JudgeUnavailable(UserError):
    """The judge cannot go on (an endpoint that stays down, a rejected key): stop the run."""


@dataclass(frozen=True)
class JudgeItem:
    """What the judge sees for one sample."""

    id: str
    document: str
    reference: tuple[str, ...]
    output: str
    question: str = ""


@dataclass(frozen=True)
class Verdict:
    """One judgement: `verdict` is True/False when readable, None when unparseable or failed."""

    id: str
    judge: str
    status: str  # judged | unparseable | error
    verdict: bool | None
    response: str = ""
    error: str | None = None
    attempts: int = 0
    cached: bool = False
    request_sha256: str | None = None

    @property
    def answered(self) -> bool:
        """The judge gave a response (readable or not); errors are retried on the next run."""
        return self.status in ("judged", "unparseable")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)

    def reread(self) -> Verdict:
        """This verdict with its stored response read by today's rule (`parse_verdict`), so a
        file written under an older, looser rule is counted as the current one counts it."""
        if not self.answered or not self.response:
            return self
        value = parse_verdict(self.response)
        return replace(self, status="unparseable" if value is None else "judged", verdict=value)


# ---- the prompt and the verdict --------------------------------------------------------------


def judge_prompt(item: JudgeItem) -> str:
    """The user message a judge model reads for one sample (reasoning first, then a conclusion)."""
    kind = "answer" if item.question else "summary"
    references = "\n".join(f"- {r}" for r in item.reference) if len(item.reference) > 1 else "".join(item.reference)
    parts = [
        INSTRUCTION.format(kind=kind, question_note=", a question about it" if item.question else ""),
        f"Document:\n{item.document}",
    ]
    if item.question:
        parts.append(f"Question: {item.question}")
    parts += [f"Reference {kind}:\n{references}", f"Model's {kind}:\n{item.output}", ENDING.format(kind=kind)]
    return "\n\n".join(parts)


# Any mention of a conclusion ("Conclusion:", "in conclusion", "conclusions"): the last one
# must be the verdict label, so a note after the verdict that talks about a conclusion makes
# the response ambiguous rather than letting a word in the note decide.
_MENTION = re.compile(r"conclusion", re.IGNORECASE)
# The label and a bare verdict: markdown emphasis or quotes may wrap either, whitespace (a
# line break included) may separate them, one closing period or "!" may follow, and nothing
# else may stand on the verdict's line ("Not True", "True/False", "partially true" do not).
_EMPHASIS = r"[*_`\"']*"
_LABELLED = re.compile(
    rf"conclusion{_EMPHASIS}[ \t]*:{_EMPHASIS}\s*{_EMPHASIS}(true|false){_EMPHASIS}[.!]?[ \t\r]*(?:\n|$)", re.IGNORECASE)


# After the verdict's line, words that take a verdict back or give another one ("Conclusion:
# True ... Actually no. False."): the response contradicts its own conclusion, so it has none.
_REVERSAL = re.compile(
    r"\b(?:true|false|actually|wait|on (?:second|further) thought|on reflection|correction|scratch that"
    r"|i was wrong|my mistake|i made a mistake|reconsider\w*|revis\w+)\b|\bno\b\s*[.,!;:]", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    """True/False when the response's last mention of a conclusion is the label `Conclusion:`
    followed by a bare True or False, and nothing after it takes the verdict back or gives
    another; None (unparseable) for anything else."""
    mentions = list(_MENTION.finditer(text))
    if not mentions:
        return None
    label = _LABELLED.match(text, mentions[-1].start())
    if label is None or _REVERSAL.search(text, label.end()):
        return None
    return label.group(1).lower() == "true"


def verdict_from_text(item_id: str, judge: str, text: str, **extra: Any) -> Verdict:
    value = parse_verdict(text)
    return Verdict(id=item_id, judge=judge, status="unparseable" if value is None else "judged", verdict=value,
                   response=text, **extra)


def error_verdict(item_id: str, judge: str, error: str, **extra: Any) -> Verdict:
    return Verdict(id=item_id, judge=judge, status="error", verdict=None, error=error, **extra)


# ---- settings and the judge protocol ---------------------------------------------------------


@dataclass(frozen=True)
class JudgeSettings:
    """How to reach and drive a judge (what --judge-* options set). Holds the *name* of the
    environment variable with the API key, never the key."""

    spec: str
    base_url: str = ""  # "" -> $OPENAI_BASE_URL or the OpenAI API
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 4
    retries: int = 5
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    timeout: float = 120.0
    max_tokens: int = 1024
    cache: Path | None = None  # None -> judge-cache.sqlite beside the run folders
    options: Mapping[str, str] = field(default_factory=dict)  # backend options of an hf judge
    device: str = "auto"
    batch_size: int = 8
    progress: bool = True

    def __post_init__(self) -> None:
        kind, _, model = self.spec.partition(":")
        if kind not in KINDS:
            raise unknown("judge", kind, KINDS)
        if kind in ("openai", "hf") and not model.strip():
            raise UserError(f"--judge {kind} needs a model name, e.g. --judge {kind}:<model>")
        if kind == "lexical" and model:
            raise UserError("--judge lexical takes no model name")
        if kind == "openai":
            check_http_url(self.endpoint, "--judge-base-url")
        if self.concurrency < 1 or self.retries < 0 or self.backoff < 0 or self.timeout <= 0 or self.max_tokens < 0:
            raise UserError("--judge-concurrency must be >= 1, --judge-retries and --judge-backoff >= 0, "
                            "--judge-timeout > 0 and --judge-max-tokens >= 0")

    @property
    def kind(self) -> str:
        return self.spec.partition(":")[0]

    @property
    def name(self) -> str:
        return self.spec.strip()

    @property
    def endpoint(self) -> str:
        return (self.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")


class Judge(Protocol):
    name: str  # the spec: openai:gpt-4o, hf:..., lexical
    label: str  # how tables name it; a heuristic says so
    heuristic: bool

    def judge(self, items: Sequence[JudgeItem], on_verdict: Callable[[Verdict], None]) -> None:
        """Judge every item, calling `on_verdict` (in the caller's thread) as each one finishes.
        Raises JudgeUnavailable when it cannot go on; verdicts already passed on stay valid."""
        ...


def label_for(name: str) -> str:
    return f"{name} (heuristic)" if name == "lexical" else name
