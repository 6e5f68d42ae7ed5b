"""Multi-needle retrieval (Differential Transformer paper, §3.4).

What it measures: N needles ("The magic number of <city> is <7 digits>.") are
hidden in a haystack built to an exact token length; the model is asked for
the numbers of R of those cities. The first queried city's needle sits at the
requested depth (0 = start of the haystack, 1 = end), measured in tokens: the
share of the haystack's other tokens, distractor needles included, that come
before it; the other needles sit at seeded random sentence boundaries.

Choices the paper leaves open, made here and exposed as parameters:
- the haystack is generated filler by default (`haystack=builtin`), or a text
  file, or `dataset:NAME[:SPLIT]` (column `haystack_field`);
- a length is what the model holds: the prompt is built to `length - answer
  budget` tokens (budget = `tokens_per_query` x R new tokens), so a 4K model
  runs the 4K preset as it is; records keep `prompt_tokens` and `answer_budget`;
- scoring is strict, per queried city: the output must offer exactly one
  number for the city, the needle's (`kit/numbers.py` and `kit/digits.py` say how a number is read,
  digit groups and fullwidth digits included, and which city it answers: the
  answer prefix's city first, then cities named beside a number or listed in
  order). Several distinct numbers for one city are wrong and recorded as
  `ambiguous`. `correct_all` (every query right) and `correct_mean` (mean over
  queries) use this rule, and the heatmaps show `correct_all`. The group's
  public rule, "the needle's digits appear as a substring of the output", is
  recorded too as `correct_all_substring` and `correct_mean_substring`: it
  credits swapped attributions, lists of every number and longer numbers;
- greedy decoding of the answer budget, stopping at a newline for R = 1 and at
  a blank line for R > 1 (so an answer per line is read);
- a length the model cannot hold (length > max context) is an error before
  anything runs, not a silently skipped cell;
- each sample draws its own haystack and needles by default. `shared_haystack=true`
  follows the usual needle-in-a-haystack protocol instead: sample i of a setting
  has the same haystack, cities and numbers at every length and depth (the
  haystack cut to each length), so depths are paired on identical context and
  prompts of one haystack begin alike up to the shallower needle, which the hf
  backend's automatic prefix sharing prefills once. The plan then runs sample by
  sample (lengths, then depths, inside), so prompts of one haystack share a call.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from evalsuite.contracts import ModelAdapter, TaskBase
from evalsuite.registry import register_task
from evalsuite.tasks.kit import Haystack, Layout, build_prompt, cells, check_lengths
from evalsuite.tasks.kit.numbers import grade, substring_hits
from evalsuite.types import GenerationRequest, Sample

from .view import NEEDLE as NEEDLE  # the needle sentence, part of the prompt's text like INSTRUCTION
from .view import NeedleView, needle_sentences

INSTRUCTION = (
    "Some special magic numbers are hidden within the following text. "
    "Make sure to memorize them. I will quiz you about the numbers afterwards."
)
ANSWER_PREFIX = "The magic number of {city} is"

CITIES = (
    "Amsterdam", "Athens", "Bangkok", "Barcelona", "Beijing", "Berlin", "Bogota", "Boston", "Brussels",
    "Budapest", "Cairo", "Chicago", "Copenhagen", "Dakar", "Delhi", "Dublin", "Geneva", "Hamburg",
    "Havana", "Helsinki", "Istanbul", "Jakarta", "Kyoto", "Lagos", "Lima", "Lisbon", "London",
    "Madrid", "Manila", "Marseille", "Melbourne", "Miami", "Milan", "Montreal", "Moscow", "Mumbai",
    "Munich", "Nairobi", "Naples", "Oslo", "Paris", "Prague", "Quito", "Riga", "Rome", "Santiago",
    "Seattle", "Seoul", "Shanghai", "Singapore", "Stockholm", "Sydney", "Taipei", "Tokyo", "Toronto",
    "Valencia", "Vancouver", "Venice", "Vienna", "Warsaw", "Zurich",
)

MAX_SAMPLES_PER_CELL = 100_000
PRESETS = {
    "paper-4k": {"lengths": "4096", "depths": "0,0.25,0.5,0.75,1", "needles": "1,2,4,6", "queries": "1,2,2,2",
                 "samples": "50"},
    "paper-64k": {"lengths": ",".join(str(8192 * k) for k in range(1, 9)), "depths": "0,0.25,0.5,0.75,1",
                  "needles": "8", "queries": "1", "samples": "50"},
}
NeedleState = Haystack  # what a needle run reads besides its parameters: the haystack (kit.prompt)


def question_for(cities: list[str]) -> str:
    if len(cities) == 1:
        return f"What is the magic number of {cities[0]}?"
    listed = ", ".join(cities[:-1]) + f" and {cities[-1]}"
    return f"What are the magic numbers of {listed}?"


@register_task
@dataclass(frozen=True)
class Needle(TaskBase, name="needle", presets=PRESETS, view=NeedleView,
             score_version=2,  # 2: footnote marks, asides, "not X but Y", retractions
             group_by=("n_needles", "n_queries", "context_length", "depth"),
             metrics=("correct_all", "correct_mean", "correct_all_substring", "correct_mean_substring"),
             gating_axes=("context_length", "depth"), primary_metric="correct_all",  # check: correct_all per cell
             # added after runs were recorded: left out of a run's params at False, which keeps their samples
             quiet_defaults={"shared_haystack": False},
             smoke_plan={"lengths": "2000,3000", "depths": "0,1", "needles": "1,3", "queries": "1,2", "samples": "2"}):
    """Multi-needle retrieval: recall magic numbers hidden at a depth in a long haystack (paper §3.4)."""

    lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    needles: tuple[int, ...] = (1,)  # N per setting; paired with `queries` position by position
    queries: tuple[int, ...] = (1,)  # R per setting
    samples: int = 4  # per (setting, length, depth) cell
    haystack: str = "builtin"
    haystack_field: str = "text"
    tokens_per_query: int = 20
    seed: int = 0
    preset: str = ""
    shared_haystack: bool = False  # one haystack per sample index across lengths and depths (a quiet default)

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 16:
            raise ValueError("-T lengths must be token counts of at least 16, e.g. lengths=1024,2048")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError("-T depths must be fractions between 0 and 1, e.g. depths=0,0.5,1")
        if len(self.needles) != len(self.queries):
            raise ValueError("-T needles and -T queries must list the same number of settings")
        for n, r in zip(self.needles, self.queries):
            if not 1 <= r <= n <= len(CITIES):
                raise ValueError(f"need 1 <= queries <= needles <= {len(CITIES)}, got needles={n} queries={r}")
        if self.samples < 1 or self.tokens_per_query < 1:
            raise ValueError("-T samples and -T tokens_per_query must be at least 1")
        if self.samples > MAX_SAMPLES_PER_CELL:
            raise ValueError(f"-T samples={self.samples} is more than {MAX_SAMPLES_PER_CELL:,} per cell; "
                             "a typo? (the paper uses 50)")

    def plan(self, state: Haystack | None) -> Iterator[Sample]:
        """The samples depend on the parameters alone (`state`, the haystack, is for `requests`);
        shared haystacks put one haystack's prompts side by side, so they share a model call."""
        for n, r in zip(self.needles, self.queries):
            for length, depth, index in cells(self.lengths, self.depths, self.samples, self.shared_haystack):
                yield self._sample(n, r, length, depth, index)

    def _sample(self, n: int, r: int, length: int, depth: float, index: int) -> Sample:
        sample_id = f"needle-N{n}-R{r}-L{length}-d{depth:g}-s{self.seed}-{index:03d}"
        # shared: the draws of sample `index` of the setting, whatever its length and depth
        rng = random.Random(f"needle-N{n}-R{r}-s{self.seed}-{index:03d}" if self.shared_haystack else sample_id)
        cities = rng.sample(CITIES, n)
        numbers = [str(rng.randrange(1_000_000, 10_000_000)) for _ in cities]
        while len(set(numbers)) < n:  # distinct numbers, so a right answer cannot be a lucky copy
            numbers = [str(rng.randrange(1_000_000, 10_000_000)) for _ in cities]
        others = [rng.random() for _ in range(n - 1)]  # relative positions of the distractor needles
        axes = {"n_needles": n, "n_queries": r, "context_length": length, "depth": depth, "seed": self.seed}
        data = {"cities": cities, "numbers": numbers, "others": others, "filler_seed": rng.randrange(2**31)}
        return Sample(id=sample_id, task=self.name, axes=axes, target=tuple(numbers[:r]), data=data)

    def prepare(self, model: ModelAdapter | None) -> Haystack:
        """The haystack, loaded once per run; with a model, what refuses the run before anything
        runs: a length it cannot hold, no room for the answer, a haystack too short."""
        if model is not None:
            check_lengths(model, self.lengths, self.tokens_per_query * max(self.queries))
        state = Haystack.load(self.haystack, self.haystack_field)
        if model is not None:
            state.check(model, max(self.lengths))
        return state

    def requests(self, sample: Sample, model: ModelAdapter, state: Haystack
                 ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        r = sample.axes["n_queries"]
        query = sample.data["cities"][:r]
        needles = needle_sentences(sample.data)
        budget = self.tokens_per_query * r  # the answer's new tokens: prompt + budget = the length
        layout = Layout(INSTRUCTION)  # built per call: the module's text is what the prompt shows
        built = build_prompt(model, state, tokens=sample.axes["context_length"] - budget, depth=sample.axes["depth"],
                             item=needles[0], others=list(zip(sample.data["others"], needles[1:])),
                             seed=sample.data["filler_seed"],
                             render=lambda haystack: layout.render(model, haystack, question_for(query),
                                                                   ANSWER_PREFIX.format(city=query[0])))
        info = {**built.facts, "answer_budget": budget, "needle_chars": [built.prompt.index(n) for n in needles]}
        request = GenerationRequest(prompt=built.prompt, max_new_tokens=budget, stop=("\n",) if r == 1 else ("\n\n",))
        return [request], info

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        queried = sample.data["cities"][: len(sample.target)]
        graded = grade(outputs[0], queried, sample.target, (*CITIES, *sample.data["cities"]))
        hits, substring = list(graded.hits), substring_hits(outputs[0], sample.target)
        return {"correct_all": all(hits), "correct_mean": sum(hits) / len(hits), "hits": hits,
                "ambiguous": any(graded.ambiguous), "offered": [list(o) for o in graded.offered],
                "correct_all_substring": all(substring), "correct_mean_substring": sum(substring) / len(substring)}
