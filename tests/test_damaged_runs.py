"""Every reader of a finished run on a run with one damaged field: one line, never a traceback.

A damaged record is left out with one warning line (the rule resume uses, so a damaged
line is never turned into numbers); a damaged config.json or summary.json is one error
line (exit 2), and the viewer leaves that run out with a warning. Each damage is tried on
one record of a run (the others hold the field well) and on every record (nothing to
measure it against), through compare, check both ways, report, view, trend, log, export
and the paper report.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import invoke

from evalsuite.backends import load_model
from evalsuite.engine.runner import RunOptions, make_task, run_task
from evalsuite.runs import records as record_module

PARAMS = {"lengths": "1024", "depths": "0,1", "samples": "2"}
Damage = Callable[[Path], None]


def _record_damage(change: Callable[[dict[str, Any]], None], every: bool) -> Damage:
    def damage(run: Path) -> None:
        lines = (run / "samples.jsonl").read_text(encoding="utf-8").splitlines()
        for index in range(len(lines) if every else 1):
            record = json.loads(lines[index])
            change(record)
            lines[index] = json.dumps(record)
        (run / "samples.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return damage


def _config_damage(key: str, value: Any) -> Damage:
    def damage(run: Path) -> None:
        config = json.loads((run / "config.json").read_text(encoding="utf-8"))
        config[key] = value(config) if callable(value) else value
        (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return damage


def _summary(text: str) -> Damage:
    return lambda run: (run / "summary.json").write_text(text, encoding="utf-8")


RECORD_DAMAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "axes empty": lambda r: r.__setitem__("axes", {}),
    "correct_all a list": lambda r: r["scores"].__setitem__("correct_all", [1]),
    "correct_all an object": lambda r: r["scores"].__setitem__("correct_all", {"a": 1}),
    "correct_all text": lambda r: r["scores"].__setitem__("correct_all", "yes"),
    "correct_all negative": lambda r: r["scores"].__setitem__("correct_all", -3),
    "scores empty": lambda r: r.__setitem__("scores", {}),
}
DAMAGE: dict[str, Damage] = {
    **{f"{name}, one record": _record_damage(change, False) for name, change in RECORD_DAMAGE.items()},
    **{f"{name}, every record": _record_damage(change, True) for name, change in RECORD_DAMAGE.items()},
    "step as text": _config_damage("checkpoint", lambda c: {**c["checkpoint"], "step": "abc"}),
    "checkpoint a list": _config_damage("checkpoint", [1, 2]),
    "params a list": _config_damage("params", [1, 2]),
    "summary garbage": _summary("{garbage"),
    "summary a list": _summary("[1, 2]"),
}
CONFIG_DAMAGE = {"step as text", "checkpoint a list", "params a list"}
QUARANTINED = {name for name in DAMAGE if name.startswith(("axes empty", "correct_all a", "correct_all text"))}


def _readers(bad: Path, good: Path, work: Path) -> dict[str, list[str]]:
    return {
        "compare": ["compare", str(bad), str(good), "--out", str(work / "cmp")],
        "check": ["check", str(bad), "--baseline", str(good)],
        "check reversed": ["check", str(good), "--baseline", str(bad)],
        "report": ["report", str(bad), "--no-plots"],
        "view": ["view", str(work / "runs"), "--write", str(work / "page.html")],
        "trend": ["trend", str(bad), str(good), "--out", str(work / "trend"), "--gate"],
        "log": ["log", str(bad), "--to", "tensorboard", "--tensorboard-dir", str(work / "tb")],
        "export": ["export", str(bad), "--out", str(work / "export")],
        "paper report": ["report", "--paper", str(work / "runs"), "--out", str(work / "paper.html")],
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    """Two finished needle runs of one model at training steps 1 and 2, and one of another model."""
    root = tmp_path_factory.mktemp("finished")
    made = {}
    for name, model, step in (("step1", "fake:oracle", 1), ("step2", "fake:oracle", 2), ("other", "fake:wrong", 1)):
        options = RunOptions(out=root / name, progress=False, checkpoint_step=step)
        made[name] = run_task(make_task("needle", PARAMS), load_model(model, {}, "cpu"), options).path
    return made


def _suite_result(folder: Path, model: str, run: Path) -> None:
    """What `evalsuite run --suite diff-paper` writes beside its runs, listing one needle entry."""
    data = {"format": "evalsuite-suite-result", "suite": "diff-paper", "model": model,
            "runs": [{"name": "needle-4k", "run": run.name}], "skipped": []}
    (folder / f"suite-diff-paper-{model}.json").write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_reader_says_one_line_about_a_damaged_run(finished, tmp_path, capsys, damage):
    runs = tmp_path / "runs"
    runs.mkdir()
    bad = shutil.copytree(finished["step1"], runs / finished["step1"].name)
    good = shutil.copytree(finished["step2"], runs / finished["step2"].name)
    other = shutil.copytree(finished["other"], runs / finished["other"].name)
    _suite_result(runs, "fake-oracle", bad)
    _suite_result(runs, "fake-wrong", other)
    DAMAGE[damage](bad)
    for reader, args in _readers(bad, good, tmp_path).items():
        record_module._WARNED.clear()  # each command is a process of its own, which warns afresh
        code, out, err = invoke(capsys, *args)
        assert "Traceback" not in err + out, (reader, err)
        assert code in (0, 2), (reader, code, err)  # never 1: damage is not a regression
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == (code == 2), (reader, code, err)
        if damage in QUARANTINED:  # the damaged records are left out, and the reader says so
            assert code == 2 or "left out" in err, (reader, err)
        if damage in CONFIG_DAMAGE:
            expected = "config.json's 'params'" if "params" in damage else "config.json's 'checkpoint'"
            assert expected in err, (reader, err)
            assert code == (0 if reader == "view" else 2), (reader, code, err)


@pytest.mark.parametrize("every", [False, True])
def test_a_record_off_its_tasks_kinds_is_left_out_with_one_warning(finished, tmp_path, capsys, every):
    bad = shutil.copytree(finished["step1"], tmp_path / "bad")
    _record_damage(RECORD_DAMAGE["correct_all text"], every)(bad)
    record_module._WARNED.clear()
    code, out, err = invoke(capsys, "report", str(bad), "--no-plots")
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "left out" in warnings[0] and "'correct_all'" in warnings[0], err
    if every:  # nothing left to report
        assert code == 2 and "holds no samples" in err
    else:
        assert code == 0 and "correct_all" in out, (code, out, err)


def test_check_refuses_a_negative_pass_fail_value_rather_than_calling_it_a_regression(finished, tmp_path, capsys):
    bad = shutil.copytree(finished["step1"], tmp_path / "bad")
    _record_damage(RECORD_DAMAGE["correct_all negative"], True)(bad)
    code, out, err = invoke(capsys, "check", str(bad), "--baseline", str(finished["step2"]))
    assert code == 2, (code, out, err)
    assert err.count("error: ") == 1 and "correct_all is -3" in err and "outside 0..1" in err


def test_log_names_a_summary_that_is_not_an_object(finished, tmp_path, capsys):
    bad = shutil.copytree(finished["step1"], tmp_path / "bad")
    _summary("[1, 2]")(bad)
    code, _, err = invoke(capsys, "log", str(bad), "--to", "tensorboard", "--tensorboard-dir", str(tmp_path / "tb"))
    assert code == 2 and "summary.json holds a list, not a JSON object" in err
