"""Needle scoring: the number the model attributes to each queried city must be the needle's, and only it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.tasks.needle.task import PRESETS, Needle
from evalsuite.types import Sample


def sample(cities: list[str], numbers: list[str], queries: int) -> Sample:
    axes = {"n_needles": len(cities), "n_queries": queries, "context_length": 1024, "depth": 0.5}
    return Sample(id="s", task="needle", axes=axes, target=tuple(numbers[:queries]),
                  data={"cities": cities, "numbers": numbers, "others": [], "filler_seed": 0})


# the queried cities first: R=1 asks for Paris, R=2 for Paris and Rome; Oslo's needle is a distractor
R1 = sample(["Paris", "Rome", "Oslo"], ["1234567", "7654321", "2345678"], 1)
R2 = sample(["Paris", "Rome", "Oslo"], ["1234567", "7654321", "2345678"], 2)
T, F = True, False

# (sample, output, the verdict per query a careful grader gives, ambiguous); the output continues the
# prompt's "Answer: The magic number of Paris is". Thirty-five realistic answers.
GRADED = [
    (R1, " 1234567.", [T], F),
    (R1, " 1,234,567.", [T], F),  # thousands separators
    (R1, " 1 234 567", [T], F),
    (R1, " 1\u00a0234\u00a0567.", [T], F),  # no-break spaces
    (R1, " 1.234.567.", [T], F),
    (R1, " 123-4567.", [T], F),  # a phone-number grouping
    (R1, " \uff11\uff12\uff13\uff14\uff15\uff16\uff17.", [T], F),  # fullwidth digits
    (R1, " -1234567.", [F], F),  # a negative number is another number
    (R1, " 12345678.", [F], F),  # the digits inside a longer number are not the number
    (R1, " 1234567.5", [F], F),  # nor inside a decimal
    (R1, " 1234567 7654321 2345678", [F], T),  # every needle number, the right one first
    (R1, " 7654321, 2345678, 1234567", [F], T),  # every needle number, the right one last
    (R1, " 2345678 or 1234567.", [F], T),  # two answers for one question
    (R1, " 1234567. The magic number of Rome is 7654321.", [T], F),  # another needle, named as such
    (R1, " 1234567, not 7654321.", [T], F),  # a rejected candidate is no answer
    (R1, " 7654321 is the magic number of Rome; Paris's is 1234567.", [T], F),
    (R1, " 1234567 (a seven-digit number, the 1st needle).", [T], F),  # short numbers are not answers
    (R1, " not given in the text.", [F], F),
    (R2, " 1234567. The magic number of Rome is 7654321.", [T, T], F),
    (R2, " 1234567 and 7654321 respectively for Paris and Rome.", [T, T], F),
    (R2, " 1234567 and 7654321, respectively.", [T, T], F),  # the question's order
    (R2, "The magic numbers of Paris and Rome are 1234567 and 7654321.", [T, T], F),
    (R2, " 7654321 and 1234567 are the magic numbers of Rome and Paris.", [T, T], F),
    (R2, " 1234567.\n7654321 is the magic number of Rome.", [T, T], F),  # the city named after the number
    (R2, " 1234567. Rome: 7654321", [T, T], F),
    (R2, " 1234567, and for Rome it is 7654321.", [T, T], F),
    (R2, " 1234567 (Paris) and 7654321 (Rome)", [T, T], F),
    (R2, " 7654321 is Rome's and 1234567 is Paris's.", [T, T], F),
    (R2, " 1,234,567. The magic number of Rome is 7 654 321.", [T, T], F),
    (R2, " 1234567 and 7654321", [T, T], F),  # exactly the two answers, in the question's order
    (R2, " 7654321. The magic number of Rome is 1234567.", [F, F], F),  # swapped
    (R2, " 1234567 7654321 2345678", [F, F], T),  # every needle number, no city named
    (R2, " 1234567. The magic number of Rome is -7654321.", [T, F], F),
    (R2, " 1234567. The magic number of Oslo is 2345678.", [T, F], F),  # Rome is not answered
    (R2, " 1234567. The magic number of Rome is 7654321 or 2345678.", [T, F], T),
]


def test_the_table_has_thirty_five_answers():
    assert len(GRADED) == 35


@pytest.mark.parametrize("case, output, hits, ambiguous", GRADED)
def test_a_careful_graders_verdicts(case, output, hits, ambiguous):
    scores = Needle().score(case, [output])
    assert scores["hits"] == hits, scores["offered"]
    assert scores["ambiguous"] == ambiguous
    assert scores["correct_all"] == all(hits) and scores["correct_mean"] == sum(hits) / len(hits)


@pytest.mark.parametrize("case, output, hits", [
    (R2, " 1234567. What is the magic number of Rome? 7654321", [T, T]),  # the model asks itself
    (R2, " 1234567. The magic number of Rome is 76543", [T, F]),  # cut off by the answer budget
    (R2, " 1234567.\n7654321", [T, T]),  # two answers, no city: the question's order
    (R2, " 1234567 or 7654321", [F, F]),  # alternatives for the first city, none for the second
    (R2, " 1234567 and 7654321 for Rome and Paris respectively.", [F, F]),
    (R1, " 1234567. The magic number of Rome is 7654321. And 2345678.", [T]),  # the extra follows Rome
    (R1, "\n- Paris: 1234567\n- Rome: 7654321", [T]),
])
def test_further_shapes(case, output, hits):
    assert Needle().score(case, [output])["hits"] == hits


# cities written with accents by a model; the needles name them without
Z1 = sample(["Zurich", "Bogota", "Montreal"], ["4831902", "7209415", "5550123"], 1)
Z2 = sample(["Zurich", "Bogota", "Montreal"], ["4831902", "7209415", "5550123"], 2)

# answers a careful grader credits: other digit systems and groupings, accented city names,
# a candidate rejected after it is written, arrows, ordinal labels, digits one by one
CREDITED = [
    (Z1, " \u0664\u0668\u0663\u0661\u0669\u0660\u0662.", [T]),  # Arabic-Indic digits
    (Z1, " \u096a\u096e\u0969\u0967\u096f\u0966\u0968.", [T]),  # Devanagari digits
    (Z1, " 48,31,902.", [T]),  # Indian grouping
    (Z1, " 4\u2019831\u2019902.", [T]),  # Swiss grouping with the typographic apostrophe
    (Z1, " \u0664\u066c\u0668\u0663\u0661\u066c\u0669\u0660\u0662.", [T]),  # the Arabic thousands sign
    (Z1, " 4831902, and Bogot\u00e1's is 7209415.", [T]),
    (Z2, " 4831902. Bogot\u00e1: 7209415.", [T, T]),
    (Z2, " 4831902 (Z\u00fcrich) and 7209415 (Bogot\u00e1)", [T, T]),
    (Z1, " 7209415 is not it; the answer is 4831902.", [T]),
    (Z1, " 7209415 is wrong, it is 4831902.", [T]),
    (Z2, " 4831902 \u2192 Zurich, 7209415 \u2192 Bogota", [T, T]),
    (Z2, " 4831902\nBogot\u00e1 \u2192 7209415", [T, T]),
    (Z2, " 1st: 4831902, 2nd: 7209415", [T, T]),
    (Z2, " second: 7209415, first: 4831902", [T, T]),
    (Z1, " 4 8 3 1 9 0 2.", [T]),
    (Z1, " four eight three one nine zero two.", [T]),
    (Z2, " 4-8-3-1-9-0-2. Montr\u00e9al? No, Bogot\u00e1: 7 2 0 9 4 1 5.", [T, T]),
]

# answers that stay wrong: the same forms with the wrong number, order or city
STILL_WRONG = [
    (Z1, " \u0667\u0662\u0660\u0669\u0664\u0661\u0665.", [F]),  # Arabic-Indic, Bogota's number
    (Z1, " 48,31,90,2.", [F]),  # not a grouping
    (Z2, " 7209415. Z\u00fcrich: 4831902.", [F, F]),  # swapped through an accented name
    (Z2, " 4831902. Montr\u00e9al: 7209415.", [T, F]),  # the number given to another city
    (Z1, " 4831902 is not it; the answer is 7209415.", [F]),
    (Z1, " 4831902 or 7209415, the first is not it.", [F]),  # still two answers for one city
    (Z2, " 1st: 7209415, 2nd: 4831902", [F, F]),
    (Z2, " 1st: 4831902, 1st: 7209415", [F, F]),  # one label twice: no order to read
    (Z2, " 4831902 \u2192 Bogota, 7209415 \u2192 Zurich", [F, F]),
    (Z1, " 4 8 3 1.", [F]),  # four digits are a count, not an answer
    (Z1, " one two three four five six seven.", [F]),
    (Z1, " 4 8 3 1 9 0 2 1.", [F]),
]


@pytest.mark.parametrize("case, output, hits", CREDITED + STILL_WRONG)
def test_adversarial_forms_are_read_as_a_careful_grader_reads_them(case, output, hits):
    assert Needle().score(case, [output])["hits"] == hits


# Lisbon asked first, Kyoto second; Oslo's needle is a distractor and Malmo is no city of the prompt
L1 = sample(["Lisbon", "Kyoto", "Oslo"], ["3906417", "5550123", "2345678"], 1)
L2 = sample(["Lisbon", "Kyoto", "Oslo"], ["3906417", "5550123", "2345678"], 2)

# five shapes a careful reader reads differently from a pattern match, each in a few variants, with the
# verdict per query that reader gives: footnote marks, a city in a parenthetical aside, "not X but Y",
# "first X, then Y" and a number taken back ("wait, that's Malmo's") or a city declined ("I don't know")
READER = [
    # a superscript or subscript digit against a number is a footnote mark, not its last digit
    (L1, " 3906417\u00b9.", [T]),
    (L1, " 3906417\u00b2", [T]),
    (L1, " 3906417\u00b9\u00b2.", [T]),  # footnote 12
    (L1, " 3906417\u207d\u00b9\u207e", [T]),
    (L1, " 3906417\u2081", [T]),
    (L2, " 3906417\u00b9 and 5550123\u00b2", [T, T]),
    (L1, " \u00b3\u2079\u2070\u2076\u2074\u00b9\u2077", [T]),  # the whole number raised reads as its digits
    (L1, " 5550123\u00b9.", [F]),  # a footnote does not make a wrong number right
    (L1, " 390641\u2077", [F]),  # six digits and footnote 7, not 3906417
    # a city with more than its name in parentheses is an aside about it, not the number's city
    (L1, " 3906417 (Kyoto: 5550123).", [T]),
    (L1, " 3906417 (Kyoto: \u2026)", [T]),
    (L1, " 3906417 (Kyoto's is 5550123)", [T]),
    (L1, " 3906417 (Kyoto: 5550123, Oslo: 2345678)", [T]),
    (L2, " 3906417 (Kyoto: 5550123)", [T, T]),
    (L1, " 5550123 (Kyoto: 3906417)", [F]),  # Lisbon is answered 5550123
    (L1, " 3906417 (Lisbon)", [T]),  # the city alone in parentheses still names the number's city
    (L1, " 3906417 (for Lisbon)", [T]),
    (L1, " 3906417 (Lisbon, the city asked about)", [T]),
    (L2, " 5550123 (Kyoto) and 3906417 (Lisbon)", [T, T]),
    # "not X but Y": X is set aside, Y answers
    (L1, " not 5550123 but 3906417.", [T]),
    (L1, " not, as it first seemed, 5550123, but 3906417.", [T]),
    (L1, " not 5550123 or 2345678 but 3906417.", [T]),
    (L1, " not the 5550123 of Kyoto but 3906417.", [T]),
    (L1, " neither 5550123 nor 2345678; it is 3906417.", [T]),
    (L1, " 5550123 is not Lisbon's but Kyoto's; Lisbon's is 3906417.", [T]),
    (L2, " Lisbon: not 5550123 but 3906417; Kyoto: not 3906417 but 5550123.", [T, T]),
    (L1, " not 3906417 but 5550123.", [F]),
    (L1, " not 3906417 or 5550123 but 2345678.", [F]),
    (L1, " not only 3906417 but also 5550123.", [F]),  # both given: two answers
    (L1, " Not 100% sure but it's 3906417.", [T]),  # "not ... but" that sets no answer aside
    # "first X, then Y": a list that says its order in words
    (L2, " first 3906417, then 5550123.", [T, T]),
    (L2, " first 3906417 and then 5550123.", [T, T]),
    (L2, " First, 3906417; then, 5550123.", [T, T]),
    (L2, " firstly 3906417, secondly 5550123", [T, T]),
    (L2, " 3906417, then 5550123", [T, T]),
    (L2, " first 5550123, then 3906417.", [F, F]),  # the question's order, swapped
    (L2, " first 3906417, then 5550123, then 2345678", [F, F]),  # three answers to two questions
    (L1, " first 5550123, then 3906417", [F]),  # two answers to one question
    (L1, " first 3906417, then 5550123", [F]),
    # a number taken back, given to a name that is no city of the prompt, or a city declined
    (L1, " 3906417 \u2014 wait, that's Malmo's. I don't know Lisbon's.", [F]),
    (L1, " 3906417 - no wait, that is Malmo's; I don't know Lisbon's.", [F]),
    (L1, " 3906417. Sorry, that's Malmo's number, I do not know the one for Lisbon.", [F]),
    (L1, " 3906417 \u2014 wait, that's Malmo's.", [F]),
    (L1, " 3906417 is Malmo's.", [F]),
    (L1, " 3906417 \u2014 wait, that's Kyoto's. I don't know Lisbon's.", [F]),
    (L1, " 3906417 \u2014 wait, that's wrong. I don't know.", [F]),
    (L1, " 3906417. I don't know Lisbon's.", [F]),
    (L1, " I do not know Lisbon's, but 3906417 is my guess.", [F]),
    (L1, " 5550123 \u2014 wait, that's Kyoto's. Lisbon's is 3906417.", [T]),
    (L1, " 5550123 \u2014 wait, that's Malmo's. Lisbon's is 3906417.", [T]),
    (L1, " 5550123. Wait, that's Kyoto's; Lisbon's is 3906417.", [T]),
    (L1, " 5550123 \u2014 no, sorry, that is wrong; 3906417.", [T]),
    (L1, " 3906417. I don't know Kyoto's.", [T]),  # declining another city takes nothing back
    (L2, " 3906417. I don't know Kyoto's.", [T, F]),
    (L1, " 3906417, which is Lisbon's.", [T]),
    (L1, " 3906417 \u2014 that's Lisbon's.", [T]),
    (L1, " I'm not sure, but 3906417.", [T]),
    (L1, " 3906417. It is not right to guess the others.", [T]),
]


@pytest.mark.parametrize("case, output, hits", READER)
def test_a_readers_verdicts_on_asides_footnotes_contrasts_orders_and_retractions(case, output, hits):
    assert Needle().score(case, [output])["hits"] == hits


def test_a_declined_city_is_marked_in_the_grade():
    from evalsuite.tasks.kit.numbers import grade

    graded = grade(" 3906417. I don't know Kyoto's.", ["Lisbon", "Kyoto"], ["3906417", "5550123"],
                   ["Lisbon", "Kyoto", "Oslo"])
    assert graded.declined == (False, True) and graded.offered == (("3906417",), ())


@pytest.mark.parametrize("case, output, substring", [
    (R1, " 1234567.", [T]),
    (R1, " 12345678.", [T]),  # the public rule: the digits appear, inside a longer number too
    (R1, " -1234567.", [T]),
    (R1, " 1,234,567.", [F]),  # the digits do not appear as written
    (R1, " 1234567 7654321 2345678", [T]),  # a list of every number
    (R2, " 7654321. The magic number of Rome is 1234567.", [T, T]),  # swapped attributions
    (R2, " 1234567. The magic number of Rome is 7654322.", [T, F]),
    (R2, "", [F, F]),
])
def test_the_substring_metrics_follow_the_public_rule(case, output, substring):
    scores = Needle().score(case, [output])
    assert scores["correct_all_substring"] == all(substring)
    assert scores["correct_mean_substring"] == sum(substring) / len(substring)


@pytest.mark.parametrize("text, expected", [
    ("1,234,567", ["1234567"]), ("1 234 567", ["1234567"]), ("12 34 567", ["1234567"]),
    ("1234567 2345678", ["1234567", "2345678"]), ("1234567,2345678", ["1234567", "2345678"]),
    ("1234567-2345678", ["1234567", "2345678"]), ("Paris-1234567", ["1234567"]), ("(-1234567)", ["-1234567"]),
    ("\u22121234567", ["-1234567"]), ("1'234'567", ["1234567"]), ("1,234", ["1234"]), ("7.5", ["7.5"]),
    ("1234567\u00b9", ["1234567"]), ("Rome\u00b2: 1234567", ["1234567"]), ("\u00b9\u00b2\u00b3\u2074\u2075", ["12345"]),
])
def test_digit_groups_and_signs(text, expected):
    from evalsuite.tasks.kit.numbers import normalise, numbers

    assert [n.value for n in numbers(normalise(text))] == expected


def short_context_copy(tmp_path: Path, context: int) -> Path:
    source = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-base"
    folder = Path(shutil.copytree(source, tmp_path / f"toy-{context}"))
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = context
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_paper_4k_runs_on_a_4096_context_model_as_it_is(capsys, tmp_path):
    folder = short_context_copy(tmp_path, 4096)
    ran = invoke(capsys, "run", "--model", str(folder), "--task", "needle", "-T", "preset=paper-4k", "--limit", "2",
                 "--no-progress", "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    (records,) = (tmp_path / "out").glob("needle-*/samples.jsonl")
    for line in records.read_text().splitlines():
        info = json.loads(line)["info"]
        assert info["answer_budget"] == 20
        assert 0.99 * (4096 - 20) <= info["prompt_tokens"] <= 4096 - 20  # prompt + answer = the length


def test_paper_64k_passes_the_context_check_of_a_65536_context_model(tmp_path):
    from evalsuite.backends import load_model
    from evalsuite.errors import UserError

    task = Needle(**{k: tuple(int(x) for x in v.split(",")) if k in ("lengths", "needles", "queries")
                     else tuple(float(x) for x in v.split(",")) if k == "depths" else int(v)
                     for k, v in PRESETS["paper-64k"].items()})
    task.prepare(load_model(str(short_context_copy(tmp_path, 65536)), {}, device="cpu"))
    with pytest.raises(UserError, match="exceeds"):
        task.prepare(load_model(str(short_context_copy(tmp_path, 65535)), {}, device="cpu"))
