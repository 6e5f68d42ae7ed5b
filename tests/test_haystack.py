"""Haystack sizing and needle placement, table-driven, on a real tokenizer."""

from __future__ import annotations

import random

import pytest

from evalsuite.errors import UserError
from evalsuite.tasks.kit.filler import builtin_sentences, index_draws, load_haystack, split_sentences
from evalsuite.tasks.kit.fit import fit_to_budget, insert_at_boundaries
from evalsuite.tasks.needle.task import CITIES, INSTRUCTION, Needle


class TokenizerAdapter:
    """The slice of the model adapter that prompt building uses, over a real tokenizer."""

    name = "tok"
    max_context = 1 << 20

    def __init__(self, tokenizer, chat_template: bool = False):
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=not self.chat_template)["input_ids"])

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        if not self.chat_template:
            return user + assistant_prefix
        return f"<bos><|user|>\n{user}\n<|assistant|>\n{assistant_prefix}"


@pytest.mark.parametrize(
    "length, depth, needles, queries",
    [
        (128, 0.0, 1, 1),
        (256, 0.5, 1, 1),
        (512, 1.0, 2, 2),
        (1000, 0.25, 4, 2),
        (2048, 0.75, 6, 2),
        (4096, 0.5, 8, 1),
    ],
)
@pytest.mark.parametrize("chat", [False, True])
def test_prompt_hits_token_budget_and_needle_sits_at_depth(toy_tokenizer, length, depth, needles, queries, chat):
    task = Needle(lengths=(length,), depths=(depth,), needles=(needles,), queries=(queries,), samples=1)
    model = TokenizerAdapter(toy_tokenizer, chat)
    state = task.prepare(model)
    (sample,) = task.plan(state)
    (request,), info = task.requests(sample, model, state)
    measured = model.count_tokens(request.prompt)
    assert measured == info["prompt_tokens"]
    budget = length - info["answer_budget"]  # prompt + answer = the length the model holds
    assert info["answer_budget"] == task.tokens_per_query * queries
    assert budget * 0.99 <= measured <= budget
    # the answer needle sits at the requested share of the haystack's tokens, as recorded
    assert abs(token_depth(toy_tokenizer, request.prompt, sample.data) - depth) <= 0.03
    assert info["measured_depth"] == pytest.approx(token_depth(toy_tokenizer, request.prompt, sample.data), abs=0.01)
    # every needle is in the prompt exactly once, at a sentence boundary
    for city, number in zip(sample.data["cities"], sample.data["numbers"]):
        needle = f"The magic number of {city} is {number}."
        assert request.prompt.count(needle) == 1
        before = request.prompt[: request.prompt.index(needle)]
        assert before.endswith((". ", "\n\n", "! ", "? ")), before[-20:]
    assert request.prompt.endswith(f"The magic number of {sample.data['cities'][0]} is")


def token_depth(tokenizer, prompt: str, data: dict) -> float:
    """The answer needle's depth read from the tokenizer's own offsets: the share of the
    haystack's tokens other than the needle's (distractors and fragments included) before it."""
    needle = f"The magic number of {data['cities'][0]} is {data['numbers'][0]}."
    start, end = prompt.index(INSTRUCTION) + len(INSTRUCTION) + 2, prompt.rindex("\n\nQuestion:")
    at = prompt.index(needle)
    offsets = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    lasts = [b - 1 for a, b in offsets if b > a]  # a token is where its last character is
    before = sum(start <= c < at for c in lasts)
    after = sum(at + len(needle) <= c < end for c in lasts)
    return before / (before + after)


@pytest.mark.parametrize("length", [256, 512, 1024])
@pytest.mark.parametrize("needles, queries", [(1, 1), (4, 2)])
def test_the_answer_needle_lands_within_003_of_the_depth_at_every_length(toy_tokenizer, length, needles, queries):
    """Depth is a share of tokens: at 256 tokens a sentence is a fifteenth of the haystack, so
    placing by sentence counts (distractors and the last fragment ignored) missed these samples
    by up to 0.24."""
    depths = tuple(i / 10 for i in range(11))
    task = Needle(lengths=(length,), depths=depths, needles=(needles,), queries=(queries,), samples=3)
    model = TokenizerAdapter(toy_tokenizer)
    state = task.prepare(model)
    errors = []
    for sample in task.plan(state):
        (request,), info = task.requests(sample, model, state)
        errors.append(abs(token_depth(toy_tokenizer, request.prompt, sample.data) - sample.axes["depth"]))
    assert len(errors) == 33 and max(errors) <= 0.03


@pytest.mark.parametrize(
    "sentences, inserts, expected",
    [
        (["a.", "b."], [(0, "N")], ["N", "a.", "b."]),
        (["a.", "b."], [(2, "N")], ["a.", "b.", "N"]),
        (["a.", "b."], [(1, "N"), (1, "M")], ["a.", "N", "M", "b."]),
        (["a.", "b.", "c."], [(3, "X"), (0, "Y"), (2, "Z")], ["Y", "a.", "b.", "Z", "c.", "X"]),
        ([], [(0, "N")], ["N"]),
    ],
)
def test_insert_at_boundaries(sentences, inserts, expected):
    assert insert_at_boundaries(sentences, inserts) == expected


def test_fit_to_budget_is_the_longest_prompt_under_target():
    supply = [f"word{i} word word." for i in range(200)]
    count = lambda text: len(text.split())  # noqa: E731 - a whitespace "tokenizer" makes the arithmetic visible

    def build(whole, fragment):
        return " ".join(["Q:"] + whole + ([fragment] if fragment else []))

    fitted = fit_to_budget(100, supply, build, count, tolerance=0.0)
    assert fitted.tokens == 100  # 1 + 33 sentences * 3 words = 100 exactly
    assert fitted.sentences == 33 and fitted.extra_words == 0
    fitted = fit_to_budget(102, supply, build, count, tolerance=0.0)
    assert (fitted.tokens, fitted.sentences, fitted.extra_words) == (102, 33, 2)
    with pytest.raises(UserError):
        fit_to_budget(0, supply, build, count)


@pytest.mark.parametrize("hint", [None, 0, 1, 20, 33, 34, 60, 199, 200, 500])
@pytest.mark.parametrize("target, expected", [(100, (100, 33, 0)), (102, (102, 33, 2)), (10_000, (601, 200, 0))])
def test_fit_to_budget_finds_the_same_prompt_from_any_hint(hint, target, expected):
    supply = [f"word{i} word word." for i in range(200)]
    count = lambda text: len(text.split())  # noqa: E731

    def build(whole, fragment):
        return " ".join(["Q:"] + whole + ([fragment] if fragment else []))

    fitted = fit_to_budget(target, supply, build, count, tolerance=0.0, hint=hint)
    assert (fitted.tokens, fitted.sentences, fitted.extra_words) == expected
    if fitted.extra_words:  # the fragment is the next sentence's tail: it ends as a sentence does
        assert fitted.prompt.endswith("word32 word word. word word.")


def test_builtin_filler_has_no_digits_or_cities():
    rng = random.Random(3)
    stream = builtin_sentences(rng)
    text = " ".join(next(stream) for _ in range(2000))
    assert not any(ch.isdigit() for ch in text)
    assert not any(city in text for city in CITIES)
    assert "magic" not in text


def test_same_seed_same_haystack_other_seed_other(toy_tokenizer):
    model = TokenizerAdapter(toy_tokenizer)

    def prompt(seed):
        task = Needle(lengths=(300,), depths=(0.5,), samples=1, seed=seed)
        state = task.prepare(model)
        return task.requests(next(iter(task.plan(state))), model, state)[0][0].prompt

    assert prompt(0) == prompt(0)
    assert prompt(0) != prompt(1)


def test_text_file_haystack(tmp_path, toy_tokenizer):
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"Sentence number {w} of the book goes on." for w in "abcdefghij" * 40))
    model = TokenizerAdapter(toy_tokenizer)
    task = Needle(lengths=(512,), depths=(0.5,), samples=1, haystack=str(book))
    state = task.prepare(model)
    (request,), info = task.requests(next(iter(task.plan(state))), model, state)
    assert "Sentence number" in request.prompt
    budget = 512 - info["answer_budget"]  # a length holds the prompt and the answer
    assert 0.99 * budget <= info["prompt_tokens"] <= budget


def test_text_file_too_short_is_a_user_error(tmp_path, toy_tokenizer):
    book = tmp_path / "short.txt"
    book.write_text("Only a few words here. Not enough.")
    task = Needle(lengths=(512,), samples=1, haystack=str(book))
    with pytest.raises(UserError, match="too short"):
        task.prepare(TokenizerAdapter(toy_tokenizer))


def test_dataset_haystack_from_local_folder(tmp_path, toy_tokenizer):
    folder = tmp_path / "essays"
    folder.mkdir()
    rows = [{"text": " ".join(f"Essay {i} line {j} says something plain." for j in range(30))} for i in range(5)]
    import json

    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    haystack = load_haystack(f"dataset:{folder}")
    assert haystack is not None and len(haystack.sentences) == 150
    with pytest.raises(UserError, match="no column"):
        load_haystack(f"dataset:{folder}", field="body")


def test_split_sentences():
    assert split_sentences("One. Two!  Three?\nFour") == ["One.", "Two!", "Three?", "Four"]


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_index_draws_are_the_random_modules_own(seed):
    """The filler's fast draws give what rng.randrange and rng.choice give for the same seed,
    so the filler, and every prompt built from it, stays as it was."""
    ours, theirs = random.Random(seed), random.Random(seed)
    below = index_draws(ours)
    sizes = [4, 18, 16, 15, 14, 10, 1, 2, 3, 1000] * 300
    assert [below(n) for n in sizes] == [theirs.randrange(n) if i % 2 else theirs.choice(range(n))
                                        for i, n in enumerate(sizes)]
    assert ours.random() == theirs.random()
