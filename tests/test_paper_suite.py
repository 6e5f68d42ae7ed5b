"""The diff-paper suite and the report shaped like the paper.

- the published-number table equals the numbers in docs/paper-reference.md, both ways;
- suite scales, {data_dir}, optional entries skipped with one line, run-step options for suites,
  clipping to the context: on scripted models and a small suite (fast);
- the paper report from those runs: every section present or saying in one line why not (fast);
- the whole shipped suite on the built-in toy models with local data in the documented layout,
  and without --data-dir offline (slow: minutes on a CPU).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import invoke
from paper_data import write_paper_data

from evalsuite.analysis.paper import BUILDERS, write_paper_report
from evalsuite.analysis.paper.published import DIFF, GAIN, PUBLISHED, TRANSFORMER
from evalsuite.engine.suite_scales import SuiteSettings, clipped
from evalsuite.engine.suites import check_needs, load_suite
from evalsuite.errors import UserError

REFERENCE = Path(__file__).parents[1] / "docs" / "paper-reference.md"
SECTION_TITLES = ["Multi-needle retrieval at 4K", "Needle retrieval up to 64K", "Attention allocation",
                  "Cumulative NLL by position", "accuracy against shots", "spread over demonstration orders",
                  "Contextual hallucination", "Zero-shot accuracy against attention bits", "Activation outliers"]


# ---- the published numbers against the reference text ------------------------------------------

NUMBER = r"(\d+(?:\.\d+)?)"
PAIR = rf"{NUMBER}/{NUMBER}"


def _sentence(text: str, start: str) -> str:
    """The bullet item (or paragraph) of the reference holding `start`, from `start` on, on one line."""
    index = text.index(start)
    end = re.search(r"\n(- |\n)", text[index:])
    return " ".join(text[index: index + (end.start() if end else len(text))].split())


def parsed_reference() -> set[tuple[str, str, str, object]]:
    """(section, label, column, value) for every number of the paper's 3B results in the reference."""
    text = REFERENCE.read_text(encoding="utf-8")
    found: set[tuple[str, str, str, object]] = set()

    def pair(section: str, label: str, transformer: str, diff: str) -> None:
        found.update({(section, label, TRANSFORMER, float(transformer)), (section, label, DIFF, float(diff))})

    four_k = _sentence(text, "4K setting:")
    settings = re.findall(r"\((\d+),(\d+)\)", four_k)
    for (n, r), (t, d) in zip(settings, re.findall(PAIR, four_k.split("Transformer vs DIFF:")[1])):
        pair("needle-4k", f"N={n}, R={r}", t, d)
    long = _sentence(text, "Average accuracy at 64K:")
    (t, d), = re.findall(rf"{NUMBER} \(Transformer\) vs {NUMBER} \(DIFF\)", long)
    pair("needle-64k", "average at 64K", t, d)
    (t, d), = re.findall(rf"64K: {NUMBER} vs {NUMBER}", long.split("at 25% depth")[1])
    pair("needle-64k", "25% depth at 64K", t, d)
    allocation = _sentence(text, "Transformer: answer").split("For DIFF the scores")[0]
    answers = re.findall(rf"answer {NUMBER}[–-]{NUMBER}", allocation)
    noises = re.findall(rf"noise (?:about )?{NUMBER}(?:[–-]{NUMBER})?", allocation)
    found.update({("attention", "answer span", TRANSFORMER, (float(answers[0][0]), float(answers[0][1]))),
                  ("attention", "answer span", DIFF, (float(answers[1][0]), float(answers[1][1]))),
                  ("attention", "noise context", TRANSFORMER, float(noises[0][0])),
                  ("attention", "noise context", DIFF, (float(noises[1][0]), float(noises[1][1])))})
    assert len(answers) == len(noises) == 2 and noises[0][1] == ""
    gains = _sentence(text, "Gains of DIFF over Transformer")
    for name, value in re.findall(rf"([A-Z][\w-]*?(?:-\d+)?) \+{NUMBER}", gains):
        found.add(("icl", name, GAIN, float(value)))
    trec = _sentence(text, "TREC with random order:")
    (t, d), = re.findall(rf"random order: Transformer {NUMBER} vs DIFF {NUMBER}", trec)
    pair("icl-order", "TREC random order", t, d)
    (t, d), = re.findall(rf"by class: {NUMBER} vs {NUMBER}", _sentence(text, "alternating by"))
    pair("icl-order", "TREC alternating by class", t, d)
    for name, t, d in re.findall(rf"([A-Z][\w-]*?(?:-\d+)?) {PAIR}", _sentence(text, "Random order on TREC-fine")):
        pair("icl-order", f"{name} random order", t, d)
    hallucination = _sentence(text, "- Accuracy, Transformer vs DIFF: XSum")
    for name, t, d in re.findall(rf"([\w/]+) {PAIR}", hallucination):
        pair("hallucination", name, t, d)
    outliers = _sentence(text, "Transformer vs DIFF, attention logits")
    logits, hidden = outliers.split("hidden states")
    for kind, part in (("attention logits", logits), ("hidden states", hidden)):
        (t1, d1), = re.findall(rf"top-1 {NUMBER} vs {NUMBER}", part)
        (tm, dm), = re.findall(rf"median {NUMBER} vs {NUMBER}", part)
        pair("outliers", f"{kind} top-1", t1, d1)
        pair("outliers", f"{kind} median", tm, dm)
    quantized = _sentence(text, "4-bit DIFF is about")
    found.add(("zeroshot", "4-bit attention (about)", GAIN, float(re.search(rf"about {NUMBER} points", quantized)[1])))
    (t, d), = re.findall(rf"Transformer {NUMBER}, DIFF {NUMBER}", _sentence(text, "3B models, 350B tokens"))
    pair("zeroshot", "zero-shot average (7 tasks)", t, d)
    return found


def table_numbers() -> set[tuple[str, str, str, object]]:
    return {(p.section, p.label, column, value) for p in PUBLISHED for column, value in p.values.items()}


def test_every_published_number_equals_the_reference_text_both_ways():
    from_text, from_table = parsed_reference(), table_numbers()
    assert from_table - from_text == set(), "in evalsuite's table but not in docs/paper-reference.md"
    assert from_text - from_table == set(), "in docs/paper-reference.md but not in evalsuite's table"
    assert len(from_table) == 53


def test_the_reference_is_the_projects_copy_of_the_paper_protocols():
    text = REFERENCE.read_text(encoding="utf-8")
    assert "Differential Transformer" in text and "0.35/0.85" in text and "318.0 vs 38.8" in text


# ---- the suite format: scales, data_dir, optional entries, run-step options -----------------------

SUITE = """
name = "mini-paper"
default_scale = "quick"

[[run]]
task = "needle"
name = "needle-4k"
clip_to_context = "lengths"
[run.params]
lengths = [2048, 100000]
needles = [1, 2]
queries = [1, 2]
[run.scale.quick]
samples = 1
depths = [0, 1]
[run.scale.paper]
samples = 3

[[run]]
task = "icl"
name = "icl-trec"
optional = true
[run.params]
dataset = "trec"
data = "{data_dir}/icl/trec.jsonl"
shots = [1, 2]
test_size = 4
permutations = 2
[run.without_data]
data = ""

[[run]]
task = "hallucination"
name = "hallucination-xsum"
optional = true
needs_option = "judge"
[run.params]
dataset = "xsum"
data = "{data_dir}/hallucination/xsum.jsonl"
samples = 3
"""


@pytest.fixture
def mini_suite(tmp_path) -> Path:
    path = tmp_path / "mini.toml"
    path.write_text(SUITE)
    return path


def test_scales_override_params_and_the_default_scale_applies(mini_suite):
    quick = load_suite(mini_suite)
    assert quick.scale == "quick" and quick.entries[0].task.samples == 1 and quick.entries[0].task.depths == (0, 1)
    paper = load_suite(mini_suite, settings=SuiteSettings(scale="paper"))
    assert paper.entries[0].task.samples == 3 and paper.entries[0].task.depths == (0, 0.25, 0.5, 0.75, 1)
    with pytest.raises(UserError, match=r"unknown scale of suite mini-paper 'quik' \(did you mean 'quick'\?\)"):
        load_suite(mini_suite, settings=SuiteSettings(scale="quik"))
    with pytest.raises(UserError, match="has no scales"):
        load_suite("ci-smoke", settings=SuiteSettings(scale="quick"))


def test_data_dir_files_replace_hub_data_and_missing_needs_are_found_before_running(mini_suite, tmp_path):
    data = write_paper_data(tmp_path / "data")
    with_data = load_suite(mini_suite, settings=SuiteSettings(data_dir=data, step={"judge": "lexical"}))
    icl, hallucination = with_data.entries[1:]
    assert icl.task.data == str((data / "icl" / "trec.jsonl").resolve()) and icl.missing is None
    assert hallucination.missing is None
    without = load_suite(mini_suite)
    assert without.entries[1].task.data == "" and without.entries[1].missing is None  # falls back to the hub
    assert without.entries[2].missing.startswith("give --data-dir DIR holding DIR/hallucination/xsum.jsonl")
    no_judge = load_suite(mini_suite, settings=SuiteSettings(data_dir=data))
    assert "give --judge" in no_judge.entries[2].missing


def test_offline_without_data_optional_entries_are_skipped_with_one_line_each(mini_suite, capsys):
    kept = check_needs(load_suite(mini_suite))
    assert [e.name for e in kept.entries] == ["needle-4k"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("skipped '") for line in err)
    assert "or give --data-dir DIR holding DIR/icl/trec.jsonl" in err[0]  # the hub is offline in tests
    assert "give --data-dir DIR holding DIR/hallucination/xsum.jsonl" in err[1]


def test_an_entry_that_is_not_optional_fails_the_suite_before_it_runs(tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text('[[run]]\ntask = "nll"\n[run.params]\ndata = "{data_dir}/nll"\n')
    with pytest.raises(UserError, match=r"run 'nll': give --data-dir DIR holding DIR/nll"):
        load_suite(path)


@pytest.mark.parametrize("text, message", [
    ('[[run]]\ntask = "needle"\noptional = "yes"\n', "optional must be true or false"),
    ('[[run]]\ntask = "needle"\nclip_to_context = "depths"\n', "'depths', which is not a list of lengths"),
    ('[[run]]\ntask = "needle"\nclip_to_context = "lenghts"\n', "(did you mean 'lengths'?)"),
    ('[[run]]\ntask = "needle"\n[run.scale]\nquick = 3\n', "[run.scale.quick] must be a table"),
    ('default_scale = 3\n[[run]]\ntask = "needle"\n[run.scale.quick]\nsamples = 1\n', "default_scale must be"),
])
def test_bad_entry_keys_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        load_suite(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_lengths_over_the_context_are_left_out_with_a_note(mini_suite):
    entry = load_suite(mini_suite).entries[0]
    task, note = clipped(entry.task, entry.clip, 4096)
    assert task.lengths == (2048,) and note == "lengths 100000 left out: over the model's context of 4096 tokens"
    assert clipped(entry.task, entry.clip, 1 << 20) == (entry.task, None)
    assert clipped(entry.task, None, 10)[0] is entry.task


def test_judge_options_of_a_suite_reach_the_entries_that_take_them(mini_suite, tmp_path, capsys):
    data = write_paper_data(tmp_path / "data")
    out = tmp_path / "res"
    code, stdout, err = invoke(capsys, "run", "--suite", str(mini_suite), "--model", "fake", "--model", "fake:wrong",
                               "--data-dir", str(data), "--judge", "lexical", "--out", str(out), "--no-progress",
                               "-M", "max_context=8192")
    assert code == 0, err
    assert "note: needle-4k on fake-oracle: lengths 100000 left out" in err
    result = json.loads((out / "suite-mini-paper-fake-oracle.json").read_text())
    assert [r["name"] for r in result["runs"]] == ["needle-4k", "icl-trec", "hallucination-xsum"]
    assert result["scale"] == "quick" and result["skipped"] == [] and "note" in result["runs"][0]
    judged = out / result["runs"][2]["run"] / "judgements"
    assert judged.is_dir() and any(judged.iterdir())
    code, _, err = invoke(capsys, "run", "--suite", str(mini_suite), "--model", "fake", "--out", str(out),
                          "--scale", "paper", "--data-dir", str(data), "--no-progress", "-M", "max_context=8192")
    assert code == 0, err  # another scale into the same folder: the result file says so as it is replaced
    assert "note: suite-mini-paper-fake-oracle.json listed the runs of fake at scale quick; it now lists fake " \
           "at scale paper" in err
    assert json.loads((out / "suite-mini-paper-fake-oracle.json").read_text())["scale"] == "paper"
    code, _, err = invoke(capsys, "run", "--suite", str(mini_suite), "--model", "fake", "--out", str(out),
                          "--scale", "paper", "--task", "needle")
    assert code == 2 and "--suite sets the tasks" in err
    code, _, err = invoke(capsys, "run", "--task", "needle", "--model", "fake", "--out", str(out), "--scale", "quick")
    assert code == 2 and "--scale and --data-dir are for --suite" in err


def test_a_dry_run_plans_the_chosen_scale_clipped_entries_and_data_dir(mini_suite, tmp_path, capsys):
    data = write_paper_data(tmp_path / "data")
    out = tmp_path / "res"
    plans = {}
    for scale in ("quick", "paper"):
        code, stdout, err = invoke(capsys, "run", "--suite", str(mini_suite), "--model", "fake", "--scale", scale,
                                   "--data-dir", str(data), "-M", "max_context=8192", "--out", str(out), "--dry-run")
        assert code == 0, err
        plans[scale] = stdout
        assert "skipped 'hallucination-xsum' (hallucination)" in err  # no --judge: left out, one line
    # quick: 1 sample per cell over depths 0 and 1; paper: 3 per cell over the default depths; the
    # 100000-token length is left out as the run leaves it out, so neither plan is refused
    assert "needle on fake-oracle: 4 samples in 4 cells (1 per cell)" in plans["quick"]
    assert "needle on fake-oracle: 30 samples in 10 cells (3 per cell)" in plans["paper"]
    assert "context_length=100000" not in plans["paper"]
    assert "icl on fake-oracle: 16 samples in 4 cells" in plans["quick"]  # its data came from --data-dir
    assert not out.exists()
    code, _, err = invoke(capsys, "run", "--task", "needle", "--model", "fake", "--scale", "quick", "--dry-run")
    assert code == 2 and "--scale and --data-dir are for --suite" in err


# ---- the paper report ------------------------------------------------------------------------------


def test_the_paper_report_has_every_section_and_says_why_one_is_absent(mini_suite, tmp_path, capsys):
    data = write_paper_data(tmp_path / "data")
    out = tmp_path / "res"
    code, _, err = invoke(capsys, "run", "--suite", str(mini_suite), "--model", "fake:wrong", "--model", "fake",
                          "--data-dir", str(data), "--judge", "lexical", "--out", str(out), "--no-progress")
    assert code == 0, err
    code, stdout, err = invoke(capsys, "report", "--paper", str(out), "--out", str(tmp_path / "paper.html"))
    assert code == 0, err
    html = (tmp_path / "paper.html").read_text()
    markdown = (tmp_path / "paper.md").read_text()
    assert len(BUILDERS) == len(SECTION_TITLES)
    for title in SECTION_TITLES:
        assert title in html and title in markdown
    assert "baseline fake-wrong, compared with fake-oracle" in markdown
    assert "fake-oracle above fake-wrong at 2 of 2 (N, R) settings" in markdown
    assert "0.35" in markdown and "0.85" in markdown  # the paper's N=6, R=2 numbers, beside the table
    assert markdown.count("_not run") == 5  # 64K, attention, NLL, zero-shot, outliers
    assert "Needle retrieval up to 64K" in stdout and "paper report:" in stdout


def test_paper_report_bad_input_is_one_line(tmp_path, capsys):
    code, _, err = invoke(capsys, "report", "--paper", str(tmp_path))
    assert code == 2 and "no suite results in" in err and len(err.strip().splitlines()) == 1
    code, _, err = invoke(capsys, "report", "--out", str(tmp_path / "x.html"))
    assert code == 2 and "go with --paper" in err
    code, _, err = invoke(capsys, "report")
    assert code == 2 and "give run folders" in err
    with pytest.raises(UserError, match="not a results folder|is not one"):
        write_paper_report(tmp_path / "missing")


# ---- the shipped suite on the toy models ----------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_suite_runs_on_the_toy_models_and_the_report_has_every_section(tmp_path, capsys):
    """Done when: `evalsuite run --suite diff-paper --scale tiny --model toy-base --model toy-diff
    --data-dir DIR --judge lexical` completes on the CPU, and the paper report has every section;
    then, offline without --data-dir, the entries that need no download run (here: found finished)
    and each skipped entry gets one line."""
    data = write_paper_data(tmp_path / "data")
    out = tmp_path / "res"
    common = ["run", "--suite", "diff-paper", "--scale", "tiny", "--model", "toy-base", "--model", "toy-diff",
              "--out", str(out), "--no-progress", "--device", "cpu"]
    code, stdout, err = invoke(capsys, *common, "--data-dir", str(data), "--judge", "lexical")
    assert code == 0, err
    assert "skipped" not in stdout + err
    result = json.loads((out / "suite-diff-paper-toy-diff.json").read_text())
    assert len(result["runs"]) == 16 and result["skipped"] == []
    code, stdout, err = invoke(capsys, "report", "--paper", str(out))
    assert code == 0, err
    markdown = (out / "paper-report.md").read_text()
    assert "_not run" not in markdown
    for title in SECTION_TITLES:
        assert title in markdown
    assert markdown.count("**Reading:**") == len(SECTION_TITLES) and "nothing to compare" not in markdown
    assert "toy-diff above toy-base at" in markdown and "toy-diff below toy-base at" in markdown

    code, stdout, err = invoke(capsys, *common)  # offline, no --data-dir, no judge
    assert code == 0, err
    skipped = [line for line in err.splitlines() if line.startswith("skipped '")]
    assert len(skipped) == 12  # nll, four ICL datasets, six hallucination datasets, zero-shot
    assert sum("give --judge" in line for line in skipped) == 6
    assert all("--data-dir" in line for line in skipped if "give --judge" not in line)
    assert stdout.count("skipped ") == 12  # the run's summary lists them again
    result = json.loads((out / "suite-diff-paper-toy-diff.json").read_text())
    assert [r["name"] for r in result["runs"]] == ["needle-4k", "needle-64k", "attention", "outliers"]
