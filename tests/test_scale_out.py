"""Past one process: torchrun ranks (CPU, gloo), resume across world sizes, two runs on one folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import invoke, run_cli

from evalsuite.engine.distributed import World, shard
from evalsuite.types import Sample

NEEDLE = ["--task", "needle", "-T", "lengths=256,512", "-T", "depths=0,0.5,1", "-T", "samples=2", "--no-progress"]
FAKE_NEEDLE = ["--task", "needle", "-T", "lengths=1024,2048", "-T", "depths=0,0.5,1", "-T", "samples=2",
               "--no-progress"]  # the fake model counts bytes: longer lengths hold the prompt
ICL_DATA = Path(__file__).resolve().parents[1] / "evalsuite" / "suites" / "data" / "icl-smoke.jsonl"
ICL = ["--task", "icl", "-T", f"data={ICL_DATA}", "-T", "shots=1,4", "-T", "permutations=2", "-T", "test_size=6",
       "--no-progress"]


def torchrun(nproc: int, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "evalsuite", "run", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, **popen)


def finished(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (children before their parents are killed, all at once)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def only_run(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith("compare-")]
    return folder


def lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_shards_keep_groups_together_and_balance_lengths():
    samples = [Sample(id=f"s{i}", task="t", axes={"context_length": length, "group": i // 2})
               for i, length in enumerate([4096, 4096, 1024, 1024, 512, 512, 256, 256])]
    world = [shard(samples, World(rank=r, size=2), key=lambda s: s.axes["group"]) for r in range(2)]
    assert sorted(s.id for part in world for s in part) == sorted(s.id for s in samples)
    for part in world:
        groups = {s.axes["group"] for s in part}
        assert all(all(t in part for t in samples if t.axes["group"] == g) for g in groups)
    loads = [sum(s.axes["context_length"] for s in part) for part in world]
    assert loads == [8192, 3584]  # the 4096 block alone on one rank, everything else on the other


@pytest.mark.slow  # evalsuite processes: torchrun ranks, kills, restarts
@pytest.mark.parametrize("model, args", [("toy-diff", NEEDLE), ("toy-base", ICL)], ids=["needle", "icl"])
def test_two_ranks_merge_to_the_single_process_records(capsys, tmp_path, model, args):
    single = tmp_path / "single"
    assert invoke(capsys, "run", "--model", model, *args, "--out", str(single)).returncode == 0
    # run from tmp_path, so that the ranks import the installed evalsuite, as this process does (from the
    # source tree the toy model's folder is another path, and the run another run)
    code, log = finished(torchrun(2, "--model", model, *args, "--out", str(tmp_path / "ranks"), cwd=tmp_path))
    assert code == 0, log
    folder = only_run(tmp_path / "ranks")
    assert not list(folder.glob("samples.rank*.jsonl"))
    assert lines(folder) == lines(only_run(single))  # outputs and scores, sample for sample, in plan order
    assert json.loads((folder / "summary.json").read_text())["overall"] == \
        json.loads((only_run(single) / "summary.json").read_text())["overall"]


@pytest.mark.slow  # evalsuite processes: torchrun ranks, kills, restarts
def test_a_killed_two_rank_run_resumes_with_one_process(capsys, tmp_path):
    def fake(delay: float) -> list[str]:  # a record per sample, `delay` seconds apart
        return ["--model", "fake", "-M", f"delay={delay}", "--batch-size", "1", *FAKE_NEEDLE]

    reference = tmp_path / "reference"
    assert invoke(capsys, "run", *fake(0), "--out", str(reference)).returncode == 0  # the records need no delay
    args = fake(0.4)  # after two records each rank has seconds of work left to be killed in
    out = tmp_path / "resumed"
    proc = torchrun(2, *args, "--out", str(out))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        rank_files = list(out.glob("needle-*/samples.rank*.jsonl"))
        if sum(p.read_bytes().count(b"\n") for p in rank_files) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    for pid in [*descendants(proc.pid), proc.pid]:  # the launcher starts its ranks in sessions of their own
        os.kill(pid, signal.SIGKILL)
    proc.communicate()
    folder = only_run(out)
    assert not (folder / "summary.json").exists()
    assert list(folder.glob("samples.rank*.jsonl"))
    resumed = run_cli("run", *args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    got = lines(folder)
    assert [r["id"] for r in got] == [r["id"] for r in lines(only_run(reference))]
    assert got == lines(only_run(reference))


@pytest.mark.slow  # evalsuite processes: torchrun ranks, kills, restarts
def test_two_concurrent_runs_on_one_folder_never_count_a_sample_twice(tmp_path):
    args = [sys.executable, "-m", "evalsuite", "run", "--model", "fake", "-M", "delay=0.02", *FAKE_NEEDLE,
            "--out", str(tmp_path)]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    if codes == [0, 2]:
        (message,) = [err for code, err in results if code == 2]
        assert message.count("\n") == 1 and "being written by another evalsuite process (pid" in message
    folder = only_run(tmp_path)
    ids = [r["id"] for r in lines(folder)]
    assert len(ids) == len(set(ids)) == 12
    assert json.loads((folder / "summary.json").read_text())["n"] == 12


@pytest.mark.slow  # evalsuite processes: torchrun ranks, kills, restarts
def test_a_lock_left_by_a_killed_run_does_not_block_the_resume(tmp_path):
    args = [sys.executable, "-m", "evalsuite", "run", "--model", "fake", "-M", "delay=0.05", *FAKE_NEEDLE,
            "--out", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not list(tmp_path.glob("needle-*/run.lock")) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert list(tmp_path.glob("needle-*/run.lock"))
    resumed = run_cli("run", "--model", "fake", "-M", "delay=0.05", *FAKE_NEEDLE, "--out", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
