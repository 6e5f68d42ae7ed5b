"""A reasoning model's thinking as a run's records and summary show it (engine/thinking.py strips it).

A run with thinking on records in each sample's `info` the characters of its thinking
(`thinking_chars`), how many of its outputs never ended their thinking (`thinking_unended`) and
its outputs as the model wrote them (`thinking_raw`); its `outputs` are the answers scored. A
sample with an output whose thinking never ended failed: its `error` is set, so it counts as a
fail on every metric (`frame.ERRORS_RULE`). The summary counts those outputs, and the end of the
run and `report` say so in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

CHARS = "thinking_chars"  # info: characters of the sample's thinking, all its outputs together
UNENDED = "thinking_unended"  # info: the sample's outputs whose thinking never ended
RAW = "thinking_raw"  # info: the sample's outputs as the model wrote them (None for other requests)


def thinking_summary(frame: pd.DataFrame, config: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json's `thinking` entry of a run with thinking on ({} for another run): the outputs
    and samples whose thinking never ended, and the thinking budget they had."""
    recorded = config.get("thinking")
    if not isinstance(recorded, Mapping):
        return {}
    counts = pd.to_numeric(frame[UNENDED], errors="coerce").fillna(0) if UNENDED in frame.columns else pd.Series([0])
    return {"thinking": {"unended_outputs": int(counts.sum()), "unended_samples": int((counts > 0).sum()),
                         "budget": recorded.get("budget"), "tags": [recorded.get("start"), recorded.get("end")]}}


def unended_line(summary: Mapping[str, Any]) -> str | None:
    """The line that says how many outputs never ended their thinking, or None when all did."""
    thinking = summary.get("thinking")
    if not isinstance(thinking, Mapping) or not thinking.get("unended_outputs"):
        return None
    outputs, samples = thinking["unended_outputs"], thinking["unended_samples"]
    return (f"{outputs} output{'s' if outputs != 1 else ''} never ended {'their' if outputs != 1 else 'its'} thinking "
            f"(budget {thinking['budget']} tokens beyond each answer's, -M thinking_budget): counted as fails "
            f"({samples} sample{'s' if samples != 1 else ''}, in the errors)")
