"""Adversarial inputs: each gives one line on stderr and exit 2 (never a traceback, nothing that
looks complete), and a run folder keeps exactly its own records whatever is written into it."""

from __future__ import annotations

import json
import os
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import invoke

SMALL = ["--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "--no-progress"]


def one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def finished_run(capsys, out: Path, model: str = "fake", *extra: str) -> Path:
    result = invoke(capsys, "run", "--model", model, *SMALL, *extra, "--out", str(out))
    assert result.returncode == 0, result.stderr
    (folder,) = [p for p in out.iterdir() if p.name.startswith("needle-")]
    return folder


def ids(folder: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (folder / "samples.jsonl").read_text().splitlines()]


# ---- data integrity ---------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["depths=0,0.0,0", "lengths=1024,1024"])
def test_repeated_list_values_are_refused(capsys, tmp_path, option):
    result = invoke(capsys, "run", "--model", "fake", *SMALL, "-T", option, "--out", str(tmp_path))
    one_line_error(result, "planned sample", "twice")
    assert not list(tmp_path.rglob("samples.jsonl"))


def test_a_line_from_another_models_run_is_quarantined_not_counted(capsys, tmp_path):
    mine = finished_run(capsys, tmp_path / "a", "fake")
    other = finished_run(capsys, tmp_path / "b", "fake:wrong")
    want = ids(mine)
    foreign = (other / "samples.jsonl").read_text().splitlines(keepends=True)[0]
    with (mine / "samples.jsonl").open("a") as fh:
        fh.write(foreign)
    (mine / "summary.json").unlink()
    report = invoke(capsys, "report", str(finished_run(capsys, tmp_path / "a", "fake")))  # the resume repairs the folder
    assert report.returncode == 0, report.stderr
    assert ids(mine) == want
    assert (mine / "samples.rejected.jsonl").read_text() == foreign
    assert json.loads((mine / "summary.json").read_text())["overall"]["correct_all"] == 1.0


@pytest.mark.parametrize("line", [
    '"a json string"', "\udcff not utf-8", '{"id": "x", "task": "needle", "axes": null}', "garbage {",
])
def test_a_damaged_line_in_the_middle_keeps_the_good_records_after_it(capsys, tmp_path, line):
    folder = finished_run(capsys, tmp_path)
    want = ids(folder)
    lines = (folder / "samples.jsonl").read_bytes().splitlines(keepends=True)
    bad = line.encode("utf-8", "surrogateescape") + b"\n"
    (folder / "samples.jsonl").write_bytes(b"".join(lines[:1] + [bad] + lines[1:]))
    report = invoke(capsys, "report", str(folder))  # reading warns once and leaves the line out
    assert report.returncode == 0, report.stderr
    assert report.stderr.count("warning: ") == 1 and "1 damaged" in report.stderr
    (folder / "summary.json").unlink()
    assert invoke(capsys, "run", "--model", "fake", *SMALL, "--out", str(tmp_path)).returncode == 0
    assert ids(folder) == want  # nothing recomputed, nothing lost
    assert (folder / "samples.rejected.jsonl").read_bytes() == bad


def test_a_duplicated_line_counts_once_in_report_and_check(capsys, tmp_path):
    folder = finished_run(capsys, tmp_path)
    lines = (folder / "samples.jsonl").read_text().splitlines(keepends=True)
    with (folder / "samples.jsonl").open("a") as fh:
        fh.write(lines[0])
    assert "n=4)" in invoke(capsys, "report", str(folder)).stdout
    # four pairs reach p = 0.068 at best: at alpha 0.1 the check has something to test (five would too)
    assert invoke(capsys, "check", str(folder), "--baseline", str(folder), "--alpha", "0.1").returncode == 0


def test_resuming_with_a_different_log_prompts_setting_is_refused(capsys, tmp_path):
    folder = finished_run(capsys, tmp_path, "fake", "--log-prompts")
    (folder / "summary.json").unlink()
    one_line_error(invoke(capsys, "run", "--model", "fake", *SMALL, "--out", str(tmp_path)), "--log-prompts")


def test_check_with_nothing_to_compare_exits_2(capsys, tmp_path):
    folder = finished_run(capsys, tmp_path)
    baseline = tmp_path / "baseline.json"
    assert invoke(capsys, "check", str(folder), "--export-baseline", str(baseline)).returncode == 0
    data = json.loads(baseline.read_text())
    for run in data["runs"]:
        run["scores"] = {metric: ["x"] * len(values) for metric, values in run["scores"].items()}
    baseline.write_text(json.dumps(data))
    one_line_error(invoke(capsys, "check", str(folder), "--baseline", str(baseline)))


def test_compare_refuses_an_incomplete_run(capsys, tmp_path):
    a, b = finished_run(capsys, tmp_path / "a"), finished_run(capsys, tmp_path / "b", "fake:wrong")
    (b / "summary.json").unlink()
    one_line_error(invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp")), "not complete")


# ---- bounds -----------------------------------------------------------------------------------

def test_an_absurd_plan_is_refused_and_limit_costs_what_it_keeps(capsys, tmp_path):
    from evalsuite.backends import load_model
    from evalsuite.engine.runner import check_task, make_task, planned_samples

    one_line_error(invoke(capsys, "run", "--model", "fake", "--task", "needle", "-T", "samples=200000000",
                          "--out", str(tmp_path)), "samples")
    kept = invoke(capsys, "run", "--model", "fake", "--task", "needle", "-T", "lengths=1024", "-T", "samples=100000",
                  "--limit", "1", "--no-progress", "--out", str(tmp_path))
    assert kept.returncode == 0, kept.stderr
    (run,) = tmp_path.glob("needle-*")
    assert (run / "samples.jsonl").read_bytes().count(b"\n") == 1
    # what the plan costs, in memory (the same on any machine, where time moves with the load):
    # one sample's worth, where the whole plan of 500,000 samples takes some 450 MB
    task = make_task("needle", {"lengths": "1024", "samples": "100000"})
    state = check_task(task, load_model("fake", {}))
    assert peak_bytes(lambda: planned_samples(task, state, 1)) < 1_000_000


def peak_bytes(work) -> int:
    """The most memory Python held for `work` at once, beyond what it held before (tracemalloc)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---- one line, never a traceback ----------------------------------------------------------------

def break_samples(kind: str):
    def apply(folder: Path) -> None:
        path = folder / "samples.jsonl"
        if kind == "empty":
            path.write_text("")
        elif kind == "deleted":
            path.unlink()
        elif kind == "score":
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            rows[0]["scores"]["correct_all"] = "yes"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return apply


def break_config(content: str):
    def apply(folder: Path) -> None:
        (folder / "config.json").write_text(content)
    return apply


@pytest.mark.parametrize("damage, fragment", [
    (break_samples("empty"), "no samples"),
    (break_samples("deleted"), "no samples"),
    (break_config("[]"), "config.json"),
    (break_config('{"params": {}}'), "config.json"),
])
def test_a_broken_run_folder_is_one_line_in_report(capsys, tmp_path, damage, fragment):
    folder = finished_run(capsys, tmp_path)
    damage(folder)
    one_line_error(invoke(capsys, "report", str(folder)), fragment)


def test_a_non_numeric_score_is_left_out_not_a_crash(capsys, tmp_path):
    folder = finished_run(capsys, tmp_path)
    break_samples("score")(folder)
    result = invoke(capsys, "report", str(folder))
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("make_target", ["file", "directory"])
def test_unwritable_outputs_are_one_line(capsys, tmp_path, make_target):
    run = finished_run(capsys, tmp_path)
    target = tmp_path / "target"
    if make_target == "file":
        other = finished_run(capsys, tmp_path / "other", "fake:wrong")  # two runs: a run is never compared with itself
        target.write_text("a file where a folder is expected")
        one_line_error(invoke(capsys, "compare", str(run), str(other), "--out", str(target)), str(target))
    else:
        target.mkdir()
        one_line_error(invoke(capsys, "check", str(run), "--baseline", str(run), "--junit", str(target)))
        one_line_error(invoke(capsys, "check", str(run), "--export-baseline", str(target)))
        assert not list(tmp_path.rglob("*.tmp"))


def test_an_unwritable_step_summary_is_one_line(capsys, tmp_path):
    run = finished_run(capsys, tmp_path)
    env_target = tmp_path / "summary-dir"
    env_target.mkdir()
    os.environ["GITHUB_STEP_SUMMARY"] = str(env_target)
    try:
        one_line_error(invoke(capsys, "check", str(run), "--baseline", str(run)))
    finally:
        del os.environ["GITHUB_STEP_SUMMARY"]


def test_plots_being_a_file_is_one_line(capsys, tmp_path):
    run = finished_run(capsys, tmp_path)
    shutil.rmtree(run / "plots")
    (run / "plots").write_text("not a folder")
    (run / "summary.json").unlink()
    one_line_error(invoke(capsys, "run", "--model", "fake", *SMALL, "--out", str(tmp_path)))
    assert not (run / "summary.json").exists()


@pytest.mark.parametrize("content", ["name = 'x'\n".encode("utf-16"), bytes(range(256))])
def test_a_suite_file_that_is_not_utf8_text_is_one_line(capsys, tmp_path, content):
    suite = tmp_path / "suite.toml"
    suite.write_bytes(content)
    one_line_error(invoke(capsys, "run", "--suite", str(suite), "--model", "fake", "--out", str(tmp_path)), "suite")


@pytest.mark.parametrize("cache_kind", ["directory", "not sqlite"])
def test_a_judge_cache_that_is_not_a_sqlite_file_is_one_line(capsys, tmp_path, cache_kind):
    cache = tmp_path / "cache"
    if cache_kind == "directory":
        cache.mkdir()
    else:
        cache.write_text("plain text, not a database " * 20)
    result = invoke(capsys, "run", "--model", "fake", "--task", "hallucination", "-T", "dataset=xsum",
                    "-T", f"data={tmp_path / 'missing.jsonl'}", "--judge", "openai:judge-x",
                    "--judge-base-url", "http://127.0.0.1:9/v1", "--judge-cache", str(cache), "--out", str(tmp_path))
    one_line_error(result)


@pytest.mark.parametrize("url", ["notaurl", "file:///etc/passwd#"])
def test_judge_base_url_must_be_http(capsys, tmp_path, url):
    result = invoke(capsys, "run", "--model", "fake", "--task", "hallucination", "-T", "dataset=xsum", "--judge",
                    "openai:judge-x", "--judge-base-url", url, "--out", str(tmp_path))
    one_line_error(result, "http")


def test_an_offline_hub_id_fails_fast_with_a_suggestion(capsys, tmp_path, monkeypatch):
    """Fast, as the command's own doing: no connection tried and no wait (retries, backoff) on the way
    to the error; counted, not timed, so that the machine's load cannot decide the outcome."""
    import socket

    tried: list[object] = []
    waited: list[float] = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: tried.append(address))
    monkeypatch.setattr(time, "sleep", waited.append)
    result = invoke(capsys, "run", "--model", "toy-dif/typo", *SMALL, "--out", str(tmp_path))
    one_line_error(result)
    assert tried == [] and sum(waited) < 1, (tried, waited)


# ---- checkpoints --------------------------------------------------------------------------------

def toy_copy(tmp_path: Path) -> Path:
    source = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-base"
    return Path(shutil.copytree(source, tmp_path / "ckpt"))


@pytest.mark.parametrize("damage", ["dangling link", "folder"])
def test_a_broken_safetensors_file_is_one_line(capsys, tmp_path, damage):
    folder = toy_copy(tmp_path)
    (folder / "model.safetensors").unlink()
    if damage == "dangling link":
        (folder / "model.safetensors").symlink_to(tmp_path / "blobs" / "missing")
    else:
        (folder / "model.safetensors").mkdir()
    one_line_error(invoke(capsys, "run", "--model", str(folder), *SMALL, "--out", str(tmp_path / "out")),
                   "model.safetensors")


def test_pickle_weights_need_an_explicit_opt_in(capsys, tmp_path):
    import torch
    from safetensors.torch import load_file

    folder = toy_copy(tmp_path)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    one_line_error(invoke(capsys, "run", "--model", str(folder), *SMALL, "--limit", "1", "--out", str(tmp_path / "out")),
                   "allow_pickle=true")
    allowed = invoke(capsys, "run", "--model", str(folder), "-M", "allow_pickle=true", *SMALL, "--limit", "1",
                     "--out", str(tmp_path / "out"))
    assert allowed.returncode == 0, allowed.stderr
