"""`evalsuite watch`: a training folder followed as a trainer fills it.

Nothing is trained: toy checkpoints are written into the folder one by one (the second slowly,
shard by shard; a fourth that cannot load; the last worse, with a perturbed layer). The watcher
runs as a user runs it, in its own process; it is killed and started again, and the records,
the ledger, the trend, the gate's exit status and the webhook's message are read back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import invoke
from watch_checkpoints import INDEX, NEEDLE_FLAGS, SHARDS, write_checkpoint, write_sharded_slowly, write_unloadable

from evalsuite.engine.watch import Candidate, Ledger, Readiness, candidates, not_ready
from evalsuite.integrations.webhook import message, post

HANG_GUARD_S = 600  # a watcher that never gets there fails the test instead of hanging it


# ---- a webhook on the loopback ------------------------------------------------------------------

@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    """A local HTTP server that keeps every JSON body posted to it."""
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    server.shutdown()
    server.server_close()


# ---- the watcher in its own process -------------------------------------------------------------

def start_watcher(train: Path, out: Path, log: Path, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "evalsuite.cli", "watch", str(train), *NEEDLE_FLAGS, "--out", str(out),
            "--settle", "0.5", "--interval", "0.5", "--no-progress", *extra]
    with log.open("ab") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)


def wait_for(condition: Callable[[], bool], what: str, watcher: subprocess.Popen, log: Path,
             too_late: Callable[[], bool] = lambda: False) -> None:
    """Until `condition`; failing at once when the watcher ended or `too_late` says it never will be."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert watcher.poll() is None, f"the watcher ended ({watcher.returncode}) before {what}:\n{log.read_text()}"
        assert not too_late(), f"never {what}: it went on without\n{log.read_text()}"
        assert time.monotonic() < deadline, f"never {what}:\n{log.read_text()}"
        time.sleep(0.2)


def steps_done(out: Path) -> dict[int, str]:
    return {e.step: e.status for e in Ledger(out).entries()}


def waiting_for(out: Path, name: str) -> str:
    try:
        return json.loads((out / "watch" / "state.json").read_text())["waiting"].get(name, "")
    except (OSError, ValueError):
        return ""


@pytest.mark.slow  # a real watcher process
def test_watch_evaluates_each_checkpoint_once_when_complete_gates_and_resumes(tmp_path, webhook, capsys):
    url, bodies = webhook
    train, out, log = tmp_path / "run1", tmp_path / "evals", tmp_path / "watch.log"
    train.mkdir()
    watcher = start_watcher(train, out, log, "--webhook", url)
    try:
        write_checkpoint(train / "checkpoint-100")
        wait_for(lambda: 100 in steps_done(out), "evaluated checkpoint-100", watcher, log)

        def pause(stage: str) -> None:  # the watcher must have seen each half-written state, and let it be
            expected = {"shard 2 missing": SHARDS[1], "shard 2 half written": "damaged"}[stage]
            wait_for(lambda: expected in waiting_for(out, "checkpoint-200"), f"seen {stage}", watcher, log,
                     too_late=lambda: 200 in steps_done(out))  # taken as it was: evaluated half written

        write_sharded_slowly(train / "checkpoint-200", pause)
        wait_for(lambda: 200 in steps_done(out), "evaluated checkpoint-200", watcher, log)
    finally:
        watcher.kill()  # as a machine going down would: no goodbye
        watcher.wait()
    assert watcher.returncode != 0

    write_unloadable(train / "checkpoint-250")
    write_checkpoint(train / "checkpoint-300", perturbed=True)
    code, said, err = invoke(capsys, "watch", str(train), *NEEDLE_FLAGS, "--out", str(out), "--once", "--settle", "0",
                             "--webhook", url, "--no-progress")
    assert code == 1, said + err
    assert said.count("evaluating ") == 2 and "evaluating checkpoint-100" not in said, said
    assert "checkpoint-250 (step 250) failed: could not load" in said
    assert "checkpoint-300 (step 300) REGRESSED against step 200 (previous)" in said
    assert "2 checkpoint(s) evaluated now, 4 in all" in said

    code, said, err = invoke(capsys, "watch", str(train), *NEEDLE_FLAGS, "--out", str(out), "--once", "--settle", "0",
                             "--webhook", url, "--no-progress")
    assert code == 0 and "0 checkpoint(s) evaluated now, 4 in all" in said, said + err
    code, said, err = invoke(capsys, "watch", str(train), *NEEDLE_FLAGS, "--out", str(out), "--until-step", "300",
                             "--no-progress")  # a watcher that would follow the folder: its last step is done
    assert code == 0 and "0 checkpoint(s) evaluated now, 4 in all" in said, said + err

    lines = [json.loads(line) for line in (out / "watch" / "ledger.jsonl").read_text().splitlines()]
    assert [(e["step"], e["status"]) for e in lines] == [(100, "ok"), (200, "ok"), (250, "failed"), (300, "ok")]
    assert "hidden_size" in lines[2]["reason"] or "do not match" in lines[2]["reason"], lines[2]["reason"]
    runs = sorted(p for p in out.iterdir() if (p / "config.json").is_file())
    assert len(runs) == 3  # one run folder per checkpoint that loaded: nothing evaluated twice
    for run in runs:
        records = (run / "samples.jsonl").read_text().splitlines()
        assert len(records) == 6 and len({json.loads(r)["id"] for r in records}) == 6
    by_step = {json.loads((r / "config.json").read_text())["checkpoint"]["step"]: r for r in runs}
    assert sorted(by_step) == [100, 200, 300]
    assert_complete_shards_were_evaluated(by_step[200], train / "checkpoint-200")
    summaries = {step: json.loads((run / "summary.json").read_text())["overall"] for step, run in by_step.items()}
    assert summaries[100]["correct_all"] == summaries[200]["correct_all"] == 1.0
    assert summaries[300]["correct_all"] < 1.0

    import pandas as pd

    points = pd.read_csv(out / "trend" / "trend.csv")
    assert sorted(points["step"].unique()) == [100, 200, 300] and set(points["family"]) == {"run1"}
    assert (out / "trend" / "trend_correct_all.png").stat().st_size > 10_000
    assert [e["gate"]["failed"] for e in lines if e["gate"]] == [False, True]  # 200 passed, 300 regressed

    assert len(bodies) == 1, bodies  # the one regression, once, though the watcher ran three times
    assert "checkpoint-300 (step 300) REGRESSED" in bodies[0]["text"]
    cells = bodies[0]["blocks"][1]["text"]["text"].splitlines()
    assert any("correct_all over all samples: 1.000 at step 200 -> " in c for c in cells), cells
    assert not any("in cell" in c for c in cells), cells  # cells of 3 samples cannot reach alpha: not testable


def assert_complete_shards_were_evaluated(run: Path, checkpoint: Path) -> None:
    """The run's fingerprint holds the hash of both shards as they ended, whole."""
    from evalsuite.backends.common.checkpoint import weight_files, weights_fingerprint

    model = json.loads((run / "config.json").read_text())["model"]
    assert model["weights_sha256"] == weights_fingerprint(weight_files(str(checkpoint)))["weights_sha256"]
    assert model["weights_bytes"] == sum((checkpoint / name).stat().st_size for name in SHARDS)


# ---- readiness, look by look --------------------------------------------------------------------

def test_a_checkpoint_is_ready_once_every_shard_is_whole_and_nothing_changes(tmp_path):
    folder = tmp_path / "checkpoint-7"
    stages = []

    def pause(stage: str) -> None:
        stages.append((stage, not_ready(folder, None)))

    write_sharded_slowly(folder, pause)
    assert "model-00002-of-00002.safetensors" in stages[0][1] and "missing" in stages[0][1]
    assert "damaged" in stages[1][1]
    assert not_ready(folder, None) is None
    readiness = Readiness(settle=0)
    candidate = Candidate(folder, 7)
    assert readiness.look(candidate).startswith("files complete")  # the first look: maybe still growing
    assert readiness.look(candidate) is None  # the second: unchanged
    (folder / "optimizer.pt").write_bytes(b"x" * 10)  # the trainer still writing beside the weights
    assert readiness.look(candidate).startswith("files complete")
    assert readiness.look(candidate) is None


@pytest.mark.parametrize(("setup", "reason"), [
    (lambda f: (f / "config.json").unlink(), "no config.json yet"),
    (lambda f: (f / "config.json").write_text('{"hidden_size": 1'), "config.json is not valid JSON"),
    (lambda f: (f / INDEX).unlink(), "weight shards without their index yet"),
    (lambda f: (f / INDEX).write_text('{"weight_map": {"a": "model-0000'), "not a readable weights index"),
])
def test_what_a_half_written_checkpoint_waits_for(tmp_path, setup, reason):
    folder = write_sharded_slowly(tmp_path / "checkpoint-1", lambda stage: None)
    setup(folder)
    assert reason in not_ready(folder, None)


def test_a_marker_file_alone_makes_a_checkpoint_ready(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    assert not_ready(folder, "DONE") == "no DONE yet"
    (folder / "DONE").touch()
    assert Readiness(marker="DONE", settle=60).look(Candidate(folder, 3)) is None  # no settling: the writer said so


def test_checkpoints_are_found_by_pattern_and_ordered_by_step(tmp_path):
    for name in ("checkpoint-1000", "checkpoint-200", "checkpoint-final", "logs", "step_50"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-final" / "trainer_state.json").write_text(json.dumps({"global_step": 1500}))
    found, stepless = candidates(tmp_path, "checkpoint-*")
    assert [(c.name, c.step) for c in found] == [("checkpoint-200", 200), ("checkpoint-1000", 1000),
                                                 ("checkpoint-final", 1500)]
    assert stepless == []
    (tmp_path / "checkpoint-x").mkdir()
    assert candidates(tmp_path, "checkpoint-*")[1] == ["checkpoint-x"]


# ---- the webhook's message ----------------------------------------------------------------------

def test_the_webhook_message_is_slack_json_with_each_offending_cell(webhook):
    url, bodies = webhook
    cells = [f"cell {i}" for i in range(25)]
    assert post(url, message("REGRESSED at step 3", cells))
    (body,) = bodies
    assert body["text"] == "REGRESSED at step 3"
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": "*REGRESSED at step 3*"}}
    lines = body["blocks"][1]["text"]["text"].splitlines()
    assert lines[:2] == ["cell 0", "cell 1"] and lines[-1] == "... and 5 more" and len(lines) == 21


def test_a_webhook_that_is_not_there_is_a_warning(capsys):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not post(f"http://127.0.0.1:{port}/", message("x", []))
    assert "warning: webhook" in capsys.readouterr().err


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "words"), [
    (("MISSING", "--task", "needle"), "no such folder to watch"),
    (("TRAIN",), "give --task NAME"),
    (("TRAIN", "--task", "needle", "--suite", "smoke"), "one of them"),
    (("TRAIN", "--task", "nedle"), "unknown task 'nedle'"),
    (("TRAIN", "--task", "needle", "-T", "lengths=8"), "lengths"),
    (("TRAIN", "--task", "needle", "--webhook", "hooks.example"), "--webhook takes an http"),
    (("TRAIN", "--task", "needle", "--executor-option", "gpus_per_node=1"), "--executor-option is for"),
    (("TRAIN", "--task", "needle", "--model-pattern", " "), "--model-pattern must not be empty"),
    # the gate's options by check's rules: each would skip every gate, or wait forever, or overflow
    (("TRAIN", "--task", "needle", "--alpha", "nan"), "--alpha must be between 0 and 1"),
    (("TRAIN", "--task", "needle", "--alpha", "5"), "--alpha must be between 0 and 1"),
    (("TRAIN", "--task", "needle", "--max-drop", "-1"), "--max-drop must be zero or more"),
    (("TRAIN", "--task", "needle", "--max-drop", "correct_all=nan"), "--max-drop must be zero or more"),
    (("TRAIN", "--task", "needle", "--settle", "inf"), "--settle takes seconds"),
    (("TRAIN", "--task", "needle", "--settle", "nan"), "--settle takes seconds"),
    (("TRAIN", "--task", "needle", "--interval", "nan"), "--interval takes seconds"),
    (("TRAIN", "--task", "needle", "--metric", " "), "--metric takes a metric's name"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, words):
    (tmp_path / "train").mkdir()
    args = tuple(str(tmp_path / "train") if a == "TRAIN" else str(tmp_path / "missing") if a == "MISSING" else a
                 for a in args)
    code, _, err = invoke(capsys, "watch", *args, "--out", str(tmp_path / "out"), "--once")
    assert code == 2 and err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_a_suite_is_run_on_each_checkpoint_and_its_runs_are_gated_per_task(capsys, tmp_path):
    (tmp_path / "tiny.toml").write_text('name = "tiny"\ndescription = "needle"\n\n[[run]]\ntask = "needle"\n'
                                        '[run.params]\nlengths = [256]\ndepths = [0, 1]\nsamples = 2\n')
    write_checkpoint(tmp_path / "run1" / "checkpoint-5")
    out = tmp_path / "evals"
    code, said, err = invoke(capsys, "watch", str(tmp_path / "run1"), "--suite", str(tmp_path / "tiny.toml"),
                             "--out", str(out), "--once", "--settle", "0", "--no-progress")
    assert code == 0 and "1 checkpoint(s) evaluated now, 1 in all" in said, said + err
    (entry,) = Ledger(out).entries()
    assert entry.status == "ok" and entry.gate is None  # the first of its series: nothing to gate against
    (run,) = entry.runs
    suite_result = json.loads((out / "suite-tiny-checkpoint-5.json").read_text())
    assert suite_result["runs"][0]["run"] == Path(run).name
    assert entry.metrics[Path(run).name]["correct_all"] == suite_result["runs"][0]["overall"]["correct_all"] == 1.0


def test_a_write_in_the_folder_wakes_the_waiter_and_polling_needs_no_observer(tmp_path):
    from evalsuite.engine.watch_wait import Waiter

    with Waiter(tmp_path, interval=HANG_GUARD_S) as waiter:
        assert waiter.mode == "events"
        (tmp_path / "checkpoint-1").mkdir()
        assert waiter.wait()  # woken by the event, long before the interval
    with Waiter(tmp_path, interval=0, polling=True) as waiter:
        assert waiter.mode == "polling" and waiter.observer is None
        assert not waiter.wait()  # nothing will wake it: the interval ends the wait


def test_the_ledger_holds_each_checkpoint_per_task_configuration(tmp_path):
    from evalsuite.engine.watch import Entry
    from evalsuite.integrations.watch_jobs import EvalJob
    from evalsuite.integrations.watch_loop import Watcher, WatchSettings

    folder = write_checkpoint(tmp_path / "run1" / "checkpoint-10")
    out = tmp_path / "evals"
    job = EvalJob(out=str(out), task="needle", params={"lengths": "256"})
    assert job.digest() == EvalJob(out=str(out), task="needle", params={"lengths": "256"}, device="cuda:1").digest()
    other = EvalJob(out=str(out), task="needle", params={"lengths": "512"})
    assert other.digest() != job.digest()
    Ledger(out).append(Entry("checkpoint-10", str(folder.resolve()), 10, "ok", job=job.digest()))

    def ready(with_job: EvalJob) -> list[str]:
        watcher = Watcher(with_job, WatchSettings(folder=tmp_path / "run1", settle=0), echo=lambda line: None)
        watcher.look()  # the first look: its files may still change
        return [c.name for c in watcher.look()]

    assert ready(job) == []  # done with these parameters
    assert ready(other) == ["checkpoint-10"]  # not with those


def test_an_empty_out_is_refused_not_the_current_folder(capsys, tmp_path, monkeypatch):
    (tmp_path / "train").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, "watch", "train", "--task", "needle", "--once", "--out", "")
    assert code == 2 and err.count("\n") == 1 and "--out must name a folder" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]  # no watch/ or trend/ in the working folder


# ---- files a load could not read, a checkpoint gone, a run folder another watcher holds ----------

def not_ready_within(folder: Path, seconds: float = 30) -> str | None:
    """`not_ready`, failing the test (not hanging it) when the look blocks."""
    found: list[str | None] = []
    look = threading.Thread(target=lambda: found.append(not_ready(folder, None)), daemon=True)
    look.start()
    look.join(seconds)
    assert found, f"the look at {folder} blocked"
    return found[0]


def test_a_fifo_in_a_checkpoint_is_skipped_with_a_line_not_waited_on(capsys, tmp_path):
    import os

    train = tmp_path / "run1"
    folder = train / "checkpoint-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    os.mkfifo(folder / "model.safetensors")  # opening it to read blocks until someone writes: nobody will
    assert not_ready_within(folder).startswith("skipped: model.safetensors is a FIFO")
    code, said, err = invoke(capsys, "watch", str(train), "--task", "needle", "--out", str(tmp_path / "out"),
                             "--once", "--settle", "0")
    assert code == 0, said + err
    assert "skipping checkpoint-1: model.safetensors is a FIFO (named pipe), not a file" in said
    assert "0 checkpoint(s) evaluated now, 0 in all; waiting for 1" in said
    assert Ledger(tmp_path / "out").entries() == []  # not a failure: a readable file later is evaluated


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root reads every file")
def test_an_unreadable_file_is_skipped_with_a_line(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-1")
    (folder / "model.safetensors").chmod(0)
    assert not_ready_within(folder) == ("skipped: model.safetensors is not readable (permission denied); it is "
                                        "evaluated once it can be read")


def test_a_checkpoint_deleted_before_its_load_is_skipped_not_a_hub_id_nor_a_failure(tmp_path, monkeypatch):
    from evalsuite.integrations.watch_jobs import EvalJob
    from evalsuite.integrations.watch_loop import Watcher, WatchSettings

    (tmp_path / "run1" / "checkpoint-5").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # `run1/checkpoint-5` has the form of a hub id (org/name)
    said: list[str] = []
    watcher = Watcher(EvalJob(out=str(tmp_path / "out"), task="needle"), WatchSettings(folder=Path("run1")),
                      echo=said.append)
    (candidate,) = candidates(Path("run1"), "checkpoint-*")[0]
    (tmp_path / "run1" / "checkpoint-5").rmdir()  # a trainer's save_total_limit rotated it away
    assert watcher.evaluate([candidate]) == 0
    assert said[-1] == "skipping checkpoint-5 (step 5): its folder was deleted before it was evaluated", said
    assert Ledger(tmp_path / "out").entries() == []
    from evalsuite.integrations.watch_jobs import run_job

    answer = run_job(watcher.job, str(candidate.path.absolute()))  # what the executor was given
    assert answer["error"].startswith("checkpoint folder not found"), answer


def test_a_metric_typo_is_refused_and_a_busy_run_folder_is_retried_then_gated(capsys, tmp_path):
    """--metric corect_all: refused once the checkpoint's runs show the typo, before the ledger
    records it; a run folder another watcher holds: tried again later, never recorded as failed;
    the corrected command then evaluates it (its finished run folder is read, not run again)."""
    from evalsuite.runs.records import RunFolder

    train, out = tmp_path / "run1", tmp_path / "evals"
    write_checkpoint(train / "checkpoint-5")
    watch = ("watch", str(train), *NEEDLE_FLAGS, "--out", str(out), "--once", "--settle", "0", "--no-progress")
    code, said, err = invoke(capsys, *watch, "--metric", "corect_all")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "no run of checkpoint-5 has the metric 'corect_all'" in err and "correct_all" in err, err
    assert Ledger(out).entries() == []  # not marked done: the corrected command gates it
    (run,) = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    records = (run / "samples.jsonl").read_bytes()

    with RunFolder(run).lock():  # a second watcher evaluating it now
        code, said, err = invoke(capsys, *watch, "--metric", "correct_all")
    assert code == 0, said + err
    assert "checkpoint-5 (step 5) is busy, tried again at a later look" in said and "failed" not in said, said
    assert "0 checkpoint(s) evaluated now, 0 in all; waiting for 1" in said, said
    assert Ledger(out).entries() == []
    assert "another process" in json.loads((out / "watch" / "state.json").read_text())["waiting"]["checkpoint-5"]

    code, said, err = invoke(capsys, *watch, "--metric", "correct_all")
    assert code == 0 and "1 checkpoint(s) evaluated now, 1 in all" in said, said + err
    (entry,) = Ledger(out).entries()
    assert entry.status == "ok" and entry.runs == (str(run.resolve()),)
    assert (run / "samples.jsonl").read_bytes() == records  # resumed finished, nothing evaluated twice
