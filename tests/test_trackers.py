"""Finished runs sent to W&B (offline) and TensorBoard, read back with each tracker's own files and reader."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from conftest import invoke

pytest.importorskip("wandb")
pytest.importorskip("tensorboard")

PARAMS = ["-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A needle run of the scripted model at training step 1500."""
    import evalsuite

    out = tmp_path_factory.mktemp("runs")
    results = evalsuite.run("needle", "fake", out=out, lengths=[1024], depths=[0, 1], samples=2, checkpoint_step=1500)
    return results.paths[0]


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def event_accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_tensorboard_gets_metrics_plots_and_samples_at_the_runs_step(capsys, finished_run, tmp_path):
    from tensorboard.util import tensor_util

    code, out, err = invoke(capsys, "log", str(finished_run), "--to", "tensorboard", "--tensorboard-dir", str(tmp_path))
    assert code == 0, err
    folder = tmp_path / "needle-fake-oracle"
    assert str(folder) in out
    events = event_accumulator(folder)
    summary = summary_of(finished_run)
    (point,) = events.Scalars("overall/correct_all")
    assert point.step == 1500 and point.value == pytest.approx(summary["overall"]["correct_all"])
    assert events.Scalars("n")[0].value == summary["n"]
    cell_tags = [t for t in events.Tags()["scalars"] if t.startswith("cell/") and t.endswith("/correct_all")]
    assert len(cell_tags) == len(summary["cells"])
    (image,) = events.Images("plots/heatmap")
    assert image.step == 1500 and image.width > 100
    text = tensor_util.make_ndarray(events.Tensors("samples/text_summary")[0].tensor_proto).item().decode()
    assert text.startswith("| id |") and text.count("needle-N1-R1-L1024") == summary["n"]


def test_run_with_log_to_tensorboard_sends_each_finished_run(capsys, tmp_path):
    code, _, err = invoke(capsys, "run", "--model", "fake", "--task", "needle", *PARAMS, "--step", "200",
                          "--out", str(tmp_path), "--no-progress", "--log-to", "tensorboard")
    assert code == 0, err
    (point,) = event_accumulator(tmp_path / "tensorboard" / "needle-fake-oracle").Scalars("overall/correct_all")
    assert (point.step, point.value) == (200, 1.0)


def wandb_records(path: Path):
    """The records of a .wandb file, parsed with wandb's own protobuf schema: the file is W&B's
    header (':W&B', a 2-byte magic, a version byte) then a LevelDB-style log of 32 KiB blocks,
    each record a 7-byte header (crc32c, length, type) and its bytes (type 1 whole, 2..4 in parts)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        room = 32768 - position % 32768
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0:
            position += room
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_run_holds_metrics_plots_and_samples_table(capsys, finished_run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    code, out, err = invoke(capsys, "log", str(finished_run), "--to", "wandb", "--project", "evalsuite-test")
    assert code == 0, err
    import wandb

    wandb.teardown()  # W&B's service writes the run file on its own time; a process's exit waits for it, as this does
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert str(run_file.parent) in out
    records = list(wandb_records(run_file))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == (finished_run.name, "needle-fake-oracle", "evalsuite-test")
    (history,) = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    items: dict = {}
    for item in history.item:  # a media value is stored field by field: nested key (name, field)
        key = [item.key] if item.key else list(item.nested_key)
        value = json.loads(item.value_json)
        if len(key) == 1:
            items[key[0]] = value
        else:
            items.setdefault(key[0], {})[key[1]] = value
    summary = summary_of(finished_run)
    assert history.step.num == 1500
    assert items["overall/correct_all"] == pytest.approx(summary["overall"]["correct_all"])
    assert items["plots/heatmap"]["_type"] == "image-file"
    assert (run_file.parent / "files" / items["plots/heatmap"]["path"]).is_file()
    table = run_file.parent / "files" / items["samples"]["path"]
    rows = json.loads(table.read_text())
    assert items["samples"]["nrows"] == summary["n"]
    assert rows["columns"][:2] == ["id", "context_length"] and len(rows["data"]) == summary["n"]


def test_missing_tracker_package_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that may not be imported
    out = tmp_path / "never"
    code, _, err = invoke(capsys, "run", "--model", "fake", "--task", "needle", *PARAMS, "--out", str(out),
                          "--log-to", "wandb")
    assert code == 2
    assert err.strip() == "error: --log-to wandb needs the wandb package: pip install wandb"
    assert not out.exists()


def test_log_refuses_a_folder_that_is_not_a_finished_run(capsys, tmp_path):
    code, _, err = invoke(capsys, "log", str(tmp_path), "--to", "tensorboard")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_log_sends_the_records_numbers_not_a_summary_that_disagrees(capsys, finished_run, tmp_path):
    import shutil

    run = shutil.copytree(finished_run, tmp_path / "runs" / finished_run.name)
    summary = summary_of(run)
    summary["overall"]["correct_all"], summary["n"] = 0.123, 99  # a stale or edited summary.json
    (run / "summary.json").write_text(json.dumps(summary))
    code, _, err = invoke(capsys, "log", str(run), "--to", "tensorboard", "--tensorboard-dir", str(tmp_path / "tb"))
    assert code == 0, err
    assert err.count("warning: ") == 1 and "disagrees with the records on 2 number(s)" in err, err
    events = event_accumulator(tmp_path / "tb" / "needle-fake-oracle")
    assert events.Scalars("overall/correct_all")[0].value == 1.0  # what the records hold (the oracle is right)
    assert events.Scalars("n")[0].value == 4 == len((run / "samples.jsonl").read_text().splitlines())


def test_log_refuses_a_run_with_no_readable_record(capsys, finished_run, tmp_path):
    import shutil

    run = shutil.copytree(finished_run, tmp_path / "runs" / finished_run.name)
    (run / "samples.jsonl").write_bytes(b"\xff\xfe not a record\n" * 4)
    code, _, err = invoke(capsys, "log", str(run), "--to", "tensorboard", "--tensorboard-dir", str(tmp_path / "tb"))
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and "Traceback" not in err, err
    assert errors == [f"error: run {run} holds no readable samples (samples.jsonl is empty, missing or damaged); "
                      "rerun its command"], err
    assert not (tmp_path / "tb").exists()  # nothing sent


def test_a_tracker_that_refuses_is_one_line_naming_the_command_to_send_again(capsys, finished_run, tmp_path,
                                                                              monkeypatch):
    """W&B online without an API key refuses before it opens a connection."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_CONFIG_DIR", "HOME", "WANDB_CACHE_DIR"):
        monkeypatch.setenv(name, "online" if name == "WANDB_MODE" else str(tmp_path))
    code, _, err = invoke(capsys, "log", str(finished_run), "--to", "wandb")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: wandb did not take run {finished_run}: ")
    assert err.strip().endswith(f"send it again with: evalsuite log {finished_run} --to wandb")


def test_a_refusal_during_a_run_is_a_warning_and_the_runs_go_on(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_CONFIG_DIR", "HOME", "WANDB_CACHE_DIR"):
        monkeypatch.setenv(name, "online" if name == "WANDB_MODE" else str(tmp_path))
    code, out, err = invoke(capsys, "run", "--model", "fake", "--model", "fake:wrong", "--task", "needle", *PARAMS,
                            "--out", str(tmp_path / "r"), "--no-progress", "--log-to", "wandb")
    assert code == 0, err
    assert err.count("warning: wandb did not take run ") == 2
    assert len(list((tmp_path / "r").glob("needle-*/summary.json"))) == 2
