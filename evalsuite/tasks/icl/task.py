"""Many-shot in-context learning with permuted demonstrations (Differential Transformer paper, §3.5).

What it measures: classification accuracy from demonstrations alone, as the
number of demonstrations grows (1 shot up to a 64K-token prompt), and how
much accuracy moves when the same demonstrations are shown in another order.

The prompt follows the protocol the paper cites (Bertsch et al. 2024): each
demonstration is two lines, "Question: <text>" and "Type: <label>" (field
names per dataset), joined by a separator line (`\n==\n` by default, the
`separator` parameter, backslash escapes understood). The demonstration block
is the request's shared `prefix` (the hf backend encodes it once per shot
count and order); the test question is the prompt, ending in "Type:".

Choices the paper leaves open, made here and exposed as parameters:
- labels are readable strings; the answer set is each label cut to its
  shortest prefix, at a boundary of the model's tokens, that begins no other
  label (a label that begins another stays whole). Demonstrations show the
  full labels;
- `method=generate` (default): greedy decoding constrained to that answer
  set; `method=loglikelihood`: the answer whose tokens have the highest
  summed log-probability. Either way exact match against the test label;
- demonstrations come from one seeded, label-balanced (round-robin over
  classes) ordering of the train split; the n-shot set is its first n, so
  sets are nested as n grows. More shots than the pool holds is an error;
  `shots=auto` takes the powers of two whose every prompt fits in
  min(max_tokens, the model's context), then the largest shot count that
  still fits (found by bisection on the model's tokenizer), so the sweep
  ends within one demonstration of the limit;
- `order`: random (a seeded shuffle), alternating (round-robin over classes)
  or grouped (all of one class together), or a comma list to run several in
  one run (`preset=paper-order`: random and alternating, 10 permutations,
  as the paper's Figure 7); each of the K `permutations` is a seeded class
  order and within-class order (random: a seeded shuffle);
- per shot count the summary gives the mean over permutations, the spread
  (best - worst, the paper's figure) and its noise floor, the standard
  deviation (ddof=1), and the test of "the order does not matter" over the
  same test questions, resampling the questions of one label class together
  and Holm-adjusted over the shot counts (order.py); every test example's
  outcome, and its label, is kept in the records;
- `-M chat_template` is not applied: demonstrations are plain text.

Per run, `prepare(model)` loads the data and draws the pool and the test
questions; with a model it also measures the answer set and the token counts
and fixes the shot counts (`IclState`). Without a model the plan needs listed
shot counts: `shots=auto` is fitted to a model's context.
"""

from __future__ import annotations

import codecs
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from evalsuite.contracts import TOKEN_IDS, ModelAdapter, TaskBase, TokenIds, offers
from evalsuite.errors import UserError, unknown
from evalsuite.params import CountList, PathText
from evalsuite.registry import register_task
from evalsuite.types import GenerationRequest, LoglikelihoodRequest, Sample

from .data import HUB_DATASETS, Example, IclData, arrange, balanced_pool, load_icl_data, test_sample
from .view import IclView

ORDERS = ("random", "alternating", "grouped")
METHODS = ("generate", "loglikelihood")
MAX_PERMUTATIONS = 100  # prepare measures every permutation's block against the context (the paper: 10)
PRESETS = {
    "paper": {"shots": "auto", "max_tokens": "65536", "permutations": "10", "test_size": "250"},
    "paper-order": {"shots": "auto", "max_tokens": "65536", "permutations": "10", "test_size": "250",
                    "order": "random,alternating"},
}


def demonstration(example: Example, fields: tuple[str, str]) -> str:
    return f"{fields[0]}: {example.text}\n{fields[1]}: {example.label}"


def question(text: str, fields: tuple[str, str]) -> str:
    return f"{fields[0]}: {text}\n{fields[1]}:"


def shortest_unique_prefixes(labels: Sequence[str], tokenize: Callable[[str], list[Any]]) -> list[str]:
    """Per label, its shortest prefix ending at one of its own token boundaries that
    begins no other label; a label that begins another label stays whole."""
    out = []
    for label in labels:
        tokens = tokenize(label)
        short = label
        for end in range(1, len(label)):
            piece = label[:end]
            piece_tokens = tokenize(piece)
            at_boundary = len(piece_tokens) < len(tokens) and piece_tokens == tokens[: len(piece_tokens)]
            if at_boundary and not any(o != label and o.startswith(piece) for o in labels):
                short = piece
                break
        out.append(short)
    return out


def resolve_answer(answer: str, labels: Sequence[str]) -> str | None:
    """The label an answer (a full label or its unique prefix) stands for."""
    answer = answer.strip()
    if answer in labels:
        return answer
    matches = [label for label in labels if answer and label.startswith(answer)]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Measured:
    """Token facts of the prepared model, measured once per run."""

    answers: tuple[str, ...]  # the answer set, aligned with the labels: ' ' + shortest unique prefix
    bos: int  # tokens of an empty prompt: the special tokens every prompt starts with
    longest_answer: int  # tokens of the longest answer
    budget: int  # tokens a prompt needs beyond its demonstrations: the longest question and answer


Block = tuple[str, int, int]  # (order, shots, permutation): one demonstration block


@dataclass
class IclState:
    """What `prepare` gives `plan` and `requests`: the data and its seeded draws, and, with a model,
    its token facts and the shot counts; demonstration blocks and their token counts are kept
    as they are built, one string per block, so every request of a block shares it."""

    data: IclData
    pool: list[Example]  # the demonstration pool in its label-balanced order; n shots are its first n
    test: list[Example]  # the test questions
    measured: Measured | None = None  # None: prepared without a model
    shot_counts: tuple[int, ...] | None = None  # None: shots=auto, with no model to fit them to
    blocks: dict[Block, str] = field(default_factory=dict)
    block_tokens: dict[Block, int] = field(default_factory=dict)


@register_task
@dataclass(frozen=True)
class Icl(TaskBase, name="icl", presets=PRESETS, view=IclView, group_by=("n_shots", "order", "permutation"),
          metrics=("correct",), primary_metric="correct",
          cluster_key="test_index",  # one test question, across shot counts and permutations
          gating_axes=("n_shots",),  # check gates correct per shot count
          smoke_plan={"dataset": "trec", "data": "{data}/icl/trec.jsonl", "shots": "1,2", "max_tokens": "1024",
                      "test_size": "4"}):
    """Many-shot in-context classification: accuracy vs shots, spread over demonstration orders (paper §3.5)."""

    dataset: str = "trec"  # trec, trec-fine, banking77, clinic150 (ignored when data is set)
    data: PathText = PathText()  # a local jsonl/csv/parquet file instead of a hub dataset (held absolute)
    text_field: str = "text"  # columns of a local file
    label_field: str = "label"
    shots: CountList = CountList("auto")  # comma list of shot counts (held sorted, each once), or auto
    max_tokens: int = 65536
    order: str = "random"  # or a comma list of orders, run side by side
    separator: str = "\\n==\\n"  # between demonstrations; backslash escapes (\\n) are understood
    permutations: int = 1
    method: str = "generate"
    test_size: int = 250
    seed: int = 0
    preset: str = ""

    def __post_init__(self) -> None:
        if not self.data and self.dataset not in HUB_DATASETS:
            raise unknown("dataset", self.dataset, HUB_DATASETS)
        for order in self.orders():
            if order not in ORDERS:
                raise unknown("-T order", order, ORDERS)
        if len(set(self.orders())) != len(self.orders()):
            raise ValueError(f"-T order lists an order twice: {self.order!r}")
        if not self.sep:
            raise ValueError("-T separator must not be empty")
        if self.method not in METHODS:
            raise unknown("-T method", self.method, METHODS)
        if self.shots != "auto":
            parts = [p.strip() for p in self.shots.split(",") if p.strip()]
            if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"-T shots must be auto or positive counts like 1,4,16, got {self.shots!r}")
        if self.permutations < 1 or self.test_size < 1:
            raise ValueError("-T permutations and -T test_size must be at least 1")
        if self.permutations > MAX_PERMUTATIONS:
            raise ValueError(f"-T permutations={self.permutations} is more than the cap of {MAX_PERMUTATIONS:,}")
        if self.max_tokens < 16:
            raise ValueError("-T max_tokens must be at least 16")

    def orders(self) -> tuple[str, ...]:
        return tuple(o.strip() for o in self.order.split(",") if o.strip())

    @property
    def sep(self) -> str:
        """The separator with its backslash escapes decoded ("\\n==\\n" -> a line of ==)."""
        return codecs.decode(self.separator, "unicode_escape")

    # ---- per-run state -------------------------------------------------------------------

    def prepare(self, model: ModelAdapter | None) -> IclState:
        """Load the data and draw the pool and test questions; with a model, measure its answer
        set and token counts and fix the shot counts (UserError when a prompt cannot fit)."""
        data = load_icl_data(self.dataset, self.data, self.text_field, self.label_field, self.test_size, self.seed)
        state = IclState(data, balanced_pool(data.train, self.seed), test_sample(data.test, self.test_size, self.seed))
        if model is None:
            state.shot_counts = None if self.shots == "auto" else self._listed_counts(state)
            return state
        state.measured = self._measure(state, model)
        state.shot_counts = self._fitted_counts(state, model)
        return state

    def _measure(self, state: IclState, model: ModelAdapter) -> Measured:
        def tokenize(text: str) -> list[Any]:
            if offers(model, TOKEN_IDS):  # the model's own token ids; else one token per byte
                return cast(TokenIds, model).encode(text, first=False)
            return list(text.encode())

        fields = state.data.fields
        answers = tuple(shortest_unique_prefixes([" " + label for label in state.data.labels], tokenize))
        bos = model.count_tokens("")
        longest_question = max(model.count_tokens(question(e.text, fields)) for e in state.test)
        longest_answer = max(model.count_tokens(a) - bos for a in answers)
        return Measured(answers, bos, longest_answer, longest_question - bos + longest_answer)

    def _listed_counts(self, state: IclState) -> tuple[int, ...]:
        """The -T shots counts, each within the demonstration pool."""
        counts = tuple(sorted({int(p) for p in self.shots.split(",") if p.strip()}))
        if counts[-1] > len(state.pool):
            raise UserError(f"-T shots={counts[-1]} is more than the {len(state.pool)} demonstrations in the "
                            f"train split of {state.data.name}; lower -T shots or use shots=auto")
        return counts

    def _fitted_counts(self, state: IclState, model: ModelAdapter) -> tuple[int, ...]:
        """The shot counts whose every prompt fits the model (shots=auto: chosen to fit)."""
        limit = model.max_context if self.shots != "auto" else min(self.max_tokens, model.max_context)
        one = self.needed_tokens(state, model, 1)
        if one > limit:
            raise UserError(f"a prompt cannot fit even one shot: 1 shot of {state.data.name} needs {one} tokens, "
                            f"the limit is {limit} ({model.name}'s context {model.max_context}, "
                            f"-T max_tokens {self.max_tokens})")
        if self.shots == "auto":
            return self._auto_counts(state, model, limit)
        counts = self._listed_counts(state)
        for n in counts:
            need = self.needed_tokens(state, model, n)
            if need > limit:
                raise UserError(f"-T shots={n} needs {need} tokens, more than {model.name}'s context of "
                                f"{limit}; lower -T shots, use shots=auto, or raise -M max_context")
        return counts

    def _auto_counts(self, state: IclState, model: ModelAdapter, limit: int) -> tuple[int, ...]:
        """Powers of two that fit, then the largest count that fits (bisection: prompts grow
        with the count), so the sweep reaches the limit instead of stopping below it."""
        pool = len(state.pool)
        counts = [1]
        while counts[-1] * 2 <= pool and self.needed_tokens(state, model, counts[-1] * 2) <= limit:
            counts.append(counts[-1] * 2)
        low, high = counts[-1], min(pool, counts[-1] * 2)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.needed_tokens(state, model, middle) <= limit else (low, middle - 1)
        return tuple(counts + ([low] if low > counts[-1] else []))

    # ---- demonstration blocks ------------------------------------------------------------

    def prefix(self, state: IclState, n: int, permutation: int, order: str | None = None) -> str:
        """The demonstration block of n shots in the given order and permutation (one string
        object per block, so every request of the block shares it)."""
        key = (order or self.orders()[0], n, permutation)
        if key not in state.blocks:
            rng = random.Random(f"icl-order-{self.seed}-{key[0]}-{n}-{permutation}")
            demos = arrange(state.pool[:n], key[0], rng)
            state.blocks[key] = self.sep.join(demonstration(d, state.data.fields) for d in demos) + self.sep
        return state.blocks[key]

    def prefix_tokens(self, state: IclState, model: ModelAdapter, n: int, permutation: int,
                      order: str | None = None) -> int:
        key = (order or self.orders()[0], n, permutation)
        if key not in state.block_tokens:
            state.block_tokens[key] = model.count_tokens(self.prefix(state, n, permutation, key[0]))
        return state.block_tokens[key]

    def needed_tokens(self, state: IclState, model: ModelAdapter, n: int) -> int:
        """The longest full prompt (demonstrations, question, answer) at n shots, over permutations."""
        blocks = max(self.prefix_tokens(state, model, n, p, o) for p in range(self.permutations)
                     for o in self.orders())
        return blocks + _measured(state).budget

    # ---- plan ----------------------------------------------------------------------------

    def plan(self, state: IclState) -> Iterator[Sample]:
        """Grouped by demonstration block, so the questions of one block run back to back."""
        if state.shot_counts is None:
            raise UserError("-T shots=auto fits the shot counts to a model's context: prepare the icl task "
                            "with a model, or list the counts (-T shots=1,4,16)")
        labels = state.data.labels
        for order in self.orders():
            for n in state.shot_counts:
                for permutation in range(self.permutations):
                    for example in state.test:
                        yield self._sample(order, n, permutation, example, labels)

    def _sample(self, order: str, n: int, permutation: int, example: Example, labels: tuple[str, ...]) -> Sample:
        sample_id = f"icl-{order}-n{n}-p{permutation}-s{self.seed}-t{example.index:05d}"
        # the label clusters the order statistics: questions of one class share a permutation's effect
        axes = {"n_shots": n, "order": order, "permutation": permutation, "method": self.method,
                "test_index": example.index, "label": example.label, "seed": self.seed}
        if example.cluster is not None:  # declared by the data (a `cluster` column): it clusters them instead
            axes["cluster"] = example.cluster
        # the label set rides with the sample: scoring maps an answer back to a label
        return Sample(id=sample_id, task=self.name, axes=axes, target=(example.label,),
                      data={"text": example.text, "labels": labels})

    def shard_key(self, sample: Sample) -> tuple[str, int, int]:
        """One demonstration block per data-parallel rank, so its prefix cache is built once."""
        return sample.axes["order"], sample.axes["n_shots"], sample.axes["permutation"]

    # ---- prompts -------------------------------------------------------------------------

    def requests(self, sample: Sample, model: ModelAdapter, state: IclState) -> tuple[list[Any], dict[str, Any]]:
        measured = _measured(state)
        n, permutation, order = sample.axes["n_shots"], sample.axes["permutation"], sample.axes["order"]
        prefix = self.prefix(state, n, permutation, order)
        prompt = question(sample.data["text"], state.data.fields)
        prefix_tokens = self.prefix_tokens(state, model, n, permutation, order)
        info = {"dataset": state.data.name, "prefix_tokens": prefix_tokens,
                "prompt_tokens": prefix_tokens + model.count_tokens(prompt) - measured.bos}
        if self.method == "loglikelihood":
            return [LoglikelihoodRequest(context=prompt, continuation=a, prefix=prefix) for a in measured.answers], info
        return [GenerationRequest(prompt=prompt, prefix=prefix, max_new_tokens=max(1, measured.longest_answer),
                                  stop=("\n",), choices=measured.answers)], info

    # ---- scoring -------------------------------------------------------------------------

    def score(self, sample: Sample, outputs: Sequence[Any]) -> dict[str, Any]:
        labels = sample.data["labels"]
        if self.method == "loglikelihood":
            logprobs = [o.logprob for o in outputs]  # Loglikelihood, live and read back alike (types.py)
            predicted: str | None = labels[max(range(len(labels)), key=lambda i: (logprobs[i], -i))]
        else:
            predicted = resolve_answer(outputs[0], labels)
        return {"correct": predicted == sample.target[0], "predicted": predicted}

    # ---- summary -------------------------------------------------------------------------

    def summary(self, frame: Any, run: Any) -> dict[str, Any]:
        from .order import order_rows  # scipy and pandas load when a run is summarised, not at registration

        return {"icl": {"dataset": self.dataset if not self.data else f"local:{Path(self.data).name}",
                        "order": self.order, "separator": self.separator, "method": self.method,
                        "shots": order_rows(frame)}}


def _measured(state: IclState) -> Measured:
    """The model's token facts, which only a state prepared with a model has."""
    if state.measured is None:
        raise UserError("the icl task's prompts need its state prepared with the model (prepare(model))")
    return state.measured
