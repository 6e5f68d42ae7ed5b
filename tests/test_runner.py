"""End to end: records, resume after a real SIGKILL, determinism across batch sizes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import invoke, run_cli

NEEDLE_ARGS = ["--task", "needle", "-T", "lengths=1024,2048", "-T", "depths=0,0.5,1", "-T", "samples=3",
               "--no-progress"]


def only_run(out: Path, prefix: str = "needle-") -> Path:
    (folder,) = [p for p in out.iterdir() if p.name.startswith(prefix)]
    return folder


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_fake_run_writes_records_summary_and_heatmap(capsys, tmp_path):
    result = invoke(capsys, "run", "--model", "fake", *NEEDLE_ARGS, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    folder = only_run(tmp_path)
    rows = records(folder)
    assert len(rows) == 18 and len({r["id"] for r in rows}) == 18
    assert all(r["scores"]["correct_all"] for r in rows)  # the oracle reads the needle
    assert all("text" not in r["prompt"] for r in rows)  # prompts are hashed unless --log-prompts
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["n"] == 18 and summary["overall"]["correct_all"] == 1.0
    assert len(summary["cells"]) == 6 and {c["n"] for c in summary["cells"]} == {3}
    assert (folder / "plots" / "heatmap.png").stat().st_size > 1000
    config = json.loads((folder / "config.json").read_text())
    assert config["params"]["lengths"] == [1024, 2048] and config["model"]["backend"] == "fake"
    assert "python" in config["versions"]


def test_log_prompts_keeps_text(capsys, tmp_path):
    result = invoke(capsys, "run", "--model", "fake", *NEEDLE_ARGS, "--limit", "2", "--log-prompts", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = records(only_run(tmp_path))
    assert len(rows) == 2 and "The magic number of" in rows[0]["prompt"]["text"][0]


def _start(out: Path, delay: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "evalsuite.cli", "run", "--model", "fake", "-M", f"delay={delay}", *NEEDLE_ARGS,
           "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _lines(out: Path) -> int:
    files = list(out.glob("needle-*/samples.jsonl"))
    return files[0].read_bytes().count(b"\n") if files else 0


def test_sigkill_then_rerun_finishes_each_sample_exactly_once(capsys, tmp_path):
    reference = tmp_path / "reference"
    assert invoke(capsys, "run", "--model", "fake", "-M", "delay=0", *NEEDLE_ARGS, "--out", str(reference)).returncode == 0
    # config (and so the run folder name) depends on the model options; use the same delay for both runs
    resumed = tmp_path / "resumed"
    for kill_after in (0, 5, 12):  # kill before the first record, and twice in the middle
        proc = _start(resumed, delay=0.05)
        deadline = time.time() + 60
        while _lines(resumed) < kill_after + (1 if kill_after else 0) and time.time() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        if kill_after == 0:
            time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not list(resumed.glob("needle-*/summary.json")), "a killed run must not look complete"
    result = run_cli("run", "--model", "fake", "-M", "delay=0.05", *NEEDLE_ARGS, "--out", str(resumed))
    assert result.returncode == 0, result.stderr
    got, want = records(only_run(resumed)), records(only_run(reference))
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in want)
    by_id = {r["id"]: r for r in want}
    for row in got:
        expected = dict(by_id[row["id"]])
        assert {k: row[k] for k in ("outputs", "scores", "info", "prompt")} == {
            k: expected[k] for k in ("outputs", "scores", "info", "prompt")}
    summary_got = json.loads((only_run(resumed) / "summary.json").read_text())
    summary_want = json.loads((only_run(reference) / "summary.json").read_text())
    assert summary_got["cells"] == summary_want["cells"] and summary_got["overall"] == summary_want["overall"]


def test_torn_last_line_is_redone(capsys, tmp_path):
    assert invoke(capsys, "run", "--model", "fake", *NEEDLE_ARGS, "--out", str(tmp_path)).returncode == 0
    folder = only_run(tmp_path)
    lines = (folder / "samples.jsonl").read_text().splitlines(keepends=True)
    (folder / "summary.json").unlink()
    (folder / "samples.jsonl").write_text("".join(lines[:7]) + lines[7][:40])  # a write cut mid-line
    assert invoke(capsys, "run", "--model", "fake", *NEEDLE_ARGS, "--out", str(tmp_path)).returncode == 0
    rows = records(folder)
    assert len(rows) == 18 and len({r["id"] for r in rows}) == 18
    assert json.loads((folder / "summary.json").read_text())["n"] == 18


def test_same_records_whatever_the_batch_size(capsys, tmp_path, tiny_models):
    args = ["--task", "needle", "-T", "lengths=256,512", "-T", "depths=0,0.5,1", "-T", "samples=2",
            "-T", "needles=2", "-T", "queries=2", "--no-progress"]
    outs = {}
    for batch in (1, 5):
        out = tmp_path / f"b{batch}"
        result = invoke(capsys, "run", "--model", str(tiny_models["diff"]), *args, "--batch-size", str(batch),
                        "--out", str(out))
        assert result.returncode == 0, result.stderr
        outs[batch] = sorted(records(only_run(out)), key=lambda r: r["id"])
    assert len(outs[1]) == 12
    assert outs[1] == outs[5]
    assert only_run(tmp_path / "b1").name == only_run(tmp_path / "b5").name  # batch size is not part of the config


def test_two_models_write_pair_and_difference_heatmaps(capsys, tmp_path, tiny_models):
    """The issue's done-when command, on tiny HF Llama and DiffLlama folders."""
    result = invoke(capsys, "run", "--model", str(tiny_models["base"]), "--model", str(tiny_models["diff"]),
                    "--task", "needle", "-T", "lengths=256,512", "-T", "depths=0,0.5,1", "-T", "samples=2",
                    "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.name.startswith("needle-"))
    assert len(runs) == 2
    for folder in runs:
        assert len(records(folder)) == 12
        assert (folder / "summary.json").is_file() and (folder / "plots" / "heatmap.png").is_file()
    ids = [sorted(r["id"] for r in records(f)) for f in runs]
    assert ids[0] == ids[1]  # identical samples
    (compare,) = [p for p in tmp_path.iterdir() if p.name.startswith("compare-")]
    assert (compare / "heatmap_pair.png").is_file() and (compare / "heatmap_diff.png").is_file()
    report = invoke(capsys, "report", *map(str, runs))
    assert report.returncode == 0, report.stderr
    assert "| n_needles | n_queries | context_length | depth | correct_all (95% CI)" in report.stdout
    assert report.stdout.count("| 1 | 1 | 256 |") == 6  # three depths, two runs


@pytest.mark.parametrize("hits, expected, substring", [
    (" 1234567.", (True, 1.0), (True, 1.0)),
    (" The number is 1234567", (True, 1.0), (True, 1.0)),
    (" 12345678.", (False, 0.0), (True, 1.0)),  # a longer number holds the digits, but is not the answer
    ("", (False, 0.0), (False, 0.0)),
    (" 01234567", (False, 0.0), (True, 1.0)),
])
def test_score_single_query(hits, expected, substring):
    from evalsuite.tasks.needle.task import Needle

    task = Needle(lengths=(64,), depths=(0.0,), samples=1)
    sample = next(iter(task.plan(task.prepare(None))))
    sample = type(sample)(id=sample.id, task=sample.task, axes=sample.axes, target=("1234567",), data=sample.data)
    scores = task.score(sample, [hits])
    assert (scores["correct_all"], scores["correct_mean"]) == expected
    assert (scores["correct_all_substring"], scores["correct_mean_substring"]) == substring


@pytest.mark.parametrize("output, expected", [
    (" 1111111. The magic number of B is 2222222.", (True, 1.0)),
    (" 1111111. The magic number of B is 3333333.", (False, 0.5)),
    (" 2222222 and 1111111", (True, 1.0)),  # order does not matter: each number must appear
    (" nothing useful", (False, 0.0)),
])
def test_substring_score_of_two_queries_reports_all_and_mean(output, expected):
    """The public needle code's rule, kept as the *_substring metrics (strict attribution is
    tested in test_needle_scoring.py): a query is right when its digits appear anywhere."""
    from evalsuite.tasks.needle.task import Needle

    task = Needle(lengths=(64,), depths=(0.0,), needles=(2,), queries=(2,), samples=1)
    sample = next(iter(task.plan(task.prepare(None))))
    sample = type(sample)(id=sample.id, task=sample.task, axes=sample.axes, target=("1111111", "2222222"),
                          data=sample.data)
    scores = task.score(sample, [output])
    assert (scores["correct_all_substring"], scores["correct_mean_substring"]) == expected


# ---- the run lock -----------------------------------------------------------------------------


def test_the_run_lock_refuses_a_second_writer_with_the_holders_pid(tmp_path):
    from evalsuite.errors import UserError
    from evalsuite.runs.records import RunFolder

    first, second = RunFolder(tmp_path), RunFolder(tmp_path)
    with first.lock():
        with pytest.raises(UserError, match=rf"being written by another evalsuite process \(pid {os.getpid()}\)"):
            with second.lock():
                pass
    with second.lock():  # released with the block
        assert (tmp_path / "run.pid").read_text().strip() == str(os.getpid())


def test_the_package_imports_where_there_is_no_fcntl():
    """Windows has no fcntl: the lock is filelock's, and nothing else may need fcntl either."""
    code = ("import sys; sys.modules['fcntl'] = None\n"
            "import evalsuite.cli, evalsuite.engine.runner, evalsuite.runs.records\n"
            "print('imported')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr


# ---- one configuration, one run folder ----------------------------------------------------------


ICL_DATA = Path(__file__).parents[1] / "evalsuite" / "suites" / "data" / "icl-smoke.jsonl"


def test_two_spellings_of_one_configuration_share_a_run_folder(capsys, tmp_path, monkeypatch):
    """Repeated or reordered shot counts and a relative or absolute data path plan the same samples:
    normalised before hashing, they make one run folder (the second command finds it complete)."""
    shutil.copy(ICL_DATA, tmp_path / "data.jsonl")
    monkeypatch.chdir(tmp_path)
    common = ["run", "--model", "fake", "--task", "icl", "-T", "test_size=4", "--limit", "6", "--no-progress",
              "--out", str(tmp_path / "out")]
    spellings = (["-T", "shots=1,4", "-T", "data=data.jsonl"], ["-T", "shots=4,1,1", "-T", f"data={tmp_path}/data.jsonl"],
                 ["-T", "shots= 1 ,4", "-T", "data=./data.jsonl"])
    for spelling in spellings:
        result = invoke(capsys, *common, *spelling)
        assert result.returncode == 0, result.stderr
    (folder,) = (tmp_path / "out").glob("icl-*")
    config = json.loads((folder / "config.json").read_text())
    assert config["params"]["shots"] == "1,4" and config["params"]["data"] == str(tmp_path / "data.jsonl")


@pytest.mark.parametrize("task, raw, fragment", [
    ("icl", {"permutations": "100000000", "shots": "1"}, "permutations=100000000 is more than the cap of 100"),
    ("nll", {"documents": "100000000"}, "documents=100000000 is more than the cap of 1,000,000"),
    ("needle", {"samples": "１"}, "is not a valid int"),
])
def test_huge_or_foreign_counts_are_refused_naming_the_cap(task, raw, fragment):
    from evalsuite.engine.runner import make_task
    from evalsuite.errors import UserError

    with pytest.raises(UserError):
        make_task(task, raw)  # the task's modules loaded before memory is measured
    tracemalloc.start()
    try:
        with pytest.raises(UserError) as caught:
            make_task(task, raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # refused before anything of that size is made: measured in memory, which no machine load moves
    assert fragment in str(caught.value) and peak < 1_000_000
