"""Long-context language modeling: cumulative average NLL by position (paper §3.3, Figure 4).

What it measures: one teacher-forced pass over the first `length` tokens of each document;
the negative log-likelihood of every token given all tokens before it; reported as the
cumulative average NLL (mean over positions 1..p) against position p, log-scale x axis,
averaged over documents with a 95% bootstrap band. The paper finds DIFF below the baseline
at every position, up to 64K tokens, on long books.

Choices the paper leaves open, made here and exposed as parameters:
- documents (`data`): generated filler by default (works offline; a demo, not a language
  modeling corpus), a text file whose documents are separated by blank lines, a folder of
  .txt files (one document per file: PG-19-like books), or `dataset:NAME[:SPLIT]` (column
  `field`); the first `documents` documents are used (at most MAX_DOCUMENTS; generated ones
  are made only as the plan reaches them, so `--limit 2` costs two);
- the window is the tokenizer's BOS (when it has one) and then the document's first tokens,
  `length` tokens in all; position p is the p-th token after the window's first, so a window
  predicts positions 1 .. length - 1. A document with fewer tokens is skipped and counted
  (`skipped` in its record and the summary), never padded;
- records stay small at 64K: each holds the running NLL sum at `points_per_octave`
  log-spaced positions (plus the middle and the last), not every token's NLL;
- the windows of one document at two lengths share their first tokens, so a shorter length's
  curve is the start of a longer one's.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from evalsuite.contracts import TOKEN_NLL, ModelAdapter, TaskBase
from evalsuite.errors import UserError
from evalsuite.params import PathText
from evalsuite.registry import register_task
from evalsuite.runs.view import RunView
from evalsuite.tasks.kit.data import load_texts
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.types import Sample

from .view import NllView, curve_summary, document_counts

FIRST_CHARS_PER_TOKEN = 6  # characters encoded per token needed at first; doubled until enough
CUT_MARGIN = 16  # ids near a character cut may differ from the whole text's: never used
DATA_HELP = "use builtin, a text file, a folder of .txt files or dataset:NAME[:SPLIT]"
MAX_DOCUMENTS = 1_000_000  # the runner plans at most a million samples: more documents is a typo


# ---- documents --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def load_documents(data: str, field: str, limit: int) -> list[Document]:
    """The first `limit` documents of a text file (blank-line separated), a folder of .txt
    files (one each) or a dataset column; a one-line UserError for anything unusable."""
    texts = load_texts(data, "nll data", field, limit, advice=DATA_HELP)
    if data.startswith("dataset:") or Path(data).expanduser().is_dir():
        documents = [Document(t.name, t.text) for t in texts]
    else:  # one file: its documents are the runs of text between blank lines (single newlines kept)
        blocks = [block.strip() for block in re.split(r"\n[ \t]*\n", texts[0].text) if block.strip()]
        documents = [Document(f"{texts[0].name}#{i}", block) for i, block in enumerate(blocks)][:limit]
    if not documents:
        raise UserError(f"nll data {data} holds no documents")
    return documents


def builtin_text(seed: int, index: int, chars: int) -> str:
    """At least `chars` characters of generated filler; a longer call extends a shorter one."""
    parts, size = [], 0
    for sentence in builtin_sentences(random.Random(f"nll-{seed}-{index}")):
        parts.append(sentence)
        size += len(sentence) + 1
        if size >= chars:
            return " ".join(parts)
    raise AssertionError("the filler stream is endless")


def leading_ids(encode: Callable[[str], list[int]], text_with: Callable[[int], str], needed: int) -> list[int]:
    """The first `needed` token ids of a text (all of them when it has fewer), without encoding
    a whole book: `text_with(chars)` gives a prefix of at least `chars` characters (or the whole
    text), encoded and grown until it yields `needed` ids plus a margin."""
    chars = needed * FIRST_CHARS_PER_TOKEN + 64
    while True:
        text = text_with(chars)
        ids = encode(text)
        if len(text) < chars or len(ids) >= needed + CUT_MARGIN:
            return ids[:needed]
        chars *= 2


# ---- the curve, kept compactly ------------------------------------------------------------------


def checkpoints(predicted: int, per_octave: int) -> list[int]:
    """Log-spaced positions 1 .. `predicted` (and its middle and end) where the running sum is kept."""
    octaves = math.log2(predicted) if predicted > 1 else 0.0
    spaced = {round(2 ** (k / per_octave)) for k in range(int(octaves * per_octave) + 1)}
    return sorted(p for p in spaced | {max(1, predicted // 2), predicted} if 1 <= p <= predicted)


def running_sums(nll: Sequence[float], per_octave: int) -> dict[str, Any]:
    """The NLL summed over positions 1..p at each checkpoint p (float64): averages over any
    span between checkpoints follow, and the record stays small."""
    total = np.cumsum(np.asarray(nll, dtype=np.float64))
    positions = checkpoints(len(total), per_octave)
    return {"positions": positions, "nll_sum": [float(total[p - 1]) for p in positions], "predicted": len(total)}


@dataclass(frozen=True)
class NllPass:
    """A probe request: one teacher-forced pass over `window`, kept as running sums."""

    capability: ClassVar[str] = TOKEN_NLL
    window: tuple[int, ...]
    per_octave: int

    def measure(self, model: Any) -> dict[str, Any]:
        return running_sums(model.token_nll([self.window])[0], self.per_octave)


# ---- the task ---------------------------------------------------------------------------------


class NllData(PathText):
    """The `-T data` parameter: an existing file or folder held as its absolute path (one run folder
    for `data=books` and `data=/abs/books`); `builtin` and `dataset:NAME` as written."""

    __slots__ = ()
    keywords = ("builtin",)


@dataclass(frozen=True)
class NllState:
    """What a run reads: the documents read from `data`, once, with the digests that key their
    samples; generated (builtin) documents are none of these: each is made when its sample is."""

    read: tuple[Document, ...]
    digests: tuple[str, ...]  # of each read document's text
    count: int  # documents in the plan

    def name(self, index: int) -> str:
        return self.read[index].name if self.read else f"builtin-{index}"


@register_task
@dataclass(frozen=True)
class Nll(TaskBase, name="nll", view=NllView, group_by=("context_length",), metrics=("nll", "nll_second_half"),
          primary_metric="nll",  # gated per context length
          lower_is_better=("nll", "nll_second_half"),
          cluster_key="document",  # one document's lengths are not independent
          smoke_plan={"data": "{data}/nll", "lengths": "128", "documents": "2"}):
    """Cumulative average negative log-likelihood by position, one pass per document (paper §3.3)."""

    lengths: tuple[int, ...] = (2048,)
    data: NllData = NllData("builtin")  # builtin | a text file | a folder of .txt files | dataset:NAME[:SPLIT]
    field: str = "text"  # the dataset column holding the text
    documents: int = 16  # the first N documents of `data` (builtin: N generated ones)
    points_per_octave: int = 16  # running sums kept per doubling of the position
    seed: int = 0  # builtin filler only

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 16:
            raise ValueError("-T lengths must be token counts of at least 16, e.g. lengths=2048,8192")
        if self.documents < 1 or self.points_per_octave < 1:
            raise ValueError("-T documents and -T points_per_octave must be at least 1")
        if self.documents > MAX_DOCUMENTS:
            raise ValueError(f"-T documents={self.documents} is more than the cap of {MAX_DOCUMENTS:,}")

    # ---- prepare and plan ------------------------------------------------------------------

    def required_capabilities(self) -> tuple[str, ...]:
        return (TOKEN_NLL,)

    def prepare(self, model: ModelAdapter | None) -> NllState:
        """The documents; with a model, refused when the lengths exceed its context or no document
        is long enough for a length (the context is checked before any data is read)."""
        longest = max(self.lengths)
        if model is not None and longest > model.max_context:
            raise UserError(f"length {longest} exceeds {model.name}'s maximum context of {model.max_context} tokens "
                            "(-M max_context=N overrides)")
        if self.data == "builtin":  # generated documents are as long as asked, and made when needed
            return NllState((), (), self.documents)
        read = tuple(load_documents(self.data, self.field, self.documents))
        state = NllState(read, tuple(hashlib.sha256(d.text.encode()).hexdigest()[:8] for d in read), len(read))
        if model is not None:
            self._check_lengths(model, state)
        return state

    def _check_lengths(self, model: ModelAdapter, state: NllState) -> None:
        longest = max(self.lengths)
        head = len(self._head(model))
        found = [head + len(self._ids(index, model, longest - head, state)) for index in range(state.count)]
        hint = "; a text file's documents are separated by blank lines (a folder holds one per .txt file)" \
            if Path(self.data).expanduser().is_file() else ""
        for length in sorted(self.lengths):
            if max(found) < length:
                raise UserError(f"none of the {len(found)} documents of {self.data} reaches {length} tokens (the "
                                f"longest has {max(found)}); use longer documents or shorter -T lengths{hint}")

    def plan(self, state: NllState) -> Iterator[Sample]:
        """Lazily: the runner takes only what `--limit` keeps."""
        for length in self.lengths:
            for index in range(state.count):
                yield Sample(id=f"nll-L{length}-{self._document_key(index, state)}", task=self.name,
                             axes={"context_length": length, "document": index}, data={"name": state.name(index)})

    def _document_key(self, index: int, state: NllState) -> str:
        """The seed and index of a generated document; the index and a digest of a read one's text,
        so that a record of an edited file's old text is never taken for its new text on resume."""
        if not state.read:
            return f"s{self.seed}-{index:05d}"
        return f"{index:05d}-{state.digests[index]}"

    # ---- requests and scores ---------------------------------------------------------------

    @staticmethod
    def _head(model: Any) -> list[int]:
        return list(model.encode(""))  # the special tokens a prompt starts with (BOS), if any

    def _ids(self, index: int, model: Any, needed: int, state: NllState) -> list[int]:
        def encode(text: str) -> list[int]:
            return list(model.encode(text, first=False))

        if self.data == "builtin":
            return leading_ids(encode, lambda chars: builtin_text(self.seed, index, chars), needed)
        text = state.read[index].text
        return leading_ids(encode, lambda chars: text[:chars], needed)

    def requests(self, sample: Sample, model: ModelAdapter, state: NllState) -> tuple[list[NllPass], dict[str, Any]]:
        head = self._head(model)
        length = sample.axes["context_length"]
        ids = self._ids(sample.axes["document"], model, length - len(head), state)
        info: dict[str, Any] = {"document_name": sample.data["name"]}
        if len(head) + len(ids) < length:
            return [], {**info, "skipped": True, "document_tokens": len(head) + len(ids)}
        window = tuple(head + ids)
        digest = hashlib.sha256(repr(window).encode()).hexdigest()
        return [NllPass(window, self.points_per_octave)], {**info, "skipped": False, "tokens": len(window),
                                                           "tokens_sha256": digest}

    def score(self, sample: Sample, outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Mean NLL over the window's predictions and over its second half; a skipped document
        (no pass) has no scores."""
        if not outputs:
            return {}
        sums = dict(zip(outputs[0]["positions"], outputs[0]["nll_sum"]))
        last = outputs[0]["predicted"]
        middle = max(1, last // 2)
        return {"nll": sums[last] / last, "nll_second_half": (sums[last] - sums[middle]) / max(1, last - middle)}

    def summary(self, frame: Any, run: RunView) -> dict[str, Any]:
        records = run.read_records()
        return {"documents": document_counts(records), "cumulative_nll": curve_summary(records)}
