"""Suites: TOML files of task configurations, validated up front, run as one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.engine.suites import SHIPPED, find_suite, load_suite
from evalsuite.errors import UserError
from evalsuite.registry import TASKS, load_all
from evalsuite.runs.suite_result import run_folders, suite_runs

NEEDLE_SUITE = """
name = "mini"
description = "two needle settings"

[[run]]
task = "needle"
name = "short"
[run.params]
lengths = [1024]
depths = [0, 0.5]
samples = 2

[[run]]
task = "needle"
name = "long"
limit = 3
[run.params]
lengths = [2048]
depths = [1.0]
samples = 4
tokens_per_query = 12
"""


def write(tmp_path, text: str, name: str = "suite.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_suite_file_becomes_validated_task_objects(tmp_path):
    suite = load_suite(write(tmp_path, NEEDLE_SUITE))
    assert suite.name == "mini" and suite.description == "two needle settings"
    short, long = suite.entries
    assert (short.name, short.task.lengths, short.task.depths, short.task.samples, short.limit) == \
        ("short", (1024,), (0.0, 0.5), 2, None)
    assert (long.name, long.task.lengths, long.task.tokens_per_query, long.limit) == ("long", (2048,), 12, 3)


def test_suite_dir_names_data_beside_the_suite(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "book.txt").write_text("A sentence. " * 50)
    text = '[[run]]\ntask = "needle"\n[run.params]\nhaystack = "{suite_dir}/data/book.txt"\nlengths = [64]\n'
    (entry,) = load_suite(write(tmp_path, text)).entries
    assert entry.task.haystack == str((tmp_path / "data" / "book.txt").resolve())
    assert entry.name == "needle"  # the task's name when none is given


def test_seed_applies_where_the_suite_sets_none(tmp_path):
    text = NEEDLE_SUITE.replace("samples = 4", "samples = 4\nseed = 7")
    short, long = load_suite(write(tmp_path, text), seed=3).entries
    assert (short.task.seed, long.task.seed) == (3, 7)


@pytest.mark.parametrize("text, message", [
    ('nmae = "x"\n[[run]]\ntask = "needle"\n', "unknown key 'nmae' (did you mean 'name'?)"),
    ('[[run]]\ntask = "needle"\nlimt = 3\n', "[[run]] #1: unknown key 'limt' (did you mean 'limit'?)"),
    ('[[run]]\ntask = "needle"\n[run.params]\nlenghts = [64]\n', "run 'needle': unknown -T key for needle "
                                                                  "'lenghts' (did you mean 'lengths'?)"),
    ('[[run]]\ntask = "neddle"\n', "run 'neddle': unknown task 'neddle' (did you mean 'needle'?)"),
    ('[[run]]\ntask = "needle"\n[run.params]\nsamples = "many"\n', "'many' is not a valid int"),
    ('[[run]]\ntask = "needle"\n[run.params]\ndepths = [2]\n', "depths must be fractions between 0 and 1"),
    ('[[run]]\ntask = "needle"\n[run.params]\nhaystack = "{suite_dir}/nope.txt"\n', "nope.txt does not exist"),
    ('[[run]]\ntask = "needle"\n[run.params]\nlengths = {a = 1}\n', "values must be numbers, booleans"),
    ('[[run]]\ntask = "needle"\nlimit = 0\n', "limit must be a positive integer"),
    ('[[run]]\nname = "x"\n', 'needs task = "<task name>"'),
    ('[[run]]\ntask = "needle"\n[[run]]\ntask = "needle"\n', "runs named needle more than once"),
    ('name = "empty"\n', "suite empty lists no runs"),
    ('[[run]\ntask = "needle"\n', "is not valid TOML"),
])
def test_bad_suites_fail_with_one_clear_line(tmp_path, text, message):
    with pytest.raises(UserError) as caught:
        load_suite(write(tmp_path, text))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_suites_are_found_by_file_or_shipped_name(tmp_path):
    assert find_suite("ci-smoke") == SHIPPED / "ci-smoke.toml"
    with pytest.raises(UserError, match=r"unknown suite .* 'ci-smok' \(did you mean 'ci-smoke'\?\)"):
        find_suite("ci-smok")
    with pytest.raises(UserError, match="suite file not found"):
        find_suite(tmp_path / "missing.toml")


def test_ci_smoke_is_valid_for_every_task_installed_with_its_data(tmp_path):
    """ci-smoke lists needle, icl and zeroshot; an entry whose task or shipped data file
    is not (yet) present fails loading with an error that names that entry."""
    load_all()
    try:
        suite = load_suite("ci-smoke")
    except UserError as exc:
        failing = re.match(r"suite ci-smoke, run '(\w+)'", str(exc))
        assert failing, str(exc)
        assert failing.group(1) in {"icl", "zeroshot"}
        assert failing.group(1) not in TASKS or "does not exist" in str(exc)
    else:
        assert [e.task.name for e in suite.entries] == ["needle", "icl", "zeroshot"]
    text = (SHIPPED / "ci-smoke.toml").read_text()
    needle_only = text[: text.index("[[run]]\ntask = \"icl\"")]
    (entry,) = load_suite(write(tmp_path, needle_only)).entries
    assert entry.task.lengths == (512, 1024) and len(list(entry.task.plan(entry.task.prepare(None)))) == 40


def test_run_suite_writes_runs_and_a_result_file_and_resumes(tmp_path, capsys):
    suite = write(tmp_path, NEEDLE_SUITE)
    out = tmp_path / "res"
    args = ["run", "--suite", str(suite), "--model", "fake", "--out", str(out), "--no-progress"]
    code, stdout, err = invoke(capsys, *args)
    assert code == 0, err
    result = out / "suite-mini-fake-oracle.json"
    data = json.loads(result.read_text())
    assert (data["format"], data["suite"], data["model"]) == ("evalsuite-suite-result", "mini", "fake-oracle")
    assert [r["name"] for r in data["runs"]] == ["short", "long"]
    assert data["runs"][0]["overall"]["correct_all"] == 1.0
    runs = suite_runs(result)
    lines = [sum(1 for _ in open(folder / "samples.jsonl")) for _, folder in runs]
    assert lines == [4, 3]  # the long entry's limit = 3
    assert run_folders([result]) == [folder for _, folder in runs]
    before = result.read_text()
    assert invoke(capsys, *args)[0] == 0  # the same command again: everything is already done
    assert result.read_text() == before
    assert [sum(1 for _ in open(folder / "samples.jsonl")) for _, folder in runs] == [4, 3]


def test_run_suite_on_two_models_compares_each_entry(tmp_path, capsys):
    suite = write(tmp_path, NEEDLE_SUITE)
    code, stdout, err = invoke(capsys, "run", "--suite", str(suite), "--model", "fake", "--model", "fake:wrong",
                               "--out", str(tmp_path / "res"), "--no-progress", "--limit", "2")
    assert code == 0, err
    assert stdout.count("comparison ") == 2
    folders = sorted((tmp_path / "res").glob("compare-needle-fake-oracle-vs-fake-wrong-*"))
    assert len(folders) == 2 and all((f / "heatmap_diff.png").is_file() for f in folders)
    # the two suite results compare run by run, like the two models did
    results = [str(tmp_path / "res" / f"suite-mini-{m}.json") for m in ("fake-oracle", "fake-wrong")]
    code, stdout, err = invoke(capsys, "compare", *results, "--out", str(tmp_path / "again"))
    assert code == 0, err
    assert stdout.count("# needle: fake-oracle vs fake-wrong") == 2
    assert len(list((tmp_path / "again").glob("compare-*/comparison.md"))) == 2


@pytest.mark.parametrize("args, message", [
    (["--suite", "{suite}", "--task", "needle"], "--suite sets the tasks"),
    (["--suite", "{suite}", "-T", "samples=2"], "--suite sets the tasks"),
    ([], "give --task NAME"),
    (["--suite", "ci-smok"], "did you mean 'ci-smoke'"),
])
def test_run_suite_bad_arguments(tmp_path, capsys, args, message):
    suite = write(tmp_path, NEEDLE_SUITE)
    filled = [a.format(suite=suite) for a in args]
    code, _, err = invoke(capsys, "run", "--model", "fake", *filled, "--out", str(tmp_path / "res"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_need_of_a_later_entry_stops_the_suite_before_its_first_entry(tmp_path, capsys, monkeypatch):
    """ci-smoke's zeroshot entry needs lm-eval: without it the suite stops before its needle entry runs."""
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails, as where it is not installed
    out = tmp_path / "res"
    code, _, err = invoke(capsys, "run", "--suite", "ci-smoke", "--model", "fake", "--out", str(out), "--no-progress")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "suite ci-smoke, run 'zeroshot'" in err and "pip install 'evalsuite[lmeval]'" in err
    assert not list(out.glob("needle-*")) and not list(out.glob("icl-*"))


def test_the_example_workflow_installs_what_ci_smoke_needs():
    """docs/ci-workflow.yml runs ci-smoke, whose zeroshot entry needs the lmeval extra."""
    workflow = (Path(__file__).parents[1] / "docs" / "ci-workflow.yml").read_text()
    assert "--suite ci-smoke" in workflow
    assert "zeroshot" in [e.task.name for e in load_suite("ci-smoke").entries]
    assert re.search(r"pip install (-c constraints.txt )?[\"']?\.\[lmeval\]", workflow)


def test_a_folder_is_no_suite(tmp_path):
    with pytest.raises(UserError, match="is a folder; give a suite file"):
        find_suite(tmp_path)


@pytest.mark.parametrize("scale", ["tiny", "quick", "paper"])
def test_the_diff_paper_suite_is_valid_at_every_scale(scale, tmp_path):
    """Every entry of the shipped paper suite loads at each scale; without --data-dir and a judge the
    entries that need them are marked with what to provide, and none fails loading."""
    from evalsuite.engine.suites import SuiteSettings

    load_all()
    suite = load_suite("diff-paper", settings=SuiteSettings(scale=scale))
    assert suite.scale == scale and len(suite.entries) == 16
    needs = {e.name: e.missing for e in suite.entries if e.missing}
    assert set(needs) == {"nll", *(e.name for e in suite.entries if e.task.name == "hallucination")}
    assert all(e.optional for e in suite.entries if e.name in needs)
    samples = {e.name: getattr(e.task, "samples", None) for e in suite.entries}
    assert samples["needle-4k"] == {"tiny": 1, "quick": 10, "paper": 50}[scale]
    assert suite.entries[0].task.needles == (1, 2, 4, 6) and suite.entries[0].task.queries == (1, 2, 2, 2)
