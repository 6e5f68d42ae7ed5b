"""Non-literal needles (NoLiMa, Modarressi et al., ICML 2025), on the needle task's depth x length grid.

What it measures: a needle ("Tobias lives next to the Atomium.") hidden at a depth of a haystack
of an exact token length, and a question that shares no content word with it ("Which character
has been to Brussels?"): a model cannot match strings, it must connect the two. Two hops add a
bridge fact elsewhere in the haystack ("Tobias lives next to the Marrowby kiosk." ... "The
Marrowby kiosk stands right next to the Atomium."). Distractors repeat the question's words
("There was a long article about Brussels...") and name no character. The haystack names other
people (the built-in story, story.py; a user's text is filtered of the needle set's names and
keys, haystack.py), so the needle's character is one candidate among several.

Each sample asks two questions over the same haystack: its own, and another pair's (the
mismatched question, whose right answer is "none"). Scores (answers.py): `correct`, the strict
reading of the answer to its own question (the needle's character and no other name, not negated,
hedged or retracted); `contains`, NoLiMa's own rule (the name as a substring); `mismatch_none`,
the other question answered "none"; `mismatch_named`, the other question answered with the needle's
character by the strict reading (a model that does not read the question names it as often as on
its own). `correct` alone is the headline: the effective length and the gate read it. Each record
also keeps the question-blind rules' scores on its prompt (blind.py), a property of the prompt.

Sample i of a hop kind holds the same pair, character and mismatched question at every length and
depth (pairs in a seeded order: up to the set's size, distinct pairs); each cell draws its own
haystack and places. `needle_set`: `builtin` (needles.py) or a NoLiMa needle-set file (nolima_format.py).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from evalsuite.contracts import ModelAdapter, TaskBase
from evalsuite.errors import UserError
from evalsuite.registry import register_task
from evalsuite.tasks.kit import Built, Layout, build_prompt, cells, check_lengths
from evalsuite.types import GenerationRequest, Sample

from .answers import contains, named, says_none
from .blind import blind_scores
from .haystack import StoryHaystack, story_haystack, term_pattern
from .needles import CHAR, HOPS, Pair
from .nolima_format import load_pairs
from .story import cast_names
from .view import NolimaView

REDRAWS = 8  # haystack draws a prompt may take to reach its exact length (see Nolima._fit)
INSTRUCTION = ("Read the story below, then answer the question with the character's name alone, or with \"none\" "
               "if no character fits.")


@dataclass(frozen=True)
class NolimaState:
    """What a run reads besides its parameters: the haystack, the pairs by hop kind and every name the
    haystack may hold (the characters and the story's cast), loaded once."""

    haystack: StoryHaystack
    pairs: dict[str, list[Pair]]
    names: frozenset[str]


@register_task
@dataclass(frozen=True)
class Nolima(TaskBase, name="nolima", plan_version=2, score_version=2, view=NolimaView,
             group_by=("hops", "context_length", "depth"),
             metrics=("correct", "contains", "mismatch_none", "mismatch_named"), lower_is_better=("mismatch_named",),
             gating_axes=("hops", "context_length", "depth"), primary_metric="correct",
             smoke_plan={"lengths": "2000,3000", "depths": "0,1", "samples": "1"}):
    """Non-literal needles: questions that share no word with the needle they ask about (NoLiMa)."""

    lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    hops: tuple[str, ...] = HOPS
    samples: int = 4  # per (hops, length, depth) cell
    distractors: int = 1  # literal-match distractors per prompt (at most the pair's)
    needle_set: str = "builtin"
    haystack: str = "builtin"
    haystack_field: str = "text"
    # the answer's new tokens (prompt + tokens = the length): room for a chat model that restates the
    # question before the name ("Based on the passage, the character who has been to Rio de Janeiro is ...")
    tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 16:
            raise ValueError("-T lengths must be token counts of at least 16, e.g. lengths=1024,2048")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError("-T depths must be fractions between 0 and 1, e.g. depths=0,0.5,1")
        if not self.hops or len(set(self.hops)) != len(self.hops):
            raise ValueError("-T hops must name distinct question kinds, e.g. hops=onehop,twohop")
        if not 1 <= self.samples <= 100_000 or self.distractors < 0 or self.tokens < 1:
            raise ValueError("-T samples (1 to 100,000) and tokens must be at least 1, distractors at least 0")

    def prepare(self, model: ModelAdapter | None) -> NolimaState:
        """The haystack and the pairs; with a model, a length it cannot hold is refused here."""
        if model is not None:
            check_lengths(model, self.lengths, self.tokens)
        pairs = load_pairs(self.needle_set, self.hops)
        every = [p for kind in pairs.values() for p in kind]
        characters = tuple(dict.fromkeys(c for p in every for c in p.characters))
        terms = tuple(dict.fromkeys([*characters, *(t for p in every for t in p.terms)]))
        cast = story_cast(terms)
        haystack = story_haystack(self.haystack, self.haystack_field, cast, terms)
        if model is not None:
            haystack.check(model, max(self.lengths))
        return NolimaState(haystack, pairs, frozenset((*characters, *cast)))

    def plan(self, state: NolimaState | None) -> Iterator[Sample]:
        """The samples depend on the parameters and the pairs (read here when no state is given)."""
        pairs = state.pairs if state is not None else load_pairs(self.needle_set, self.hops)
        for hops in self.hops:
            order = list(range(len(pairs[hops])))
            random.Random(f"nolima-{hops}-s{self.seed}").shuffle(order)
            for length, depth, index in cells(self.lengths, self.depths, self.samples):
                pair = pairs[hops][order[index % len(order)]]
                yield self._sample(pair, mismatched(pair, pairs[hops], f"nolima-{hops}-s{self.seed}-{index:03d}"),
                                   length, depth, index)

    def _sample(self, pair: Pair, other: Pair, length: int, depth: float, index: int) -> Sample:
        sample_id = f"nolima-{pair.hops}-L{length}-d{depth:g}-s{self.seed}-{index:03d}"
        name = random.Random(f"nolima-{pair.hops}-s{self.seed}-{index:03d}").choice(pair.characters)
        rng = random.Random(sample_id)
        distractors = rng.sample(pair.distractors, min(self.distractors, len(pair.distractors)))
        placed = [pair.bridge] * bool(pair.bridge) + distractors
        data = {"pair": pair.id, "needle": pair.needle.replace(CHAR, name), "question": pair.question,
                "bridge": pair.bridge, "distractors": distractors, "positions": [rng.random() for _ in placed],
                "filler_seed": rng.randrange(2**31), "mismatch_pair": other.id, "mismatch": other.question,
                "characters": list(pair.characters)}
        axes = {"hops": pair.hops, "context_length": length, "depth": depth, "seed": self.seed}
        return Sample(id=sample_id, task=self.name, axes=axes, target=(name,), data=data)

    def requests(self, sample: Sample, model: ModelAdapter, state: NolimaState
                 ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        """The sample's own question and the mismatched one, over the same haystack (the second prompt
        differs from the first by the question alone, so its length differs by the questions' tokens)."""
        data = sample.data
        layout = Layout(INSTRUCTION)
        built, redraws = self._fit(sample, model, state, layout)
        mismatch = layout.render(model, " ".join(built.placement.haystack), data["mismatch"])
        info = {**built.facts, "answer_budget": self.tokens, "filler_redraws": redraws, "pair": data["pair"],
                "needle": data["needle"], "bridge": data["bridge"], "question": data["question"],
                "mismatch_pair": data["mismatch_pair"], "mismatch": data["mismatch"],
                **self._haystack_facts(state, built.placement.haystack, sample)}
        return [GenerationRequest(prompt=p, max_new_tokens=self.tokens, stop=("\n",))
                for p in (built.prompt, mismatch)], info

    def _fit(self, sample: Sample, model: ModelAdapter, state: NolimaState, layout: Layout) -> tuple[Built, int]:
        """The prompt at its exact length, and how many haystack draws before it were passed over. A
        fit closes its last gap a word at a time, and a name is several tokens to a small vocabulary
        (the toy models'): a draw whose gap falls at a name, a few tokens short of the length, is
        drawn again from the next seed (a handful of short prompts in a hundred, with the toy models)."""
        data = sample.data
        others = list(zip(data["positions"], [data["bridge"]] * bool(data["bridge"]) + data["distractors"]))
        failure = None
        for redraw in range(REDRAWS):
            try:
                built = build_prompt(model, state.haystack, tokens=sample.axes["context_length"] - self.tokens,
                                     depth=sample.axes["depth"], item=data["needle"], others=others,
                                     seed=data["filler_seed"] + redraw,
                                     render=lambda haystack: layout.render(model, haystack, data["question"]))
                return built, redraw
            except UserError as exc:
                failure = exc
        assert failure is not None
        raise failure

    def _haystack_facts(self, state: NolimaState, pieces: Sequence[str], sample: Sample) -> dict[str, Any]:
        """The question-blind rules' scores on the built-in story (a user's text names people the rules
        have no list of), or the sentences the filter left out of a user's text."""
        if state.haystack.text is not None:
            return {"haystack_dropped": state.haystack.dropped}
        return blind_scores(pieces, state.names, sample.target[0])

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        answer, (own, other) = sample.target[0], outputs
        names = {*cast_names(), *sample.data["characters"]}
        return {"correct": named(own, answer, names), "contains": contains(own, answer),
                "mismatch_none": says_none(other, names), "mismatch_named": named(other, answer, names)}


def story_cast(terms: Sequence[str]) -> tuple[str, ...]:
    """The story's people less any a term rules out (a character's name, or one a key starts)."""
    pattern = term_pattern(terms)
    return tuple(n for n in cast_names() if pattern is None or not pattern.match(n))


def mismatched(pair: Pair, pairs: Sequence[Pair], key: str) -> Pair:
    """Another pair of the same kind whose question `pair`'s needle does not answer, drawn by `key`."""
    candidates = [p for p in pairs if pair.unrelated(p)]
    if not candidates:
        raise UserError(f"the needle set has no question unrelated to pair {pair.id} ({pair.hops}) for the "
                        "mismatched-question control: it needs pairs from two or more entries")
    return random.Random(key).choice(candidates)
