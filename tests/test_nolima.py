"""The nolima task: its built-in pairs share no content word with their questions, NoLiMa's
needle-set files load, the built-in story names people and a user's text is filtered, prompts hold
what they should (and never the answer), the strict scorer and NoLiMa's `contains`, the
mismatched-question control and the question-blind rules, and runs end to end (the toy pair with
heatmaps, comparison and effective lengths; toy-base with the control in its report)."""

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
        (request, other), info = task.requests(sample, model, state)
        data = sample.data
        assert abs(info["prompt_tokens"] - (1500 - 32)) <= 15 and request.max_new_tokens == other.max_new_tokens == 32
        # the mismatched question is asked over the very same haystack
        assert other.prompt == request.prompt.replace(data["question"], data["mismatch"])
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
    assert nolima().score(sample, [output, "None."])["correct"] is right


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


# ---- the strict scorer, NoLiMa's `contains` and the mismatched question's "none" ------------------------

def known_names() -> set[str]:
    from evalsuite.tasks.nolima.story import cast_names

    return {*builtin_data()["characters"], *cast_names()}


@pytest.mark.parametrize("output", [
    "Tobias.", " Tobias", "The character is Tobias.", "Tobias has been to Brussels.", "TOBIAS", " tobias",
    "The character is Tobias, I think.", "Probably Tobias.", "It's Tobias, not Hana.", "Not Hana, Tobias.",
    "Hana? No \u2014 Tobias.", "Tobias, who lives next to the Atomium.", "Answer: Tobias", "**Tobias**",
    "Based on the passage, the character who has been to Brussels is Tobias.",  # a chat model's restatement
    "Which character has been to Brussels? Tobias.", "Tobias. No one else.", "Tobias, no doubt.",
    "Hana's neighbour, Tobias.", "Tob\u00edas.", "Tobias lives next to the Atomium, so Tobias.", "No one but Tobias.",
    "Tobias, rather than Hana.", "Tobias (the Atomium is in Brussels).",
])
def test_the_strict_reader_credits_one_name_given_as_the_answer(output):
    from evalsuite.tasks.nolima.answers import named

    assert named(output, "Tobias", known_names())


@pytest.mark.parametrize("output", [
    "Not Tobias.", "Tobias? No, I don't know.", "Either Tobias or Hana.",  # negated, retracted, hedged
    "Ines, Tobias, Mireille, Kofi, Anneke, Ravi, Solveig, Dmitri",  # a list of eight names
    "Tobias?", "Tobias or Hana", "Tobias and Hana.", "Tobias/Hana", "Tobias or someone else", "Maybe Tobias.",
    "It could be Tobias.", "Tobias, but I'm not sure.", "I don't know. Perhaps Tobias.", "Not only Tobias but also Hana.",
    "None.", "None of them. Tobias lives next to the Atomium.", "None, but Tobias lives next to the Atomium.",
    "Tobias is not the answer.", "It isn't Tobias.", "The character is not Tobias.", "Tobias is wrong; it is Hana.",
    "Tobias \u2014 wait, that's wrong. Hana.", "Tobias. Actually, Hana.", "Tobias, Greta and Kemal",  # story people
    "Hana.", "Kemal.", "Tobiasz", "",
])
def test_the_strict_reader_refuses_negated_hedged_retracted_and_listed_names(output):
    from evalsuite.tasks.nolima.answers import named

    assert not named(output, "Tobias", known_names())


def test_a_retraction_names_the_second_name():
    """"Anneke? No \u2014 Kofi." answers Kofi: wrong for Anneke, right for Kofi (the needle task's rule for a
    number the output rejects)."""
    from evalsuite.tasks.nolima.answers import named

    assert not named("Anneke? No \u2014 Kofi.", "Anneke", known_names())
    assert named("Anneke? No \u2014 Kofi.", "Kofi", known_names())


@pytest.mark.parametrize("output, found", [
    ("Not Tobias.", True), ("Tobias? No, I don't know.", True), ("Either Tobias or Hana.", True),
    ("Anneke? No \u2014 Tobias.", True), ("Tobiasz", True), ("Tobias.", True), ("tobias", False), ("Tob\u00edas", False),
])
def test_contains_is_nolimas_own_rule_a_case_sensitive_substring(output, found):
    """NoLiMa's evaluation (async_evaluate.py, metric "contains"): `gold_answer in response`."""
    from evalsuite.tasks.nolima.answers import contains

    assert contains(output, "Tobias") is found


@pytest.mark.parametrize("output, none", [
    ("None.", True), ("none", True), ("No one.", True), ("Nobody has been to Barcelona.", True),
    ("No character has been to Barcelona.", True), ("The passage does not say.", True), ("I don't know.", True),
    ("There is no such character.", True), ("Not Tobias \u2014 no one.", True),
    ("Tobias.", False), ("None, but Tobias lives next to the Atomium.", False), ("Nobody but Tobias.", False),
    ("Hana.", False), ("", False),
])
def test_the_mismatched_question_is_right_only_when_the_answer_declines(output, none):
    from evalsuite.tasks.nolima.answers import says_none

    assert says_none(output, known_names()) is none


def test_score_reads_both_answers():
    sample = next(iter(nolima(lengths="256", depths="0", samples="1").plan(None)))
    name = sample.target[0]
    assert nolima().score(sample, [f"{name}.", "None."]) == {
        "correct": True, "contains": True, "mismatch_none": True, "mismatch_named": False}
    # a model that does not read the question names the needle's character to both
    assert nolima().score(sample, [f"Not {name}.", f"{name}."]) == {
        "correct": False, "contains": True, "mismatch_none": False, "mismatch_named": True}


# ---- the built-in story and a user's haystack ---------------------------------------------------------------

def test_the_cast_is_disjoint_from_the_characters_and_no_stop_word_or_question_word():
    from evalsuite.tasks.nolima.story import cast_names

    cast, data = cast_names(), builtin_data()
    assert len(cast) >= 300 and len(set(cast)) == len(cast)
    assert all(n.isalpha() and n.isascii() and n[0].isupper() for n in cast)
    lowered = {n.lower() for n in cast}
    assert not lowered & {c.lower() for c in data["characters"]} and not lowered & stop_words()
    questions = set().union(*(stems(p["question"]) | stems(p["key"]) for p in data["pairs"]))
    assert not {STEM(n.lower()) for n in cast} & questions


def story_sample(tokens: int, seed: int = 0) -> list[str]:
    import itertools
    import random

    from evalsuite.tasks.nolima.story import cast_names, story_sentences

    return list(itertools.islice(story_sentences(random.Random(seed), cast_names(), tokens), tokens // 12))


@pytest.mark.parametrize("tokens", [256, 2048, 131072])
def test_the_story_names_each_person_once_and_never_a_question_key_or_landmark(tokens):
    import re

    from evalsuite.tasks.nolima.haystack import term_pattern
    from evalsuite.tasks.nolima.story import cast_names

    sentences = story_sample(tokens)
    mentions = [w for s in sentences for w in re.findall(r"[A-Z][a-z]+", s) if w in set(cast_names())]
    assert len(mentions) == len(set(mentions)) >= min(20, tokens // 60)  # several people, each named once
    data = builtin_data()
    terms = [*data["characters"], *data["venues"], *(t for p in data["pairs"] for t in (p["key"], p.get("landmark", "")))]
    pattern = term_pattern(terms)
    assert pattern is not None and not [s for s in sentences if pattern.search(s)]


def test_no_named_sentence_shares_a_content_word_with_a_question():
    from evalsuite.tasks.nolima.story import cast_names

    questions = set().union(*(stems(p["question"]) for p in builtin_data()["pairs"]))
    cast = set(cast_names())
    named = {s for s in story_sample(8192) if cast & set(s.split())}
    assert len(named) > 200
    assert not stems(" ".join(named)) & questions


def write_text(tmp_path, text: str):
    path = tmp_path / "book.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


BOOK = ("The rain kept on all morning. Tobias came by with a letter. The Berliners sang in the square. "
        "Nobody had seen the Atomium on a postcard. The train was late again. A model aeroplane hung in the "
        "window. Margit baked two loaves and gave one away. ")


def test_a_user_haystack_loses_every_sentence_that_names_a_character_key_or_landmark(tmp_path):
    from evalsuite.backends import load_model

    model = load_model("fake:echo", {}, "cpu")
    task = nolima(haystack=write_text(tmp_path, BOOK * 40), lengths="400", depths="0.5", samples="2", hops="onehop")
    state = task.prepare(model)
    kept = state.haystack.text.sentences
    assert set(kept) == {"The rain kept on all morning.", "The train was late again.",
                         "Margit baked two loaves and gave one away."}
    assert state.haystack.dropped == 4 * 40
    for sample in task.plan(state):
        _, info = task.requests(sample, model, state)
        assert info["haystack_dropped"] == 160 and "blind_chance" not in info  # the rules have no list of its names


def test_a_user_haystack_with_nothing_left_is_one_line(tmp_path):
    with pytest.raises(UserError, match="every sentence names a character") as caught:
        nolima(haystack=write_text(tmp_path, "Tobias left. Brussels was grey. "), lengths="256").prepare(None)
    assert "\n" not in str(caught.value)


def test_a_needle_sets_characters_leave_the_cast(tmp_path):
    from evalsuite.tasks.nolima.story import cast_names

    entries = json.loads(json.dumps(NOLIMA_SET))
    entries[0]["character_set"] = ["Greta", "Kemal", "Yuki"]
    state = nolima(needle_set=write_set(tmp_path, entries), hops="onehop").prepare(None)
    assert {"Greta", "Kemal"} <= set(cast_names()) and not {"Greta", "Kemal"} & set(state.haystack.cast)


# ---- the mismatched question and the question-blind rules --------------------------------------------------

def test_each_sample_asks_an_unrelated_pairs_question_the_same_at_every_cell():
    task = nolima(lengths="256,512", depths="0,1", samples="40")
    by_id = {p.id: p for p in builtin_pairs("onehop")}
    kept: dict[tuple[str, str], set[str]] = {}
    for sample in task.plan(None):
        data = sample.data
        assert data["mismatch_pair"] != data["pair"] and data["mismatch"] != data["question"]
        if sample.axes["hops"] == "onehop":
            assert by_id[data["pair"]].unrelated(by_id[data["mismatch_pair"]])
        kept.setdefault((sample.axes["hops"], sample.id[-3:]), set()).add(data["mismatch_pair"])
    assert all(len(v) == 1 for v in kept.values())
    # the Sistine Chapel is in Rome: never asked the other's question
    assert not by_id["sistine"].unrelated(by_id["colosseum"]) and not by_id["colosseum"].unrelated(by_id["sistine"])


def test_a_needle_set_of_one_entry_has_no_mismatched_question(tmp_path):
    with pytest.raises(UserError, match="no question unrelated to pair 0408-T01"):
        list(nolima(needle_set=write_set(tmp_path, NOLIMA_SET[1:]), hops="onehop").plan(None))


def test_the_blind_rules_are_certain_when_the_needle_names_the_only_person():
    """The haystack before: no name but the needle's, so "answer the one name" is always right."""
    from evalsuite.tasks.nolima.blind import blind_scores

    pieces = ["The farmer carried a wooden basket.", "Tobias lives next to the Atomium.", "The sky was grey."]
    assert blind_scores(pieces, {"Tobias", "Hana"}, "Tobias") == {
        "names_in_prompt": 1, "blind_chance": 1.0, "blind_fewest_mentions": 1.0, "blind_beside_proper_noun": 1.0}
    pieces = ["Hana mended a sail.", "Greta fed the goats at the Red Lion.", "Greta sang.",
              "Tobias lives next to the Atomium."]
    assert blind_scores(pieces, {"Tobias", "Hana", "Greta"}, "Tobias") == {
        "names_in_prompt": 3, "blind_chance": 1 / 3, "blind_fewest_mentions": 0.5, "blind_beside_proper_noun": 0.5}


def test_on_the_default_run_the_question_blind_rules_score_at_chance():
    """Every prompt of the default run (160, toy-base's tokenizer): several names in each, and a reader
    who never reads the question is no better than a name drawn at random."""
    import statistics

    from test_prompt_versions import toy_base

    model = toy_base()
    task = nolima()
    state = task.prepare(model)
    facts = [(s.axes["context_length"], task.requests(s, model, state)[1]) for s in task.plan(state)]
    assert len(facts) == 160

    def mean(key: str, length: int | None = None) -> float:
        return statistics.mean(f[key] for at, f in facts if length in (None, at))

    assert mean("names_in_prompt", 256) >= 2.5 and mean("names_in_prompt", 2048) >= 50
    chance = mean("blind_chance")
    assert chance <= 0.2
    assert mean("blind_fewest_mentions") <= chance + 0.01  # every person is named once: a draw among all
    assert mean("blind_beside_proper_noun") <= 1.25 * chance


def test_toy_base_reports_the_control_beside_the_real_questions(tmp_path, capsys):
    """toy-base through the real runner: the report's section shows both questions' scores and the
    blind rules, and the headline metric table keeps `correct` apart from the control."""
    from conftest import invoke

    done = invoke(capsys, "run", "--model", "toy-base", "--task", "nolima", "-T", "lengths=256", "-T", "depths=0,1",
                  "-T", "samples=2", "--out", str(tmp_path), "--no-progress")
    assert done.code == 0, done.err
    (run,) = tmp_path.glob("nolima-*")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(len(r["outputs"]) == 2 for r in records)
    assert all(set(r["scores"]) == {"correct", "contains", "mismatch_none", "mismatch_named"} for r in records)
    text = invoke(capsys, "report", str(run), "--no-plots").out
    section = text.split("### Does the model read the question?")[1]
    assert "| one hop | 4 |" in section and "| two hops (needle and bridge) | 4 |" in section
    assert "other question: named the character" in section and "blind: fewest mentions" in section
    row = next(line for line in section.splitlines() if line.startswith("| one hop"))
    assert row.count("[") == 4 and "| - |" not in row  # four rates with intervals, the blind rules measured


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
    assert reported.out.count("### Does the model read the question?") == 2


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
    if scale == "tiny":  # the toy models on a CPU (trained on 1024 tokens, 8192 positions)
        assert max(max(v) for v in lengths.values()) <= 2048
    assert by_name["ruler-essays"].optional and "DIR/ruler/essays" in by_name["ruler-essays"].missing
    assert suite.scale == scale
