"""`evalsuite watch --executor`: checkpoints handed to a scheduler through submitit (its local
executor here: a process per job, as a SLURM job would be) end in the same records as the
watcher's own process makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import invoke
from watch_checkpoints import NEEDLE_FLAGS, write_checkpoint


def records(out: Path) -> dict[str, list[dict]]:
    """Each run folder's records by run folder name, in id order."""
    found = {}
    for run in sorted(p for p in out.iterdir() if (p / "config.json").is_file()):
        lines = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        found[run.name] = sorted(lines, key=lambda r: r["id"])
    return found


def ledger(out: Path) -> list[tuple]:
    lines = [json.loads(line) for line in (out / "watch" / "ledger.jsonl").read_text().splitlines()]
    return [(e["checkpoint"], e["status"], [Path(r).name for r in e["runs"]], e["metrics"],
             (e["gate"] or {}).get("verdict")) for e in lines]


@pytest.mark.slow  # a submitit job per checkpoint
def test_a_two_checkpoint_sweep_through_submitit_makes_the_same_records_as_local(capsys, tmp_path):
    train = tmp_path / "run1"
    write_checkpoint(train / "checkpoint-100")
    write_checkpoint(train / "checkpoint-200", perturbed=True)
    common = ("watch", str(train), *NEEDLE_FLAGS, "--once", "--settle", "0", "--no-progress")
    code, said, err = invoke(capsys, *common, "--out", str(tmp_path / "local"))
    assert code == 1, said + err  # the perturbed checkpoint regressed
    code, said, err = invoke(capsys, *common, "--out", str(tmp_path / "jobs"), "--executor", "local-submitit",
                             "--executor-option", "timeout_min=30", "--log-to", "tensorboard")
    assert code == 1, said + err
    assert "submitted checkpoint-100: job" in said + err and "submitted checkpoint-200: job" in said + err

    local, jobs = records(tmp_path / "local"), records(tmp_path / "jobs")
    assert len(local) == 2 and sorted(local) == sorted(jobs)  # the same run folders: the same run hashes
    assert local == jobs
    assert ledger(tmp_path / "local") == ledger(tmp_path / "jobs")
    logs = list((tmp_path / "jobs" / "watch" / "jobs").glob("*/*_log.out"))
    assert len(logs) == 2  # a job each, with its own log
    events = list((tmp_path / "jobs" / "tensorboard" / "needle-run1").glob("events.out.tfevents.*"))
    assert len(events) == 2  # each job sent its run to the tracker, at its step, in one series

    code, said, _ = invoke(capsys, *common, "--out", str(tmp_path / "jobs"), "--executor", "local-submitit")
    assert code == 0 and "0 checkpoint(s) evaluated now, 2 in all" in said  # resumed: no job submitted
    assert "submitted" not in said


def test_a_resource_submitit_does_not_know_is_one_line(capsys, tmp_path):
    (tmp_path / "run1").mkdir()
    code, _, err = invoke(capsys, "watch", str(tmp_path / "run1"), *NEEDLE_FLAGS, "--once", "--out",
                          str(tmp_path / "out"), "--executor", "local-submitit", "--executor-option", "gpus=two")
    assert code == 2 and err.count("\n") == 1 and "--executor-option" in err, err


def test_slurm_where_there_is_no_slurm_is_one_line(capsys, tmp_path):
    import shutil

    if shutil.which("srun") is not None:
        return  # a SLURM machine: nothing to refuse
    (tmp_path / "run1").mkdir()
    code, _, err = invoke(capsys, "watch", str(tmp_path / "run1"), *NEEDLE_FLAGS, "--once", "--out",
                          str(tmp_path / "out"), "--executor", "slurm")
    assert code == 2 and err.count("\n") == 1 and "--executor slurm" in err and "srun" in err, err
