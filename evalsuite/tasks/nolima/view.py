"""The nolima task's presentation: the kit's depth x length view (a heatmap per hop kind with n per
cell; the pair and difference heatmaps with significant cells marked; the grid of three or more
models) and the HTML report's worst samples with their needle and bridge fact marked."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from evalsuite.tasks.kit import view as kit
from evalsuite.tasks.kit.marked import marked_prompt
from evalsuite.tasks.kit.view import DepthLengthView

METRIC = "correct"
HOPS_WORDS = {"onehop": "one hop", "twohop": "two hops (needle and bridge)"}


class NolimaView(DepthLengthView):
    """Heatmaps per hop kind of one run, of a pair of runs and of several models beside one baseline."""

    axis_labels = {**kit.AXIS_LABELS, "hops": "hops"}
    metric: ClassVar[str | None] = METRIC
    metric_words: ClassVar[str] = "the needle's character named"
    item_words: ClassVar[str] = "needle"
    facets: ClassVar[tuple[str, ...] | None] = ("hops",)

    def facet_label(self, facet: kit.Facet, short: bool = False) -> str:
        return HOPS_WORDS.get(str(facet[0]), str(facet[0]))

    def facet_suffix(self, facet: kit.Facet) -> str:
        return f"_{facet[0]}"

    def html_samples(self, records: Sequence[Any]) -> str:
        return html_samples(records)


def html_samples(records: Sequence[Any]) -> str:
    """The samples that did not name the needle's character, with the needle and bridge marked (both
    are in the record's facts: no plan or needle set is read to show them)."""
    from evalsuite.analysis.html import esc, key_values, lowest

    worst = lowest([r for r in records if r.error or not r.scores.get(METRIC)], (METRIC,))
    if not worst:
        return "<h3>Worst samples</h3><p class='ok'>Every sample named the needle's character.</p>"
    parts = [f"<h3>Worst samples</h3><p>{len(worst)} samples that did not name the needle's character; "
             "the needle and the bridge fact are marked in the prompt.</p>"]
    for record in worst:
        info, axes = record.info, record.axes
        facts = {"hops": axes.get("hops"), "context length (requested)": axes.get("context_length"),
                 "prompt tokens": info.get("prompt_tokens"), "depth (requested)": axes.get("depth"),
                 "depth (measured)": info.get("measured_depth"), "question": info.get("question"),
                 "needle": info.get("needle"), "bridge": info.get("bridge") or "none (one hop)",
                 "expected": ", ".join(record.target), "produced": " | ".join(map(str, record.outputs)),
                 "scores": json.dumps(dict(record.scores)), "error": record.error or ""}
        parts.append(f"<h4>{esc(record.id)}</h4>" + key_values(facts))
        texts = record.prompt.get("text") if isinstance(record.prompt, Mapping) else None
        if texts:
            items = [t for t in (info.get("needle"), info.get("bridge")) if t]
            parts.append("<details><summary>prompt, needle and bridge marked</summary><pre>"
                         + marked_prompt(str(texts[0]), items) + "</pre></details>")
    return "\n".join(parts)
