"""Attention allocation (Differential Transformer paper, Table 3).

What it measures: on the needle task's own prompts (same lengths, depths, needles, queries and
seeds: `Needle` builds them, and sample ids are the needle task's, so the two runs join on id),
the share of attention that the positions where the model produces the answer pay to the answer
needle, and the share they pay to the rest of the context (noise), per answer depth and length.
The paper reports, Transformer vs DIFF: answer 0.03-0.09 vs 0.27-0.40, noise about 0.5 vs 0.01-0.02.

The prompt's regions, in tokens (a token belongs to a region when it overlaps its characters):
- bos: position 0 (BOS, or whatever opens the prompt: the attention sink), in neither share;
- answer: the answer needle sentence "The magic number of <city> is <number>.";
- query: from "Question:" to the end of what is measured, in neither share;
- noise: every other token before the query: instruction, filler and the other needles (their
  part of the noise is also recorded alone as `distractor_share`).

Query positions, `-T query_positions=` (each sample's share is the mean over its query rows):
- answer (default): teacher forcing, as the paper reads its answer positions. The true answer
  " <number>" is appended to the prompt and the rows are those that produce its tokens: the
  prompt's last token (which emits the answer's first token) and every answer token but the last
  (each emits the next). Only these rows produce the answer; with R > 1 it is the first answer,
  the one the prompt's answer prefix asks for;
- generated: the model's own greedy answer to the needle prompt (the needle task's request, its
  stop and token budget) is appended, and the rows are those that produced its tokens: the
  authors' reading, where a wrong answer is measured as answered. The answer is kept in the record;
- answer_prefix: the tokens of the answer prefix "The magic number of <city> is" that closes the
  prompt; only its last token produces an answer token, the others produce the prefix itself;
- last: the prompt's last token only;
- question: every token from "Question:" to the end;
- an integer k: the prompt's last k tokens.

Choices the paper leaves open, made here and exposed as parameters:
- layers and heads: the mean over every layer and head (`-T layers=0,5,-1` selects layers; the
  records keep each selected layer's shares, averaged over heads and query rows);
- DIFF models: each DIFF head's differential map w1 - λ·w2 (transformers' DiffLlama: component
  heads i and i + H/2, one λ per layer; DIFF V2: heads 2i and 2i + 1, λ per query row and head
  from the layer's input), divided by its own 1 - λ, as the paper normalises
  (`diff_norm=lambda`, default): every row then sums to exactly 1, a true share whatever λ is.
  `diff_norm=lambda_init` divides by 1 - λ_init (DiffLlama's fixed output scale; V2 has none),
  `none` keeps the raw map. Baselines use their softmax map.
Needs the ATTENTION_ALLOCATION capability (the hf backend), which reads only the query rows, a
chunk of keys at a time: memory is linear in the prompt (see docs/attention.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from evalsuite.contracts import ATTENTION_ALLOCATION, AttentionAllocation, ModelAdapter, TaskBase
from evalsuite.errors import UserError
from evalsuite.registry import register_task
from evalsuite.runs.view import RunView
from evalsuite.tasks.needle.task import ANSWER_PREFIX, NEEDLE, PRESETS, Needle, NeedleState
from evalsuite.types import GenerationRequest, Sample

from .view import AttentionView, by_depth, by_layer, markdown_tables

QUERY_MODES = ("answer", "generated", "answer_prefix", "last", "question")
DIFF_NORMS = ("lambda", "lambda_init", "none")
QUESTION = "Question:"


@dataclass(frozen=True)
class AttentionProbe:
    """A probe request: the attention that rows `queries` of `ids` pay to each region."""

    capability: ClassVar[str] = ATTENTION_ALLOCATION
    prompt: str  # the measured text: hashed into the record, kept whole with --log-prompts
    ids: tuple[int, ...]
    queries: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    regions: tuple[str, ...]  # the region of each span; a region may have several spans
    layers: tuple[int, ...] = ()  # () = all
    diff_norm: str = "lambda"
    generation: GenerationRequest | None = None  # given: the rows are those of the model's own answer to it

    def measure(self, model: Any) -> dict[str, Any]:
        """Per selected layer, each region's attention averaged over heads and query rows."""
        ids, queries, spans = self.ids, list(self.queries), self.spans
        answered: dict[str, Any] = {}
        if self.generation is not None:
            ids, queries, spans, answered = self._with_generated_answer(model, self.generation)
        found = model.attention_mass(ids, queries, spans, self.layers or None, self.diff_norm)
        per_span = found.mass.mean(axis=(1, 2))  # (layers, spans)
        per_layer = {region: per_span[:, [i for i, r in enumerate(self.regions) if r == region]].sum(axis=1).tolist()
                     for region in dict.fromkeys(self.regions)}
        return {"layers": list(found.layers), "map": found.attention_map, "normalisation": found.normalisation,
                "lambdas": list(found.lambdas), "per_layer": per_layer, **answered}

    def _with_generated_answer(self, model: Any, generation: GenerationRequest) -> tuple[
            tuple[int, ...], list[int], tuple[tuple[int, int], ...], dict[str, Any]]:
        """The prompt followed by the model's greedy answer: its ids, the rows that produced the answer's
        tokens (row i's logits predict token i + 1; an empty answer: the prompt's last row, which ended
        it), the query span stretched over the answer, and the answer with its rows for the record."""
        (answer,) = model.generate([generation])
        ids, _ = model.encode_with_offsets(self.prompt + answer)
        start = len(self.ids)
        if tuple(ids[:start]) != self.ids:  # a token across the boundary: no row emits the answer alone
            raise UserError(f"the tokenizer merges the prompt's end with the generated answer {answer!r}; "
                            "use -T query_positions=last")
        rows = list(range(start - 1, max(len(ids), start + 1) - 1))
        spans = (*self.spans[:-1], (self.spans[-1][0], len(ids)))
        return tuple(ids), rows, spans, {"generated": answer, "query_rows": rows}


def token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """[first, last + 1) over the tokens whose characters overlap text[start:end]."""
    inside = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    assert inside, f"no token covers characters {start}..{end}"
    return inside[0], inside[-1] + 1


def needle_of(task: Attention) -> Needle:
    """The needle task of the same parameters, which plans this task's samples and builds its prompts
    (needle parameters this task does not have keep their defaults)."""
    return Needle(**{f.name: getattr(task, f.name) for f in fields(Needle) if hasattr(task, f.name)})


@dataclass(frozen=True)
class AttentionState:
    """What a run reads: the needle task that builds the prompts, and that task's own state."""

    needle: Needle
    needle_state: NeedleState


@register_task
@dataclass(frozen=True)
class Attention(TaskBase, name="attention", presets=PRESETS, view=AttentionView, group_by=Needle.group_by,
                metrics=("answer_share", "noise_share"), lower_is_better=("noise_share",),
                primary_metric="answer_share",  # gated per cell of group_by
                smoke_plan={"lengths": "128,256", "depths": "0,1", "samples": "1"}):
    """Attention allocation: share of attention on the answer needle vs the noise, by depth (paper Table 3)."""

    # the needle task's parameters and defaults: its plan and prompts are this task's
    lengths: tuple[int, ...] = Needle.lengths
    depths: tuple[float, ...] = Needle.depths
    needles: tuple[int, ...] = Needle.needles
    queries: tuple[int, ...] = Needle.queries
    samples: int = Needle.samples
    haystack: str = Needle.haystack
    haystack_field: str = Needle.haystack_field
    tokens_per_query: int = Needle.tokens_per_query
    seed: int = Needle.seed
    preset: str = Needle.preset
    # what is measured
    query_positions: str = "answer"  # answer | answer_prefix | last | question | an integer k
    layers: tuple[int, ...] = ()  # () = every layer; negative indices count from the last
    diff_norm: str = "lambda"  # DIFF maps divided by the layer's 1 - λ | 1 - λ_init (lambda_init) | 1 (none)

    def __post_init__(self) -> None:
        needle_of(self)  # the needle task checks its own parameters
        mode = self.query_positions
        if mode not in QUERY_MODES and not (mode.isdigit() and int(mode) >= 1):
            raise ValueError(f"-T query_positions must be one of {', '.join(QUERY_MODES)} or a number of last "
                             f"tokens (e.g. 8), got {mode!r}")
        if self.diff_norm not in DIFF_NORMS:
            raise ValueError(f"-T diff_norm must be one of {', '.join(DIFF_NORMS)}, got {self.diff_norm!r}")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"-T layers lists a layer twice: {','.join(map(str, self.layers))}")

    def required_capabilities(self) -> tuple[str, ...]:
        return (ATTENTION_ALLOCATION,)

    def prepare(self, model: ModelAdapter | None) -> AttentionState:
        """The needle task prepared for this model (its checks, its haystack), then the layers checked."""
        needle = needle_of(self)
        state = AttentionState(needle, needle.prepare(model))
        if model is not None:
            self._check_layers(model)
        return state

    def _check_layers(self, model: ModelAdapter) -> None:
        assert isinstance(model, AttentionAllocation), "the runner checked the capability first"
        count = model.attention_layers()
        outside = [layer for layer in self.layers if not -count <= layer < count]
        if outside:
            raise UserError(f"-T layers={','.join(map(str, outside))}: {model.name} has layers 0..{count - 1} "
                            f"(or -{count}..-1 from the end)")

    def plan(self, state: AttentionState) -> Iterator[Sample]:
        """The needle task's samples (same ids, so the two runs join on id), as this task's."""
        for sample in state.needle.plan(state.needle_state):
            yield replace(sample, task=self.name)

    # ---- the prompt's regions and query rows ----------------------------------------------------

    def requests(self, sample: Sample, model: ModelAdapter, state: AttentionState
                 ) -> tuple[list[AttentionProbe], dict[str, Any]]:
        (generation,), facts = state.needle.requests(sample, model, state.needle_state)
        prompt = generation.prompt
        text = prompt + (f" {sample.target[0]}" if self.query_positions == "answer" else "")
        assert isinstance(model, AttentionAllocation), "the runner checked the capability first"
        ids, offsets = model.encode_with_offsets(text)
        spans, regions = self._regions(sample, prompt, offsets)
        generated = self.query_positions == "generated"  # the rows are known once the model has answered
        queries = [] if generated else self._queries(sample, prompt, text, offsets)
        probe = AttentionProbe(prompt=text, ids=tuple(ids), queries=tuple(queries), spans=tuple(spans),
                               regions=tuple(regions), layers=self.layers, diff_norm=self.diff_norm,
                               generation=generation if generated else None)
        # generated: the output holds the rows and the answer, and the query span runs on over the answer
        info = {**facts, "measured_tokens": len(ids), "answer_span": list(spans[1]), "query_span": list(spans[-1]),
                **({} if generated else {"query_rows": queries})}
        return [probe], info

    def _regions(self, sample: Sample, prompt: str, offsets: Sequence[tuple[int, int]]
                 ) -> tuple[list[tuple[int, int]], list[str]]:
        """Token spans and their regions: bos, answer, noise (two spans around the answer),
        the other needles (inside the noise), and the query last."""
        needles = [NEEDLE.format(city=c, number=x) for c, x in zip(sample.data["cities"], sample.data["numbers"])]
        located = [token_span(offsets, prompt.index(n), prompt.index(n) + len(n)) for n in needles]
        question = token_span(offsets, prompt.rindex(QUESTION), len(prompt))[0]
        (first, last), end = located[0], len(offsets)
        assert 1 <= first < last <= question, "bos < answer needle < question"
        spans = [(0, 1), (first, last), (1, first), (last, question), *located[1:], (question, end)]
        regions = ["bos", "answer", "noise", "noise", *["distractor"] * (len(located) - 1), "query"]
        return spans, regions

    def _queries(self, sample: Sample, prompt: str, text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
        mode = self.query_positions
        if mode == "answer":  # row i's logits predict token i + 1: the row before each answer token emits it
            first, last = token_span(offsets, len(prompt), len(text))
            if offsets[first][0] < len(prompt):  # a token across the boundary: no row emits the answer alone
                raise UserError(f"the tokenizer merges the prompt's end with the answer ({text[offsets[first][0]:]!r}); "
                                "use -T query_positions=last")
            return list(range(first - 1, last - 1))
        end = len(offsets)
        if mode == "last":
            return [end - 1]
        if mode == "question":
            return list(range(token_span(offsets, prompt.rindex(QUESTION), len(prompt))[0], end))
        if mode == "answer_prefix":
            prefix = ANSWER_PREFIX.format(city=sample.data["cities"][0])
            return list(range(token_span(offsets, prompt.rindex(prefix), len(prompt))[0], end))
        if int(mode) > end:
            raise UserError(f"-T query_positions={mode} asks for more rows than the prompt's {end} tokens")
        return list(range(end - int(mode), end))

    # ---- scores (their presentation is AttentionView's) -------------------------------------------

    def score(self, sample: Sample, outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Each region's share: the mean over the selected layers of the per-layer shares."""
        per_layer = outputs[0]["per_layer"]
        return {f"{region}_share": sum(values) / len(values) for region, values in per_layer.items()}

    def summary(self, frame: Any, run: RunView) -> dict[str, Any]:
        records = run.read_records()
        return {"by_depth": by_depth(frame), "by_layer": by_layer(records), "table": markdown_tables(frame, records)}
