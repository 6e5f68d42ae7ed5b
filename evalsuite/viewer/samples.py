"""A run's samples as the viewer shows them: one JSON-ready dict per record, with its outcome.

A sample's outcome is read from the metrics `check` gates for its task: the
task's primary metric (from the registry) and the side scores the run keeps
beside its records (judged accuracy). A pass/fail metric says "right" or
"wrong" (a metric the task marks lower-is-better is right at 0); a sample that
failed with an error is wrong, as `compare` counts it. A run whose gated
metrics are all continuous (a mean NLL, an attention share) has no outcomes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evalsuite.runs.records import Record
from evalsuite.runs.safe_json import json_lines

TEXT_LIMIT = 20_000  # characters kept of one prompt text or output: a 64K-token prompt would swamp the page
RIGHT, WRONG, UNSCORED = "right", "wrong", ""


def clipped(text: str) -> str:
    """`text`, cut to TEXT_LIMIT characters with a note saying how much was left out."""
    if len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n… ({len(text) - TEXT_LIMIT:,} more characters not shown)"


def as_text(value: Any) -> str:
    """An output or target as text: typed outputs (choices, log-likelihoods) as compact JSON."""
    return clipped(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))


def plain(value: Any) -> Any:
    """A JSON-safe value: non-finite floats become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) or value is None


def pass_fail_metrics(records: Sequence[Record], metrics: Iterable[str]) -> list[str]:
    """The metrics among `metrics` whose values in this run are all 0/1 (and at least one is)."""
    found = []
    for metric in metrics:
        values = [r.scores.get(metric) for r in records]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, (bool, int, float)) and v in (0, 1) for v in present):
            found.append(metric)
    return found


def outcome(record: Record, pass_fail: Sequence[str], lower_is_better: Sequence[str]) -> str:
    """RIGHT, WRONG or UNSCORED (no pass/fail value, or no pass/fail metric at all)."""
    if not pass_fail:
        return UNSCORED
    if record.error:
        return WRONG
    values = [(m, record.scores.get(m)) for m in pass_fail]
    scored = [(m, v) for m, v in values if v is not None]
    if not scored:
        return UNSCORED
    good = [(v == 0) if m in lower_is_better else (v == 1) for m, v in scored]
    return RIGHT if all(good) else WRONG


def side_records(run_path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Sample id -> {"<folder>/<file>": its latest line} for JSON-lines files a task keeps in
    subfolders of the run (judge verdicts, one file per judge): read generically, each line an
    object with an "id". Lines that are not such objects are skipped."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(run_path.glob("*/*.jsonl")):
        label = f"{path.parent.name}/{path.stem}"
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        for line in json_lines(raw):
            entry = line.value
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                found.setdefault(entry["id"], {})[label] = {k: plain(v) for k, v in entry.items() if k != "id"}
    return found


def prompt_entry(prompt: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt's hash, and its text only when the run logged it (--log-prompts)."""
    entry: dict[str, Any] = {"sha256": prompt.get("sha256")}
    text = prompt.get("text")
    if isinstance(text, list):
        entry["text"] = [as_text(t) for t in text]
    elif isinstance(text, str):
        entry["text"] = [clipped(text)]
    return entry


def sample_entry(record: Record, result: str, side: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "id": record.id,
        "axes": plain(dict(record.axes)),
        "prompt": prompt_entry(record.prompt),
        "outputs": [as_text(o) for o in record.outputs],
        "target": [as_text(t) for t in record.target],
        "scores": plain(dict(record.scores)),
        "info": plain(dict(record.info)),
        "error": record.error,
        "outcome": result,
        "side": dict(side),
    }


def sample_entries(records: Sequence[Record], run_path: Path, gated: Sequence[str],
                   lower_is_better: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(one entry per record, the gated metrics that are pass/fail in this run)."""
    pass_fail = pass_fail_metrics(records, gated)
    side = side_records(run_path)
    entries = [sample_entry(r, outcome(r, pass_fail, lower_is_better), side.get(r.id, {})) for r in records]
    return entries, pass_fail


def column_order(records: Sequence[Record], first: Sequence[str], field: str) -> list[str]:
    """The keys of `field` ("axes" or "scores", scalar values only) over all records, `first` first."""
    keys: dict[str, None] = {}
    for record in records:
        for key, value in getattr(record, field).items():
            if is_scalar(value):
                keys.setdefault(key, None)
    ordered = [k for k in first if k in keys]
    return ordered + sorted(k for k in keys if k not in ordered)
