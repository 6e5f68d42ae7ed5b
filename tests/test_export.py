"""`evalsuite export --format lm-eval`: lm-evaluation-harness's results layout, read back with lm-eval's own helpers."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from conftest import invoke

lm_utils = pytest.importorskip("lm_eval.utils")

LM_EVAL_RESULT_KEYS = {"results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples",
                       "config", "git_hash", "date", "task_hashes", "model_name", "model_name_sanitized",
                       "total_evaluation_time_seconds"}
LM_EVAL_SAMPLE_KEYS = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
                       "doc_hash", "prompt_hash", "target_hash"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Needle runs of two scripted models (one always right, one always wrong), prompts kept."""
    import evalsuite

    out = tmp_path_factory.mktemp("runs")
    found = {}
    for spec in ("fake", "fake:wrong"):
        result = evalsuite.run("needle", spec, out=out, lengths=[1024], depths=[0, 0.5, 1], samples=2, log_prompts=True)
        found[spec] = result.paths[0]
    return found


def exported(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if p.is_file())


def test_export_writes_lm_evals_layout_that_its_own_helpers_read(capsys, runs, tmp_path):
    code, out, err = invoke(capsys, "export", "--format", "lm-eval", *map(str, runs.values()), "--out", str(tmp_path))
    assert code == 0, err
    files = exported(tmp_path)
    assert sorted(Path(f).parent.name for f in lm_utils.get_results_filenames(files)) == ["fake-oracle", "fake-wrong"]
    samples = lm_utils.get_sample_results_filenames(files)
    assert [lm_utils.get_file_task_name(Path(f).name) for f in samples] == ["needle", "needle"]
    (stamp,) = {lm_utils.get_file_datetime(Path(f).name) for f in samples}  # one export, one datetime
    assert {Path(f).name for f in lm_utils.get_results_filenames(files)} == {f"results_{stamp}.json"}
    assert out.count("written: ") == 4


def test_results_hold_lm_evals_keys_and_the_runs_numbers(runs, tmp_path):
    from scipy.stats import sem

    from evalsuite.integrations.lmeval_export import export_runs

    export_runs([runs["fake:wrong"]], tmp_path)
    (path,) = lm_utils.get_results_filenames(exported(tmp_path))
    results = json.loads(Path(path).read_text())
    assert LM_EVAL_RESULT_KEYS <= set(results)
    summary = json.loads((runs["fake:wrong"] / "summary.json").read_text())
    needle = results["results"]["needle"]
    assert needle["correct_all,none"] == summary["overall"]["correct_all"] == 0.0
    records = [json.loads(line) for line in (runs["fake:wrong"] / "samples.jsonl").read_text().splitlines()]
    means = [r["scores"]["correct_mean"] for r in records]
    assert needle["correct_mean_stderr,none"] == pytest.approx(float(sem(means)))
    assert results["n-samples"]["needle"] == {"original": 6, "effective": 6}
    assert results["higher_is_better"]["needle"]["correct_all"] is True
    assert results["model_name_sanitized"] == "fake-wrong"
    assert "needle" in lm_utils.make_table(results)  # lm-eval's own table printer reads it


def test_samples_lines_follow_lm_evals_sample_schema(runs, tmp_path):
    from evalsuite.integrations.lmeval_export import export_runs

    export_runs([runs["fake"]], tmp_path)
    (path,) = lm_utils.get_sample_results_filenames(exported(tmp_path))
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    records = [json.loads(line) for line in (runs["fake"] / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == len(records) == 6
    for line, record in zip(lines, records):
        assert LM_EVAL_SAMPLE_KEYS <= set(line)
        assert line["doc"]["id"] == record["id"] and line["target"] == record["target"][0]
        assert line["filtered_resps"] == record["outputs"] and line["resps"] == [[o] for o in record["outputs"]]
        assert line["arguments"]["gen_args_0"]["arg_0"] == record["prompt"]["text"][0]
        assert line["prompt_hash"] == lm_utils.hash_string(record["prompt"]["text"][0])  # as lm-eval hashes a prompt
        assert line["target_hash"] == lm_utils.hash_string(line["target"])
        assert line["correct_all"] == 1.0 and "correct_all" in line["metrics"]
    results = json.loads(Path(lm_utils.get_results_filenames(exported(tmp_path))[0]).read_text())
    joined = "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines)
    assert results["task_hashes"]["needle"] == lm_utils.hash_string(joined)


def test_the_latest_export_is_the_one_lm_eval_picks(runs, tmp_path):
    from evalsuite.integrations.lmeval_export import export_runs

    export_runs([runs["fake"]], tmp_path, moment=datetime(2025, 1, 2, 3, 4, 5))
    export_runs([runs["fake"]], tmp_path, moment=datetime(2026, 1, 2, 3, 4, 5))
    latest = lm_utils.get_latest_filename(lm_utils.get_results_filenames(exported(tmp_path)))
    assert Path(latest).name == "results_2026-01-02T03-04-05.json"


@pytest.mark.parametrize("name", ["EleutherAI/pythia-14m", "toy-diff", 'we"ird:name|x', "a[b]c?d*e<f>g\\h"])
def test_model_folder_is_named_as_lm_eval_names_it(name):
    from evalsuite.integrations.lmeval_export import sanitized_model_name

    assert sanitized_model_name(name) == lm_utils.sanitize_model_name(name)


def test_two_runs_of_one_task_for_one_model_get_distinct_task_names(capsys, runs, tmp_path):
    import evalsuite

    other = evalsuite.run("needle", "fake", out=runs["fake"].parent, lengths=[1024], depths=[0], samples=1).paths[0]
    code, _, err = invoke(capsys, "export", str(runs["fake"]), str(other), "--out", str(tmp_path))
    assert code == 0, err
    results = json.loads(Path(lm_utils.get_results_filenames(exported(tmp_path))[0]).read_text())
    assert len(results["results"]) == 2 and all(name.startswith("needle_") for name in results["results"])


def test_export_of_a_folder_that_is_not_a_run_is_one_line(capsys, tmp_path):
    code, _, err = invoke(capsys, "export", str(tmp_path), "--out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: not a run folder") and len(err.strip().splitlines()) == 1


def test_export_refuses_a_run_with_no_readable_record_before_writing(capsys, runs, tmp_path):
    import shutil

    bad = shutil.copytree(runs["fake:wrong"], tmp_path / "runs" / runs["fake:wrong"].name)
    (bad / "samples.jsonl").write_bytes(b'{"id": [[[[\n' * 3)
    out = tmp_path / "export"
    code, said, err = invoke(capsys, "export", str(runs["fake"]), str(bad), "--out", str(out))
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and "Traceback" not in err and "written" not in said, err
    assert errors == [f"error: run {bad} holds no readable samples (samples.jsonl is empty, missing or damaged); "
                      "rerun its command"], err
    assert not out.exists()  # not even the good run's files: no partial export


def test_an_errored_sample_counts_as_report_counts_it(runs, tmp_path):
    """A sample that failed with an error is 0 on a higher-is-better metric, as in `report`, not left out."""
    import shutil

    from evalsuite.integrations.lmeval_export import export_runs

    run = shutil.copytree(runs["fake"], tmp_path / "runs" / runs["fake"].name)
    lines = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    lines[0].update(scores={}, error="RuntimeError: the scorer failed")
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    export_runs([run], tmp_path / "export")
    results = json.loads(Path(lm_utils.get_results_filenames(exported(tmp_path / "export"))[0]).read_text())
    assert results["results"]["needle"]["correct_all,none"] == pytest.approx(5 / 6)
    from evalsuite.analysis.frame import run_frame
    from evalsuite.runs.records import open_run

    assert run_frame(open_run(run))["correct_all"].mean() == pytest.approx(5 / 6)  # the frame report reads
