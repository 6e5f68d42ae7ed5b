"""The nolima task: its built-in pairs share no content word with their questions, NoLiMa's
needle-set files load, prompts hold what they should (and never the answer), scoring, and a
run of the toy pair end to end with heatmaps, comparison and effective lengths."""

from __future__ import annotations

import json

import pytest
from nltk.stem import PorterStemmer

from evalsuite.errors import UserError
from evalsuite.tasks.nolima.needles import builtin_data, builtin_pairs, content_words, stop_words
from evalsuite.tasks.nolima.nolima_format import read_needle_set

STEM = PorterStemmer().stem


def stems(text: str) -> set[str]:
    return content_words(text, STEM)


# ---- the built-in set ----------------------------------------------------------------------------------


def test_the_builtin_set_has_forty_pairs_and_unique_ids():
    one = builtin_pairs("onehop")
    assert len(one) >= 40
    assert len({p.id for p in one}) == len(one)
    assert all("{CHAR}" in p.needle and p.question.endswith("?") for p in one)
    assert len(builtin_pairs("twohop")) >= 30


@pytest.mark.parametrize("hops", ["onehop", "twohop"])
def test_no_needle_shares_a_content_word_with_its_question(hops):
    shared = {p.id: stems(p.needle) & stems(p.question) for p in builtin_pairs(hops)}
    assert not {k: v for k, v in shared.items() if v}, shared


def test_no_bridge_shares_a_content_word_with_its_question():
    pairs = builtin_pairs("twohop")
    assert all(p.bridge for p in pairs)
    shared = {p.id: stems(p.bridge) & stems(p.question) for p in pairs}
    assert not {k: v for k, v in shared.items() if v}, shared


def test_two_hops_need_the_bridge():
    """The two-hop needle names a venue instead of the landmark; only the bridge joins them."""
    by_id = {p.id: p for p in builtin_pairs("onehop")}
    landmarks = {item["id"]: item["landmark"] for item in builtin_data()["pairs"] if "landmark" in item}
    for pair in builtin_pairs("twohop"):
        landmark = landmarks[pair.id]
        assert landmark not in pair.needle and landmark in by_id[pair.id].needle and landmark in pair.bridge
        venue_words = stems(pair.bridge) - stems(landmark) - stems("stands right next to")
        assert venue_words and venue_words <= stems(pair.needle)


def test_distractors_repeat_the_question_and_name_no_character():
    characters = builtin_data()["characters"]
    for pair in builtin_pairs("onehop"):
        for distractor in pair.distractors:
            assert stems(distractor) & stems(pair.question), (pair.id, distractor)
            assert not any(name.lower() in distractor.lower().split() for name in characters)


def test_the_overlap_check_catches_shared_words_after_stemming():
    assert stems("Ines lived next to the Atomium.") & stems("Which character lives next to it?") == {"live", "next"}
    assert stems("{CHAR} visited Dresden") & stems("Who has been to dresden?") == {"dresden"}
    assert "the" in stop_words() and not stems("The and of it")
    assert content_words("Kofi's pilot's licence") == {"kofi", "pilot", "licence"}  # a possessive's s left out


def test_no_character_name_is_a_stop_word_or_in_a_question():
    data = builtin_data()
    names = {n.lower() for n in data["characters"]}
    assert len(names) == len(data["characters"]) and not names & stop_words()
    assert not any(names & set(p["question"].lower().replace("?", "").split()) for p in data["pairs"])


# ---- NoLiMa's needle-set format ------------------------------------------------------------------------

NOLIMA_SET = [
    {"id": "0401", "reasoning_type": "world_knowledge", "system_prompt": "ignored",
     "task_template": "ignored {haystack} {question}",
     "needle": "Actually, {CHAR} lives next to the {1}.",
     "questions": {"onehop": "Which character has been to {2}?", "twohop": "Which character has been to {3}?"},
     "character_set": ["Yuki", "Stuart", "Katie"],
     "tests": {"T01": {"input_args": ["Semper Opera House", "Dresden", "the state of Saxony"]},
               "T02": {"input_args": ["Kiasma museum", "Helsinki", "Uusimaa"]}}},
    {"id": "0408", "needle": "{CHAR} cannot eat {1}.", "questions": {"onehop": "Who avoids {2}?"},
     "character_set": ["Megan"], "tests": {"T01": {"input_args": ["dairy", "milk"]}},
     "distractors": {"onehop": "There was a sale on {2} that week."}},
]


def write_set(tmp_path, entries) -> str:
    path = tmp_path / "needle_set.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    return str(path)


def test_a_nolima_needle_set_loads_by_question_kind(tmp_path):
    found = read_needle_set(write_set(tmp_path, NOLIMA_SET))
    assert sorted(found) == ["onehop", "twohop"]
    one = {p.id: p for p in found["onehop"]}
    assert sorted(one) == ["0401-T01", "0401-T02", "0408-T01"]
    assert one["0401-T02"].needle == "Actually, {CHAR} lives next to the Kiasma museum."
    assert one["0401-T02"].question == "Which character has been to Helsinki?"
    assert one["0401-T01"].characters == ("Yuki", "Stuart", "Katie") and one["0401-T01"].distractors == ()
    assert one["0408-T01"].distractors == ("There was a sale on milk that week.",)
    (two,) = [p for p in found["twohop"] if p.id == "0401-T01"]
    assert two.question == "Which character has been to the state of Saxony?" and two.hops == "twohop"


@pytest.mark.parametrize("change, message", [
    (lambda e: e.pop("character_set"), "no character_set"),
    (lambda e: e.update(needle="{1} is closed."), "holding {CHAR}"),
    (lambda e: e.update(questions={"onehop": "Who went to {4}?"}), "{4} but the test gives 3"),
    (lambda e: e.update(tests={"T01": {"args": []}}), "needs input_args"),
])
def test_a_damaged_needle_set_is_one_line_naming_the_entry(tmp_path, change, message):
    entry = json.loads(json.dumps(NOLIMA_SET[0]))
    change(entry)
    with pytest.raises(UserError, match="entry #1") as caught:
        read_needle_set(write_set(tmp_path, [entry]))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_needle_set_that_is_not_a_list_or_not_there(tmp_path):
    with pytest.raises(UserError, match="JSON list"):
        read_needle_set(write_set(tmp_path, {"needle": "x"}))
    with pytest.raises(UserError, match="not found"):
        read_needle_set(str(tmp_path / "missing.json"))


# ---- the task: plan, prompts, scoring ------------------------------------------------------------------

def nolima(**params: str):
    from evalsuite.engine.runner import make_task

    return make_task("nolima", params)


def test_the_plan_is_deterministic_and_pairs_each_index_across_cells():
    task = nolima(lengths="256,512", depths="0,1", samples="3")
    first, again = list(task.plan(None)), list(task.plan(None))
    assert [s.id for s in first] == [s.id for s in again] and len(first) == 2 * 2 * 2 * 3
    assert len({s.id for s in first}) == len(first)
    for hops in ("onehop", "twohop"):
        by_index: dict[str, set] = {}
        for sample in (s for s in first if s.axes["hops"] == hops):
            by_index.setdefault(sample.id[-3:], set()).add((sample.data["pair"], sample.target))
        assert all(len(kept) == 1 for kept in by_index.values())  # one pair and character per index
        assert len({next(iter(kept))[0] for kept in by_index.values()}) == 3  # distinct pairs
    assert all(s.data["bridge"] for s in first if s.axes["hops"] == "twohop")
    assert not any(s.data["bridge"] for s in first if s.axes["hops"] == "onehop")
    assert all(s.target[0] in s.data["needle"] for s in first)
    assert [s.id for s in nolima(seed="1", lengths="256").plan(None)] != [s.id for s in task.plan(None)]


def test_a_prompt_holds_its_length_the_needle_at_its_depth_and_no_answer_outside_the_needle():
    from evalsuite.backends import load_model

    model = load_model("fake:echo", {}, "cpu")
    task = nolima(lengths="1500", depths="0,0.5,1", samples="2", hops="twohop", distractors="2")
    state = task.prepare(model)
    for sample in task.plan(state):
        (request,), info = task.requests(sample, model, state)
        data = sample.data
        assert abs(info["prompt_tokens"] - (1500 - 12)) <= 15 and request.max_new_tokens == 12
        assert abs(info["measured_depth"] - sample.axes["depth"]) < 0.06
        assert request.prompt.count(data["needle"]) == 1 and request.prompt.count(data["bridge"]) == 1
        assert all(d in request.prompt for d in data["distractors"]) and len(data["distractors"]) == 2
        name = sample.target[0]
        assert request.prompt.replace(data["needle"], "").lower().count(name.lower()) == 0
        assert request.prompt.rstrip().endswith(f"Question: {data['question']}\nAnswer:")


@pytest.mark.parametrize("output, right", [
    (" Ines", True), (" INES.", True), (" The character is Ines, I think", True), (" ines", True),
    (" Inesa", False), (" Agnes", False), (" Tobias", False), ("", False),
])
def test_the_name_counts_as_a_whole_word_in_any_case(output, right):
    sample = next(iter(nolima(lengths="256", depths="0", samples="1").plan(None)))
    sample = type(sample)(id=sample.id, task=sample.task, axes=sample.axes, target=("Ines",), data=sample.data)
    assert nolima().score(sample, [output]) == {"correct": right}


def test_hop_kinds_a_needle_set_lacks_are_one_line(tmp_path):
    with pytest.raises(UserError, match="the built-in set has onehop and twohop, not threehop"):
        list(nolima(hops="threehop").plan(None))
    with pytest.raises(UserError, match="has no twohop questions; it has onehop"):
        list(nolima(needle_set=write_set(tmp_path, NOLIMA_SET[1:]), hops="twohop").plan(None))


def test_a_nolima_file_runs_as_the_needle_set(tmp_path):
    task = nolima(needle_set=write_set(tmp_path, NOLIMA_SET), lengths="256", depths="0.5", samples="4",
                  hops="onehop")
    samples = list(task.plan(None))
    assert {s.data["pair"] for s in samples} == {"0401-T01", "0401-T02", "0408-T01"}
    assert all(s.target[0] in ("Yuki", "Stuart", "Katie", "Megan") for s in samples)
    assert any(s.data["distractors"] == ["There was a sale on milk that week."] for s in samples)


# ---- end to end: two models, heatmaps, the comparison and both effective lengths ----------------------

def test_two_models_run_end_to_end_with_heatmaps_comparison_and_effective_lengths(tmp_path, capsys, tiny_models):
    from conftest import invoke

    done = invoke(capsys, "run", "--model", str(tiny_models["diff"]), "--model", str(tiny_models["base"]),
                  "--task", "nolima", "-T", "lengths=256,384", "-T", "depths=0,1", "-T", "samples=2",
                  "-T", "tokens=4", "--out", str(tmp_path), "--no-progress")
    assert done.code == 0, done.err
    runs = sorted(tmp_path.glob("nolima-*"))
    assert len(runs) == 2
    for run in runs:
        assert sorted(p.name for p in (run / "plots").iterdir()) == ["heatmap_onehop.png", "heatmap_twohop.png"]
        assert json.loads((run / "summary.json").read_text())["n"] == 16
    (folder,) = tmp_path.glob("compare-nolima-*")
    drawn = {p.name for p in folder.glob("*.png")}
    assert {"heatmap_pair_onehop.png", "heatmap_diff_onehop.png", "heatmap_pair_twohop.png",
            "heatmap_diff_twohop.png"} <= drawn
    found = json.loads((folder / "comparison.json").read_text())["effective_length"]
    assert found["a"]["lengths"] == [256, 384] and found["n"] == 16
    text = (folder / "comparison.md").read_text()
    assert "## Effective length" in text and "| tiny-diff |" in text and "| tiny-diff minus tiny-base |" in text
    reported = invoke(capsys, "report", *map(str, runs), "--no-plots")
    assert reported.out.count("### Effective length: ") == 2


# ---- the long-context suite ------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["tiny", "quick", "full"])
def test_the_long_context_suite_loads_at_every_scale(scale):
    from evalsuite.engine.suites import SuiteSettings, load_suite

    suite = load_suite("long-context", settings=SuiteSettings(scale=scale))
    by_name = {e.name: e for e in suite.entries}
    assert [e.task.name for e in suite.entries] == ["needle", "nolima", "ruler", "ruler", "ruler"]
    lengths = {name: by_name[name].task.lengths for name in ("needle", "nolima", "ruler")}
    assert lengths["needle"] == lengths["nolima"] and all(e.clip == "lengths" for e in suite.entries)
    assert by_name["nolima"].task.hops == ("onehop", "twohop") and by_name["nolima"].task.distractors == 1
    if scale == "tiny":  # the toy models on a CPU
        assert max(max(v) for v in lengths.values()) <= 1024
    assert by_name["ruler-essays"].optional and "DIR/ruler/essays" in by_name["ruler-essays"].missing
    assert suite.scale == scale
