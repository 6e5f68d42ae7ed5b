"""Activation outliers (Differential Transformer paper §3.7, the outlier table).

What it measures: magnitudes |x| of
- attention logits: the pre-softmax q·k · scaling of every head, over the
  causal (unmasked) entries only; for DIFF models both maps (DiffLlama's
  component heads i and i + H/2 come out of one attention call);
- hidden states: every element of each decoder layer's output,
over `tokens` tokens of text, reported as the paper does: the 1st, 2nd, 3rd,
10th and 100th largest value and the median, over all layers and per layer.

Nothing is stored whole: each kind and layer keeps a streaming sketch of exact top values
and a log histogram (`sketch.py`, which states the median's error bound).

Choices the paper leaves open, made here and exposed as parameters:
- the text: the built-in generated filler by default (works offline), or a
  text file, or `dataset:NAME[:SPLIT]` (column `field`);
- windows of `window` tokens (BOS first when the tokenizer has one), each one
  forward pass, scored independently; windows of a shard continue one text.
Each sample is a shard of `shard_tokens` tokens with its own seeded text, so a
killed run resumes shard by shard; its record holds the shard's sketches.
Needs a transformers model whose attention uses transformers' attention
interface (Llama, DiffLlama, ...): the logits are read by evalsuite's attention
function (`evalsuite.backends.hf.quant`), which then attends exactly as the model would.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from evalsuite.contracts import ACTIVATION_PROBE, ModelAdapter, TaskBase
from evalsuite.errors import UserError
from evalsuite.registry import register_task
from evalsuite.runs.view import RunView
from evalsuite.tasks.kit.filler import TextHaystack, builtin_sentences, load_haystack
from evalsuite.types import Sample

from .sketch import KINDS, MEDIAN_RELATIVE_ERROR, Sketch, median, merge, series_order
from .view import OutliersView, markdown_table, outlier_table

# ---- reading the model ------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivationScan:
    """A probe request: run `windows` (token ids) through the model, return the sketches."""

    capability: ClassVar[str] = ACTIVATION_PROBE
    windows: tuple[tuple[int, ...], ...]

    def measure(self, model: Any) -> dict[str, Any]:
        sketches: dict[str, Sketch] = {}

        def observe(kind: str, layer: int, values: Any, valid: Any) -> None:
            name = f"{'attn' if kind == 'attention_logits' else 'hidden'}/{layer}"
            magnitudes = values.abs() if valid is None else values.abs()[valid.expand_as(values)]
            sketches.setdefault(name, Sketch()).add(magnitudes)

        model.probe_activations(self.windows, observe)
        return {"series": {name: sketches[name].to_json() for name in sorted(sketches, key=series_order)}}


# ---- the task ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutliersState:
    """What a run reads: the loaded text (None: the built-in filler)."""

    text: TextHaystack | None


@register_task
@dataclass(frozen=True)
class Outliers(TaskBase, name="outliers", view=OutliersView, group_by=(),
               metrics=("attn_top1", "attn_median", "hidden_top1", "hidden_median"), primary_metric="attn_top1",
               smoke_plan={"tokens": "512", "window": "128", "shard_tokens": "256"}):
    """Activation outliers: top-k and median |x| of attention logits and hidden states (paper §3.7)."""

    tokens: int = 400_000
    window: int = 2048  # tokens per sequence (one forward pass each)
    shard_tokens: int = 50_000  # tokens per sample (one record)
    source: str = "builtin"  # builtin | a text file | dataset:NAME[:SPLIT]
    field: str = "text"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.shard_tokens < 1:
            raise ValueError("-T tokens and -T shard_tokens must be at least 1")
        if self.window < 2:
            raise ValueError("-T window must be at least 2 tokens")

    def required_capabilities(self) -> tuple[str, ...]:
        return (ACTIVATION_PROBE,)

    def prepare(self, model: ModelAdapter | None) -> OutliersState:
        """The text, read once per run; with a model, refused when a window exceeds its context."""
        if model is not None and self.window > model.max_context:
            raise UserError(f"-T window={self.window} exceeds {model.name}'s maximum context of {model.max_context}")
        return OutliersState(load_haystack(self.source, self.field))

    def plan(self, state: OutliersState) -> list[Sample]:
        shards = math.ceil(self.tokens / self.shard_tokens)
        out = []
        for index in range(shards):
            count = min(self.shard_tokens, self.tokens - index * self.shard_tokens)
            out.append(Sample(id=f"outliers-s{self.seed}-w{self.window}-{index:05d}", task=self.name,
                              axes={"shard": index}, data={"tokens": count}))
        return out

    def windows(self, sample: Sample, model: Any, state: OutliersState) -> list[tuple[int, ...]]:
        """The shard's token windows: BOS (when the tokenizer has one) + text tokens, exactly
        `tokens` tokens in all (a last window may be shorter), one seeded text read on."""
        head = model.encode("")  # the special tokens a prompt starts with (BOS), if any
        text = self._text_tokens(sample, model, state.text)
        windows, left = [], sample.data["tokens"]
        try:
            while left > 0:
                body = max(1, min(self.window, left) - len(head))
                windows.append(tuple(head + [next(text) for _ in range(body)]))
                left -= len(windows[-1])
        except StopIteration:
            raise UserError(f"{self.source} holds fewer than the {sample.data['tokens']} tokens a shard needs; "
                            "use a longer text or a smaller -T shard_tokens") from None
        return windows

    def _text_tokens(self, sample: Sample, model: Any, text: TextHaystack | None) -> Iterator[int]:
        rng = random.Random(f"{self.seed}-{sample.axes['shard']}")
        for i, sentence in enumerate(text.stream(rng) if text else builtin_sentences(rng)):
            yield from model.encode(sentence if i == 0 else " " + sentence, first=False)

    def requests(self, sample: Sample, model: ModelAdapter, state: OutliersState
                 ) -> tuple[list[ActivationScan], dict[str, Any]]:
        windows = self.windows(sample, model, state)
        digest = hashlib.sha256(repr(windows).encode()).hexdigest()
        info = {"tokens": sum(map(len, windows)), "windows": len(windows), "tokens_sha256": digest}
        return [ActivationScan(tuple(windows))], info

    def score(self, sample: Sample, outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """This shard's overall top-1 and median per kind (the run's table merges all shards)."""
        series = outputs[0]["series"]
        scores: dict[str, Any] = {}
        for kind in KINDS:
            merged = merge([s for name, s in series.items() if name.startswith(kind + "/")])
            scores[f"{kind}_top1"] = merged["top"][0] if merged["top"] else None
            scores[f"{kind}_median"] = median(merged) if merged["count"] else None
        return scores

    def summary(self, frame: Any, run: RunView) -> dict[str, Any]:
        table = outlier_table(run)
        return {"outliers": table, "median_relative_error_bound": MEDIAN_RELATIVE_ERROR,
                "table": markdown_table(table, str(frame["model"].iloc[0]))}
