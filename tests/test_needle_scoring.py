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
