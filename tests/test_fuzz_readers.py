"""Every reader of the files evalsuite leaves on disk, fed lines no writer makes, through the
command line: nesting 100,000 deep, a number of 100,000 digits, a 3 MB line, bytes that are
not UTF-8, JSON of the wrong shape or type, a last line cut short.

samples.jsonl (report, report --html, compare, check, trend, view, log, export, the paper report
and the resume of `run`), a judge's verdicts (report, score), the watcher's ledger (watch): a
damaged line is left out with one warning, the good lines around it kept. config.json,
summary.json and a suite result file are refused with one `error:` line and exit 2. Never a
traceback, never exit 1 (damage is not a regression). Run folders are built once per module
with the `fake` backend.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.runs import records as record_module
from evalsuite.runs.safe_json import MAX_DEPTH, DamagedJSON, loads
from evalsuite.tasks.hallucination.judges import store as judge_store

NEEDLE = ("--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "--no-progress")
DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"0" + b"}" * 100_000
# Lines that are damage whatever file holds them: not JSON a reader can take, or JSON of no file's shape.
DAMAGE: dict[str, bytes] = {
    "nested 100,000 deep (arrays)": DEEP_ARRAY,
    "nested 100,000 deep (objects)": DEEP_OBJECT,
    "nested past the cap, in an object": b'{"id": "x", "info": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}",
    "a number of 100,000 digits": b"9" * 100_000,
    "a 3 MB line": b'{"id": "' + b"x" * 3_000_000 + b'"}',
    "binary": bytes(b for b in range(256) if b not in b"\r\n"),
    "a list": b"[1, 2]",
    "null": b"null",
    "text": b'"text"',
    "NaN": b"NaN",
    "an object of no known shape": b'{"step": "abc", "id": [1], "judge": 5}',
}


def damaged_lines() -> bytes:
    return b"".join(line + b"\n" for line in DAMAGE.values())


@dataclass(frozen=True)
class Built:
    step1: Path
    step2: Path
    judged: Path
    judged_command: tuple[str, ...]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """Two finished needle runs of one model at steps 1 and 2, and a hallucination run judged lexically."""
    root = tmp_path_factory.mktemp("fuzz")
    capsys = _Capture()
    folders = {}
    for step in (1, 2):
        code, _, err = capsys.invoke("run", "--model", "fake:oracle", *NEEDLE, "--step", str(step),
                                     "--out", str(root / f"step{step}"))
        assert code == 0, err
        (folders[step],) = (p for p in (root / f"step{step}").iterdir() if p.is_dir())
    data = root / "xsum.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "summary": f"{i} volunteers cleaned a beach.",
                                        "document": f"Officials said {i} volunteers cleaned the beach."}) + "\n"
                            for i in range(6)), encoding="utf-8")
    judged_command = ("run", "--model", "fake:echo", "--task", "hallucination", "-T", "dataset=xsum", "-T",
                      f"data={data}", "-T", "samples=4", "--judge", "lexical", "--no-progress")
    code, _, err = capsys.invoke(*judged_command, "--out", str(root / "judged"))
    assert code == 0, err
    (judged,) = (p for p in (root / "judged").iterdir() if p.is_dir())
    return Built(folders[1], folders[2], judged, judged_command)


class _Capture:
    """`invoke` for a module fixture, where pytest's capsys (a per-test fixture) is not at hand."""

    def invoke(self, *args: str) -> tuple[int, str, str]:
        from evalsuite.cli import main

        out, err = io.StringIO(), io.StringIO()
        argv, sys.argv = sys.argv, ["evalsuite", *args]
        code = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main()
        except SystemExit as exc:
            code = 0 if exc.code is None else int(exc.code)
        finally:
            sys.argv = argv
        return code, out.getvalue(), err.getvalue()


def _layout(built: Built, work: Path) -> tuple[Path, Path]:
    """Fresh copies of the two needle runs under work/runs, beside a suite result listing the first."""
    runs = work / "runs"
    runs.mkdir()
    bad = shutil.copytree(built.step1, runs / built.step1.name)
    good = shutil.copytree(built.step2, runs / built.step2.name)
    (runs / "suite-smoke-fake-oracle.json").write_text(json.dumps({
        "format": "evalsuite-suite-result", "suite": "smoke", "model": "fake-oracle",
        "runs": [{"name": "needle", "run": bad.name}], "skipped": []}), encoding="utf-8")
    return bad, good


def _readers(bad: Path, good: Path, work: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(bad), "--no-plots"],
        "report --html": ["report", str(bad), "--no-plots", "--html", str(work / "report.html")],
        "report of a suite result": ["report", str(bad.parent / "suite-smoke-fake-oracle.json"), "--no-plots"],
        "compare": ["compare", str(bad), str(good), "--out", str(work / "cmp")],
        "check": ["check", str(bad), "--baseline", str(good)],
        "check reversed": ["check", str(good), "--baseline", str(bad)],
        "trend": ["trend", str(bad), str(good), "--out", str(work / "trend"), "--gate"],
        "view": ["view", str(bad.parent), "--write", str(work / "page.html")],
        "log": ["log", str(bad), "--to", "tensorboard", "--tensorboard-dir", str(work / "tb")],
        "export": ["export", str(bad), "--out", str(work / "export")],
        "paper report": ["report", "--paper", str(bad.parent), "--out", str(work / "paper.html")],
        "resume": ["run", "--model", "fake:oracle", *NEEDLE, "--step", "1", "--out", str(bad.parent)],
    }


READERS = list(_readers(Path("a"), Path("b"), Path("w")))


def said_in_one_line(reader: str, code: int, out: str, err: str) -> None:
    """The rule every reader keeps: exit 0 or 2 (never a regression's 1), no traceback, and an
    exit 2 says why in exactly one `error:` line."""
    assert "Traceback" not in out + err, (reader, err[-2000:])
    assert code in (0, 2), (reader, code, err[-2000:])
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == (code == 2), (reader, code, err[-2000:])


def _fresh_process() -> None:
    """Each command is a process of its own, which warns afresh."""
    record_module._WARNED.clear()
    judge_store._WARNED.clear()


# ---- the one parser -----------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["nested 100,000 deep (arrays)", "nested 100,000 deep (objects)",
                                    "nested past the cap, in an object", "a number of 100,000 digits", "binary"])
def test_the_parser_says_why_in_a_valueerror(damage):
    with pytest.raises(DamagedJSON) as caught:
        loads(DAMAGE[damage])
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_nesting_up_to_the_cap_is_read():
    assert loads(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert loads('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')  # text, not nesting


# ---- samples.jsonl: quarantined -----------------------------------------------------------------

@pytest.mark.parametrize("reader", READERS)
def test_damaged_record_lines_are_left_out_by_every_reader(built, tmp_path, capsys, reader):
    bad, good = _layout(built, tmp_path)
    with (bad / "samples.jsonl").open("ab") as fh:
        fh.write(damaged_lines())
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)[reader])
    said_in_one_line(reader, code, out, err)
    if code == 0:
        told = "moved" if reader == "resume" else "left out"
        assert f"{told} {len(DAMAGE)} damaged line(s)" in err, (reader, err[-2000:])
    if reader == "resume":
        rejected = (bad / "samples.rejected.jsonl").read_bytes()
        assert code == 0 and rejected == damaged_lines()
        assert (bad / "samples.jsonl").read_bytes() == (built.step1 / "samples.jsonl").read_bytes()


@pytest.mark.parametrize("reader", ["report", "view", "resume"])
def test_a_finished_runs_last_line_cut_short_is_said(built, tmp_path, capsys, reader):
    bad, good = _layout(built, tmp_path)
    with (bad / "samples.jsonl").open("ab") as fh:
        fh.write(b'{"id": "needle-')
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)[reader])
    said_in_one_line(reader, code, out, err)
    assert code == 0 and "1 damaged line(s)" in err and "cut short" in err, (reader, err)


def test_an_unfinished_runs_torn_line_is_redone_without_a_word(built, tmp_path, capsys):
    bad, good = _layout(built, tmp_path)
    (bad / "summary.json").unlink()
    lines = (bad / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (bad / "samples.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:20])  # a killed process's last write
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)["resume"])
    assert code == 0 and "damaged" not in err, err
    assert (bad / "samples.jsonl").read_bytes() == (built.step1 / "samples.jsonl").read_bytes()


# ---- config.json, summary.json, a suite result: refused in one line ----------------------------

WHOLE_FILE_DAMAGE = [name for name in DAMAGE if name != "an object of no known shape"]


@pytest.mark.parametrize("damage", WHOLE_FILE_DAMAGE)
@pytest.mark.parametrize("reader", READERS)
def test_a_damaged_config_is_one_line(built, tmp_path, capsys, damage, reader):
    bad, good = _layout(built, tmp_path)
    (bad / "config.json").write_bytes(DAMAGE[damage])
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)[reader])
    said_in_one_line(reader, code, out, err)
    if reader == "view":  # the viewer leaves a run it cannot read out, with a warning
        assert code == 0 and "config.json" in err and "left out" in err, err
    elif reader != "paper report":  # which says first that one model's results are no comparison
        assert code == 2 and "config.json" in err, (reader, err)


@pytest.mark.parametrize("damage", ["nested 100,000 deep (arrays)", "nested 100,000 deep (objects)",
                                    "a number of 100,000 digits", "binary", "a list"])
@pytest.mark.parametrize("reader", ["log", "export", "view", "paper report", "report of a suite result"])
def test_a_damaged_summary_is_one_line(built, tmp_path, capsys, damage, reader):
    bad, good = _layout(built, tmp_path)
    (bad / "summary.json").write_bytes(DAMAGE[damage])
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)[reader])
    said_in_one_line(reader, code, out, err)


SUITE_RESULT = b'{"format": "evalsuite-suite-result", "suite": "smoke", "model": "fake-oracle", '
SUITE_DAMAGE = {  # what a suite result file holds -> whether `report` of it must refuse it (it reads no skipped list)
    "nested 100,000 deep": (DEEP_ARRAY, True),
    "binary": (DAMAGE["binary"], True),
    "a list": (b"[1]", True),
    "a run up two folders": (SUITE_RESULT + b'"runs": [{"name": "x", "run": "../../etc"}]}', True),
    "a run at an absolute path": (SUITE_RESULT + b'"runs": [{"name": "x", "run": "/etc"}]}', True),
    "a run without its folder": (SUITE_RESULT + b'"runs": [{"name": "x"}]}', True),
    "runs as text": (SUITE_RESULT + b'"runs": "abc"}', True),
    "a skipped entry that is a number": (SUITE_RESULT + b'"runs": [], "skipped": [5]}', False),
    "no model": (b'{"format": "evalsuite-suite-result", "suite": "smoke", "runs": []}', False),
}


@pytest.mark.parametrize("damage", list(SUITE_DAMAGE))
@pytest.mark.parametrize("reader", ["report of a suite result", "paper report"])
def test_a_damaged_suite_result_is_one_line(built, tmp_path, capsys, damage, reader):
    bad, good = _layout(built, tmp_path)
    content, refused_by_report = SUITE_DAMAGE[damage]
    (bad.parent / "suite-smoke-fake-oracle.json").write_bytes(content)
    _fresh_process()
    code, out, err = invoke(capsys, *_readers(bad, good, tmp_path)[reader])
    said_in_one_line(reader, code, out, err)
    if reader == "paper report" or refused_by_report:
        assert code == 2, err


# ---- a judge's verdicts --------------------------------------------------------------------------

VERDICT_DAMAGE = [b'{"id": 5, "judge": "lexical", "status": "judged", "verdict": true}',
                  b'{"id": "x", "judge": "lexical", "status": "judged", "verdict": "yes"}',
                  b'{"id": "x", "judge": "lexical", "status": "maybe", "verdict": true}',
                  b'{"id": "x", "judge": "lexical", "status": "judged", "verdict": true, "attempts": true}',
                  b'{"id": "x", "judge": "lexical", "status": "judged", "verdict": true, "extra": 1}']


def _damage_verdicts(run: Path) -> tuple[bytes, int]:
    """Every damaged line inserted after the first verdict; the file as it was, and how many lines went in."""
    path = run / "judgements" / "lexical.jsonl"
    before = path.read_bytes()
    first, rest = before.split(b"\n", 1)
    inserted = [*DAMAGE.values(), *VERDICT_DAMAGE]
    path.write_bytes(first + b"\n" + b"".join(line + b"\n" for line in inserted) + rest)
    return before, len(inserted)


@pytest.mark.parametrize("reader", ["report", "view", "score"])
def test_damaged_verdicts_are_left_out_and_moved_aside_when_judged_again(built, tmp_path, capsys, reader):
    run = shutil.copytree(built.judged, tmp_path / "runs" / built.judged.name)
    before, count = _damage_verdicts(run)
    args = {"report": ["report", str(run), "--no-plots"],
            "view": ["view", str(run.parent), "--write", str(tmp_path / "page.html")],
            "score": ["score", str(run), "--judge", "lexical", "--no-progress"]}[reader]
    _fresh_process()
    code, out, err = invoke(capsys, *args)
    said_in_one_line(reader, code, out, err)
    assert code == 0, err
    if reader == "score":
        assert f"moved {count} damaged line(s)" in err, err
        assert (run / "judgements" / "lexical.jsonl").read_bytes() == before  # every verdict kept, none judged twice
        assert (run / "judgements" / "rejected" / "lexical.jsonl").read_bytes().count(b"\n") == count
    elif reader == "report":
        assert f"left out {count} damaged line(s)" in err and "lexical" in out, err


def test_a_binary_first_verdict_line_still_names_the_judge(built, tmp_path, capsys):
    run = shutil.copytree(built.judged, tmp_path / built.judged.name)
    path = run / "judgements" / "lexical.jsonl"
    path.write_bytes(DAMAGE["binary"] + b"\n" + path.read_bytes())
    _fresh_process()
    code, out, err = invoke(capsys, "report", str(run), "--no-plots")
    said_in_one_line("report", code, out, err)
    assert code == 0 and "lexical (heuristic)" in out and "left out 1 damaged line(s)" in err, err


# ---- the watcher's ledger ------------------------------------------------------------------------

LEDGER_DAMAGE = [b'{"checkpoint": "c", "path": "/c", "step": "abc", "status": "ok"}',
                 b'{"checkpoint": "c", "path": "/c", "step": null, "status": "ok"}',
                 b'{"checkpoint": "c", "path": "/c", "step": true, "status": "ok"}',
                 b'{"checkpoint": "c", "path": "/c", "step": -1, "status": "ok"}',
                 b'{"checkpoint": "c", "path": "/c", "step": 1, "status": "ok", "runs": "abc"}',
                 b'{"checkpoint": "c", "path": "/c", "step": 1, "status": "ok", "runs": [1]}',
                 b'{"checkpoint": "c", "path": "/c", "step": 1}']


def test_damaged_ledger_lines_are_left_out_with_one_warning(tmp_path, capsys):
    train, out = tmp_path / "train", tmp_path / "evals"
    train.mkdir()
    (out / "watch").mkdir(parents=True)
    lines = [*DAMAGE.values(), *LEDGER_DAMAGE]
    (out / "watch" / "ledger.jsonl").write_bytes(b"".join(line + b"\n" for line in lines) + b'{"checkpoint"')
    code, said, err = invoke(capsys, "watch", str(train), *NEEDLE, "--out", str(out), "--once", "--settle", "0")
    said_in_one_line("watch", code, said, err)
    warnings = [line for line in err.splitlines() if "ledger.jsonl" in line]
    assert code == 0 and len(warnings) == 1 and f"left out {len(lines)} damaged line(s)" in warnings[0], err
