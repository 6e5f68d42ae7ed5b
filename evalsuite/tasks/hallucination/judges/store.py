"""Verdicts on disk: `judgements/<judge>.jsonl` in a run folder, and judging what has none yet."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.runs.safe_json import Line, holds, json_lines

from .verdicts import PROMPT_VERSION, Judge, JudgeItem, JudgeUnavailable, Verdict


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "judge"


class JudgementFile:
    """`judgements/<judge>.jsonl` in a run folder: one verdict per line, appended and flushed.

    A line that is not a verdict (not JSON, nested too deep, a field of the wrong type) is left
    out with one warning line, and moved to `judgements/rejected/<judge>.jsonl` when the judge
    runs again, so the verdicts after it are kept and only its sample is judged again."""

    def __init__(self, folder: Path, judge_name: str):
        self.judge_name = judge_name
        self.path = folder / f"{slug(judge_name)}.jsonl"
        self.rejected_path = folder / "rejected" / f"{slug(judge_name)}.jsonl"

    def read(self, repair: bool = False) -> dict[str, Verdict]:
        """The latest verdict per sample id, each stored response read by the current verdict
        rule. A torn last line (a killed run) is ignored, and cut off when `repair` is set, so
        that sample is judged again; so are damaged lines, moved aside when `repair` is set."""
        if not self.path.is_file():
            return {}
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        latest: dict[str, Verdict] = {}
        kept: list[bytes] = []
        damaged: list[Line] = []
        torn = False
        for line in json_lines(raw):
            if line.torn:
                torn = True
                continue
            try:
                verdict = verdict_of(line)
            except ValueError as exc:
                damaged.append(Line(line.raw, damage=str(exc)))
                continue
            if verdict.judge != self.judge_name:
                raise UserError(f"{self.path} holds verdicts of judge {verdict.judge!r}, not {self.judge_name!r}")
            latest[verdict.id] = verdict
            kept.append(line.raw)
        if repair and (damaged or torn):
            self._set_aside(kept, damaged)
        elif damaged:
            _warn_once(f"warning: {self.path}: left out {len(damaged)} damaged line(s) (the first: "
                       f"{damaged[0].damage}); judging again moves them to {self.rejected_path}", self.path)
        return latest

    def _set_aside(self, kept: list[bytes], damaged: list[Line]) -> None:
        """The file holding only its verdicts; damaged lines appended to the rejected file, never deleted."""
        if damaged:
            self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
            with self.rejected_path.open("ab") as fh:
                fh.writelines(line.text for line in damaged)
            print(f"warning: {self.path}: moved {len(damaged)} damaged line(s) to {self.rejected_path} "
                  f"(the first: {damaged[0].damage}); their samples are judged again", file=sys.stderr)
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("wb") as fh:
            fh.writelines(kept)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def append(self, verdicts: Iterable[Verdict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            for verdict in verdicts:
                fh.write(verdict.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())


# The type each field of a verdict line must hold (a bool is not an attempt count).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "judge": (str,), "status": (str,), "verdict": (bool, type(None)), "response": (str,),
    "error": (str, type(None)), "attempts": (int,), "cached": (bool,), "request_sha256": (str, type(None))}
_STATUSES = ("judged", "unparseable", "error")


def verdict_of(line: Line) -> Verdict:
    """The verdict a parsed line holds, read by the current rule; ValueError saying why it holds none."""
    if line.damage is not None:
        raise ValueError(line.damage)
    value = line.value
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    for key, kinds in _FIELD_TYPES.items():
        held = value.get(key, kinds[0]())  # a field left out takes its default
        if not holds(held, kinds):
            raise ValueError(f"{key!r} is a {type(held).__name__}")
    unknown_keys = sorted(set(value) - set(_FIELD_TYPES))
    if unknown_keys:
        raise ValueError(f"{unknown_keys[0]!r} is not a field of a verdict")
    if not value.get("id") or value.get("status") not in _STATUSES or not {"judge", "verdict"} <= set(value):
        raise ValueError("a verdict needs an id, a judge, a status (judged, unparseable or error) and a verdict")
    return Verdict(**value).reread()


_WARNED: set[tuple[str, int, int]] = set()  # the files this process warned about, as they were


def _warn_once(message: str, path: Path) -> None:
    """`message` on stderr once per state of `path`: a command reads a verdict file several times."""
    try:
        stat = path.stat()
    except OSError:
        return
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _WARNED:
        _WARNED.add(key)
        print(message, file=sys.stderr)


def judgement_files(folder: Path) -> list[str]:
    """Names of the judges that have verdicts in a run's `judgements/` folder: each file's first
    verdict names its judge (a file with none is left out)."""
    names = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        try:
            raw = path.read_bytes()
        except OSError:
            continue  # unreadable: reading its verdicts would fail the same way
        for line in json_lines(raw):
            try:
                names.append(verdict_of(line).judge)
                break
            except ValueError:
                continue
    return names


@dataclass(frozen=True)
class JudgeOutcome:
    judge: str
    label: str
    new: int  # verdicts written by this call
    verdicts: Mapping[str, Verdict]  # the latest verdict per sample, old and new


def judge_missing(folder: Path, items: Sequence[JudgeItem], judge: Judge, progress: bool = True) -> JudgeOutcome:
    """Judge the items that have no verdict from this judge yet, appending each verdict as it
    comes. When the judge gives up, what was judged stays on disk and the error says so."""
    from tqdm.auto import tqdm

    store = JudgementFile(folder, judge.name)
    latest = store.read(repair=True)
    todo = [item for item in items if not (item.id in latest and latest[item.id].answered)]
    new = 0
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=f"judge {judge.name}", unit="sample",
               disable=None if progress else True, dynamic_ncols=True)

    def keep(verdict: Verdict) -> None:
        nonlocal new
        store.append([verdict])
        latest[verdict.id] = verdict
        new += 1
        bar.update(1)

    with bar:
        try:
            judge.judge(todo, keep)
        except JudgeUnavailable as exc:
            done = sum(1 for item in items if item.id in latest and latest[item.id].answered)
            raise JudgeUnavailable(f"{exc}; {done} of {len(items)} samples have verdicts, kept in {store.path}; "
                                   "run the same command again to judge the rest") from None
    write_meta(folder, judge)
    return JudgeOutcome(judge=judge.name, label=judge.label, new=new, verdicts=latest)


def write_meta(folder: Path, judge: Judge) -> None:
    """What a judge file was made with (no secrets): for reading verdicts back later."""
    meta = {"judge": judge.name, "label": judge.label, "heuristic": judge.heuristic,
            "prompt_version": PROMPT_VERSION, "settings": getattr(judge, "public_settings", {})}
    path = folder / f"{slug(judge.name)}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
