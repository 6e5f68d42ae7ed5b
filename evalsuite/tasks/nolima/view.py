"""The nolima task's presentation: the kit's depth x length view (a heatmap per hop kind with n per
cell; the pair and difference heatmaps with significant cells marked; the grid of three or more
models), the report's control section (is the question read?) and the HTML report's worst samples
with their needle and bridge fact marked."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from evalsuite.tasks.kit import view as kit
from evalsuite.tasks.kit.marked import marked_prompt
from evalsuite.tasks.kit.view import DepthLengthView

if TYPE_CHECKING:
    import pandas as pd

METRIC = "correct"
HOPS_WORDS = {"onehop": "one hop", "twohop": "two hops (needle and bridge)"}
SCORES = ("correct", "contains", "mismatch_named", "mismatch_none")
BLIND = ("blind_fewest_mentions", "blind_beside_proper_noun", "blind_chance")
CONTROL_HEADER = ("hops", "n", "correct (strict)", "contains (NoLiMa's rule)", "other question: named the character",
                  "other question: \"none\"", "blind: fewest mentions", "blind: beside a proper noun",
                  "blind: any name (chance)", "names in the haystack")
CONTROL_NOTES = (
    "correct: the needle's character, and no other name, given as the answer to its own question (negated, "
    "hedged, retracted or listed names are not credited); contains: NoLiMa's own rule, the name anywhere in the "
    "output, case-sensitive. Other question: the same prompt asked another pair's question, whose right answer "
    "is \"none\": a model that reads the question names the needle's character far less often there than on its "
    "own question; one that does not, as often. These never enter `correct`, the effective length or the gate. "
    "Blind: what a reader who never reads the question scores on these prompts (a function of the prompt, no "
    "model): the name mentioned least, the name beside another proper noun, any name; a `correct` near them "
    "is no evidence of reading. Intervals: 95%, Wilson; the blind columns are exact means over the prompts."
)


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

    def report_section(self, run: Any) -> str:
        from evalsuite.analysis.frame import run_frame

        return control_section(run_frame(run))


def control_section(frame: pd.DataFrame) -> str:
    """Per hop kind: the strict and NoLiMa scores, the mismatched question's two scores and the
    question-blind rules' scores on the same prompts (absent on a user's haystack: '-')."""
    from evalsuite.analysis.frame import summarize
    from evalsuite.analysis.report import format_rate
    from evalsuite.analysis.tables import markdown

    present = [m for m in SCORES if m in frame.columns]
    body = []
    for row in summarize(frame, ["hops"], present):
        part = frame[frame["hops"] == row["hops"]]
        rates = [format_rate(row.get(m), row.get(f"{m}_low"), row.get(f"{m}_high")) for m in present]
        blind = [f"{part[c].mean():.3f}" if c in part and part[c].notna().any() else "-" for c in BLIND]
        names = f"{part['names_in_prompt'].mean():.1f}" if "names_in_prompt" in part else "-"
        body.append([HOPS_WORDS.get(str(row["hops"]), row["hops"]), row["n"], *rates, *blind, names])
    header = [*CONTROL_HEADER[:2], *(h for m, h in zip(SCORES, CONTROL_HEADER[2:6]) if m in present),
              *CONTROL_HEADER[6:]]
    return "### Does the model read the question?\n\n" + markdown(header, body) + "\n\n" + CONTROL_NOTES


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
                 "expected": ", ".join(record.target), "produced": _output(record, 0),
                 "mismatched question (right answer: none)": info.get("mismatch"),
                 "produced for it": _output(record, 1), "scores": json.dumps(dict(record.scores)),
                 "error": record.error or ""}
        parts.append(f"<h4>{esc(record.id)}</h4>" + key_values(facts))
        texts = record.prompt.get("text") if isinstance(record.prompt, Mapping) else None
        if texts:
            items = [t for t in (info.get("needle"), info.get("bridge")) if t]
            parts.append("<details><summary>prompt, needle and bridge marked</summary><pre>"
                         + marked_prompt(str(texts[0]), items) + "</pre></details>")
    return "\n".join(parts)


def _output(record: Any, index: int) -> str:
    outputs = list(record.outputs or ())
    return str(outputs[index]) if index < len(outputs) else ""
