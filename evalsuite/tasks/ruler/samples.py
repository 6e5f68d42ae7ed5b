"""lm-eval's RULER documents as evalsuite samples: ids, axes (sub-task, length, depth) and targets.

A needle sub-task's depth is where its first answer sits in the haystack, which lies between the
input's first and last line breaks in lm-eval's needle template, as a share of the haystack's
characters; it is put in equal bins named by their middles (the share itself is kept as
`measured_depth`). The other sub-tasks have no depth.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from evalsuite.errors import UserError
from evalsuite.types import Sample


def samples_of(docs: Sequence[Mapping[str, Any]], subtask: str, lengths: Sequence[int], per_length: int,
               seed: int, depth_bins: int, part: bool) -> Iterator[Sample]:
    """The first `per_length` documents of each length, in lm-eval's order; `part`: lm-eval scores
    the sub-task with its string_match_part."""
    for length in lengths:
        kept = [d for d in docs if d["max_length"] == length][:per_length]
        if any(not d["outputs"] for d in kept):  # cwe at a length too short for its word list
            raise UserError(f"lm-eval's RULER {subtask} made samples without an answer at length {length} with "
                            "this tokenizer (the length holds none of its items): give longer lengths")
        yield from (_sample(doc, subtask, length, seed, depth_bins, part) for doc in kept)


def _sample(doc: Mapping[str, Any], subtask: str, length: int, seed: int, depth_bins: int, part: bool) -> Sample:
    axes: dict[str, Any] = {"subtask": subtask, "context_length": length, "seed": seed}
    share = needle_depth(doc["input"], doc["outputs"][0]) if subtask.startswith("niah") else None
    if share is not None:
        axes["depth"] = depth_bin(share, depth_bins)
    data = {"input": doc["input"], "gen_prefix": doc["gen_prefix"], "lmeval_length": doc["length"],
            "measured_depth": share, "part": part}
    return Sample(id=f"ruler-{subtask}-L{length}-s{seed}-{doc['index']:03d}", task="ruler", axes=axes,
                  target=tuple(doc["outputs"]), data=data)


def needle_depth(text: str, answer: str) -> float | None:
    """Where `answer` sits between the first and the last line break of `text`, as a share of the
    characters between them (None: not there)."""
    start, end = text.find("\n") + 1, text.rfind("\n")
    at = text.find(answer, start)
    return (at - start) / (end - start) if 0 < start <= at < end else None


def depth_bin(share: float, bins: int) -> float:
    """The middle of the equal bin of [0, 1] that holds `share`."""
    index = min(int(share * bins), bins - 1)
    return round((index + 0.5) / bins, 4)
