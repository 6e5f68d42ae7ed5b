"""Non-literal needles (NoLiMa, Modarressi et al., ICML 2025), on the needle task's depth x length grid.

What it measures: a needle ("Tobias lives next to the Atomium.") hidden at a depth of a haystack
of an exact token length, and a question that shares no content word with it ("Which character
has been to Brussels?"): a model cannot match strings, it must connect the two. Two hops add a
bridge fact elsewhere in the haystack ("Tobias lives next to the Marrowby kiosk." ... "The
Marrowby kiosk stands right next to the Atomium."). Distractors repeat the question's words
("There was a long article about Brussels...") and name no character. The answer is the
needle's character; an output is correct when it holds that name as a whole word, in any case.

Sample i of a hop kind holds the same pair and character at every length and depth (pairs in a
seeded order: up to the set's size, distinct pairs); each cell draws its own haystack and places.
`needle_set`: `builtin` (needles.py) or a NoLiMa needle-set file (nolima_format.py).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from evalsuite.contracts import ModelAdapter, TaskBase
from evalsuite.registry import register_task
from evalsuite.tasks.kit import Haystack, Layout, build_prompt, cells, check_lengths
from evalsuite.types import GenerationRequest, Sample

from .needles import CHAR, HOPS, Pair
from .nolima_format import load_pairs
from .view import NolimaView

INSTRUCTION = ("Below is a passage from a story. Read it closely: a question about one of its characters "
               "follows it. Answer with the character's name alone.")


@dataclass(frozen=True)
class NolimaState:
    """What a run reads besides its parameters: the haystack and the pairs by hop kind, loaded once."""

    haystack: Haystack
    pairs: dict[str, list[Pair]]


@register_task
@dataclass(frozen=True)
class Nolima(TaskBase):
    """Non-literal needles: questions that share no word with the needle they ask about (NoLiMa)."""

    name: ClassVar[str] = "nolima"
    plan_version: ClassVar[int] = 1  # bump when samples or prompts change
    score_version: ClassVar[int] = 1  # bump when scoring changes
    view: ClassVar[type[NolimaView]] = NolimaView
    group_by: ClassVar[tuple[str, ...]] = ("hops", "context_length", "depth")
    metrics: ClassVar[tuple[str, ...]] = ("correct",)
    gating_axes: ClassVar[tuple[str, ...] | None] = ("hops", "context_length", "depth")
    primary_metric: ClassVar[str | None] = "correct"

    lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    hops: tuple[str, ...] = HOPS
    samples: int = 4  # per (hops, length, depth) cell
    distractors: int = 1  # literal-match distractors per prompt (at most the pair's)
    needle_set: str = "builtin"
    haystack: str = "builtin"
    haystack_field: str = "text"
    tokens: int = 12  # the answer's new tokens: prompt + tokens = the length
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
        haystack = Haystack.load(self.haystack, self.haystack_field)
        if model is not None:
            haystack.check(model, max(self.lengths))
        return NolimaState(haystack, load_pairs(self.needle_set, self.hops))

    def plan(self, state: NolimaState | None) -> Iterator[Sample]:
        """The samples depend on the parameters and the pairs (read here when no state is given)."""
        pairs = state.pairs if state is not None else load_pairs(self.needle_set, self.hops)
        for hops in self.hops:
            order = list(range(len(pairs[hops])))
            random.Random(f"nolima-{hops}-s{self.seed}").shuffle(order)
            for length, depth, index in cells(self.lengths, self.depths, self.samples):
                yield self._sample(pairs[hops][order[index % len(order)]], length, depth, index)

    def _sample(self, pair: Pair, length: int, depth: float, index: int) -> Sample:
        sample_id = f"nolima-{pair.hops}-L{length}-d{depth:g}-s{self.seed}-{index:03d}"
        name = random.Random(f"nolima-{pair.hops}-s{self.seed}-{index:03d}").choice(pair.characters)
        rng = random.Random(sample_id)
        distractors = rng.sample(pair.distractors, min(self.distractors, len(pair.distractors)))
        placed = [pair.bridge] * bool(pair.bridge) + distractors
        data = {"pair": pair.id, "needle": pair.needle.replace(CHAR, name), "question": pair.question,
                "bridge": pair.bridge, "distractors": distractors, "positions": [rng.random() for _ in placed],
                "filler_seed": rng.randrange(2**31)}
        axes = {"hops": pair.hops, "context_length": length, "depth": depth, "seed": self.seed}
        return Sample(id=sample_id, task=self.name, axes=axes, target=(name,), data=data)

    def requests(self, sample: Sample, model: ModelAdapter, state: NolimaState
                 ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        data = sample.data
        others = list(zip(data["positions"], [data["bridge"]] * bool(data["bridge"]) + data["distractors"]))
        layout = Layout(INSTRUCTION)
        built = build_prompt(model, state.haystack, tokens=sample.axes["context_length"] - self.tokens,
                             depth=sample.axes["depth"], item=data["needle"], others=others, seed=data["filler_seed"],
                             render=lambda haystack: layout.render(model, haystack, data["question"]))
        info = {**built.facts, "answer_budget": self.tokens, "pair": data["pair"], "needle": data["needle"],
                "bridge": data["bridge"], "question": data["question"]}
        return [GenerationRequest(prompt=built.prompt, max_new_tokens=self.tokens, stop=("\n",))], info

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        named = re.search(rf"(?<!\w){re.escape(sample.target[0])}(?!\w)", outputs[0], re.IGNORECASE)
        return {"correct": named is not None}
