"""A reasoning model's thinking (engine/thinking.py): `-M thinking` and `-M thinking_budget`, the
answer after the span scored, the raw output and the thinking's length recorded, unended thinking a
counted fail, stop strings that apply after the span only, and a run without thinking unchanged.

The reasoning model is scripted behind a real OpenAI-compatible completions server on loopback
(`Reasoner`, the `server` backend's client talking to it): it thinks over several lines, then
answers; its text ends at `max_tokens` tokens or at the first stop string, as vLLM ends it."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from completions_server import CompletionsServer
from conftest import invoke

from evalsuite.engine.runner import make_task
from evalsuite.engine.steps import identity_with_step
from evalsuite.engine.thinking import TAGS, ThinkingOptions, given_tags, read_output, split_options, thinking_of
from evalsuite.errors import UserError
from evalsuite.runs.identity import run_identity
from evalsuite.runs.records import config_hash
from evalsuite.types import GenerationRequest

THOUGHT = "<think>\nThe question asks for one thing.\nI read the story line by line.\nOne sentence says it.\n</think>\n\n"
NEEDLE = ("--task", "needle", "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=1", "--no-progress")
NOLIMA = ("--task", "nolima", "-T", "lengths=512", "-T", "depths=0.5", "-T", "samples=1", "--no-progress")


@dataclass
class Served:
    """What CompletionsServer reads of its model: the tokenizer (/tokenize) and the context (/v1/models)."""

    tokenizer: Any
    max_context: int = 4096


class Reasoner(CompletionsServer):
    """A reasoning model behind /v1/completions: THOUGHT, then `answer(prompt)` and a line after it;
    the text ends at `max_tokens` tokens of its tokenizer, then at the first stop string."""

    def __init__(self, tokenizer: Any, answer: Callable[[str], str]):
        super().__init__(Served(tokenizer), served_name="reasoner")
        self.answer = answer

    def completions(self, body: dict, headers: dict) -> tuple[int, dict]:
        tokenizer = self.model.tokenizer
        ids = tokenizer(THOUGHT + self.answer(body["prompt"]) + "\nThat is all.", add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids[: body["max_tokens"]])
        cuts = [text.find(s) for s in body.get("stop") or () if s in text]
        text = text[: min(cuts)] if cuts else text
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": "reasoner",
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}]}


def needle_answer(prompt: str) -> str:
    """The needle's number for the city the prompt asks about, read from the prompt."""
    city = re.findall(r"magic number of ([A-Z][a-z]+)\?", prompt)[-1]
    numbers = dict(re.findall(r"The magic number of ([A-Z][a-z]+) is (\d+)", prompt))
    return f"The magic number of {city} is {numbers[city]}."


def nolima_answers(params: dict[str, str]) -> Callable[[str], str]:
    """Each planned sample's character for its own question and "none" for its mismatched one, known
    from the plan (the prompt holds the sample's needle sentence and one of the two questions)."""
    samples = list(make_task("nolima", params).plan(None))

    def answer(prompt: str) -> str:
        (sample,) = [s for s in samples if s.data["needle"] in prompt]
        return sample.target[0] if sample.data["question"] in prompt else "none"

    return answer


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from evalsuite.models import HERE

    return AutoTokenizer.from_pretrained(str(HERE / "toy-base"))


@pytest.fixture(scope="module")
def needle_server(tokenizer):
    with Reasoner(tokenizer, needle_answer) as running:
        yield running


def run(capsys, server: Reasoner, out: Path, *args: str):
    return invoke(capsys, "run", "--model", "server:reasoner", "-M", f"base_url={server.url}", "-M", "retries=0",
                  *args, "--out", str(out))


def the_run(out: Path) -> tuple[dict, list[dict], dict]:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    return (json.loads((folder / "config.json").read_text()), records,
            json.loads((folder / "summary.json").read_text()))


# ---- the option ------------------------------------------------------------------------------


def test_the_option_names_tags_or_refuses_in_one_line():
    assert given_tags("think") == TAGS == given_tags("on")
    assert given_tags("thought") == ("<thought>", "</thought>")
    assert given_tags("<|begin_of_thought|>,<|end_of_thought|>") == ("<|begin_of_thought|>", "<|end_of_thought|>")
    assert given_tags("auto") is None and given_tags("off") is None
    for bad in ("<x>,<x>", ",</x>", "<think", "a,b,c"):
        with pytest.raises(UserError, match="-M thinking="):
            given_tags(bad)
    backend, options = split_options({"thinking": "think", "thinking_budget": "64", "dtype": "bfloat16"})
    assert backend == {"dtype": "bfloat16"} and options == ThinkingOptions("think", 64)
    assert split_options({"dtype": "bfloat16"}) == ({"dtype": "bfloat16"}, None)
    with pytest.raises(UserError, match="thinking_budget"):
        split_options({"thinking_budget": "-1"})
    with pytest.raises(UserError, match="thinking_budget"):
        split_options({"thinking_budget": "many"})


def test_auto_finds_the_tags_in_the_vocabulary_or_the_chat_template(toy_tokenizer):
    def model(tokenizer: Any) -> Any:
        return SimpleNamespace(name="m", tokenizer=tokenizer)

    plain = copy.deepcopy(toy_tokenizer)
    assert thinking_of(ThinkingOptions(), model(plain)) is None
    assert thinking_of(ThinkingOptions(), SimpleNamespace(name="fake")) is None  # no tokenizer to read
    with pytest.raises(UserError, match="thinking_budget is for a model that thinks"):
        thinking_of(ThinkingOptions(thinking_budget=64), model(plain))
    vocabulary = copy.deepcopy(toy_tokenizer)
    vocabulary.add_tokens(list(TAGS))
    found = thinking_of(ThinkingOptions(thinking_budget=64), model(vocabulary))
    assert found is not None and found.recorded() == {"start": "<think>", "end": "</think>", "budget": 64,
                                                      "from": "tokenizer vocabulary"}
    template = copy.deepcopy(toy_tokenizer)
    template.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                              "Think in <think> {thought} </think>, then answer.")
    assert thinking_of(ThinkingOptions(), model(template)).source == "chat template"  # type: ignore[union-attr]
    assert thinking_of(ThinkingOptions("off"), model(template)) is None
    special = copy.deepcopy(toy_tokenizer)
    special.add_tokens(list(TAGS), special_tokens=True)  # decoding drops them: the answer cannot be found
    with pytest.raises(UserError, match="special token"):
        thinking_of(ThinkingOptions(), model(special))


# ---- reading an output -----------------------------------------------------------------------


def test_the_answer_is_the_text_after_the_span_cut_at_the_first_stop_string():
    thinking = thinking_of(ThinkingOptions("think"), SimpleNamespace(name="m"))
    assert thinking is not None
    asked = GenerationRequest(prompt="Q?", max_new_tokens=8, stop=("\n",))
    read = read_output(thinking, asked, "<think>\nline one\nline two\n</think>\n\n 42.\nmore")
    assert (read.answer, read.chars) == ("42.", len("\nline one\nline two\n"))
    assert read_output(thinking, asked, "<think>\nstill thinking").answer is None  # never ended
    assert read_output(thinking, asked, " 42.\nmore").answer == " 42."  # no thinking: cut as a backend cuts
    assert read_output(thinking, asked, "42 <think>x</think>").answer == "42 <think>x</think>"  # not at the start
    opened = GenerationRequest(prompt="<|assistant|>\n<think>\n", max_new_tokens=8, stop=("\n",))  # the template opens it
    assert read_output(thinking, opened, "hmm\nyes\n</think>\n\nParis\n").answer == "Paris"
    assert read_output(thinking, opened, "hmm\nyes").answer is None
    closed = GenerationRequest(prompt="<think>\n\n</think>\n\n", max_new_tokens=8, stop=("\n",))  # thinking turned off
    assert read_output(thinking, closed, "Paris\n").answer == "Paris"


# ---- runs on a scripted reasoning model --------------------------------------------------------


def test_needle_scores_the_answer_after_the_thinking_and_records_it(capsys, tmp_path, needle_server):
    earlier = len(needle_server.bodies)
    result = run(capsys, needle_server, tmp_path, *NEEDLE, "-M", "thinking=think", "-M", "thinking_budget=64")
    assert result.code == 0, result.err
    config, records, summary = the_run(tmp_path)
    assert config["thinking"] == {"start": "<think>", "end": "</think>", "budget": 64, "from": "-M thinking"}
    sent = [b for b in needle_server.bodies[earlier:] if "max_tokens" in b]
    # the task's stop string ("\n") would end the answer inside the thinking: none is sent, the budget is added
    assert sent and all("stop" not in b and b["max_tokens"] == 20 + 64 for b in sent)
    for record in records:
        assert record["scores"]["correct_all"] is True and record["error"] is None
        raw = record["info"]["thinking_raw"][0]
        assert raw.startswith(THOUGHT) and raw.endswith("\nThat is all.")  # as the model wrote it
        # the text after the span, to the stop string: "The magic number of CITY is NUMBER."
        assert record["outputs"] == [raw[len(THOUGHT):].split("\n")[0]] and record["target"][0] in record["outputs"][0]
        assert record["info"]["thinking_chars"] == len(THOUGHT.strip()) - len("<think></think>")
        assert record["info"]["thinking_unended"] == 0
    assert summary["thinking"]["unended_outputs"] == 0 and summary["overall"]["correct_all"] == 1.0
    assert "never ended" not in result.err


def test_without_thinking_the_stop_string_ends_the_output_inside_the_thinking(capsys, tmp_path, needle_server):
    """The control: the same model with thinking off is cut at the needle's stop string, a newline,
    which comes inside its thinking."""
    result = run(capsys, needle_server, tmp_path, *NEEDLE, "-M", "thinking=off")
    assert result.code == 0, result.err
    config, records, summary = the_run(tmp_path)
    assert "thinking" not in config and summary["overall"]["correct_all"] == 0.0
    assert all(r["outputs"] == ["<think>"] and "thinking_raw" not in r["info"] for r in records)


def test_thinking_that_never_ends_is_a_counted_fail(capsys, tmp_path, needle_server):
    result = run(capsys, needle_server, tmp_path, *NEEDLE, "-M", "thinking=think")  # no budget: 20 tokens in all
    assert result.code == 0, result.err
    assert "-M thinking_budget is 0" in result.err
    line = ("2 outputs never ended their thinking (budget 0 tokens beyond each answer's, -M thinking_budget): "
            "counted as fails (2 samples, in the errors)")
    assert line in result.err
    config, records, summary = the_run(tmp_path)
    assert all(r["error"].startswith("ThinkingUnended") and r["outputs"] == [] and r["scores"] == {} for r in records)
    assert all(r["info"]["thinking_unended"] == 1 and "</think>" not in r["info"]["thinking_raw"][0] for r in records)
    assert summary["errors"] == 2 and summary["overall"]["correct_all"] == 0.0  # errors count as fails
    assert summary["thinking"] == {"unended_outputs": 2, "unended_samples": 2, "budget": 0,
                                   "tags": ["<think>", "</think>"]}
    report = invoke(capsys, "report", str(next(p for p in tmp_path.iterdir() if p.is_dir())), "--no-plots")
    assert report.code == 0 and line in report.out


def test_nolima_scores_the_answer_after_the_thinking(capsys, tmp_path, tokenizer):
    params = {"lengths": "512", "depths": "0.5", "samples": "1"}
    with Reasoner(tokenizer, nolima_answers(params)) as server:
        result = run(capsys, server, tmp_path, *NOLIMA, "-M", "thinking=think", "-M", "thinking_budget=64")
    assert result.code == 0, result.err
    _, records, summary = the_run(tmp_path)
    assert records and all(r["scores"]["correct"] and r["scores"]["mismatch_none"] for r in records)
    assert all(r["outputs"] == [r["target"][0], "none"] for r in records)  # one answer per request, thinking off
    assert summary["overall"]["correct"] == 1.0


def test_auto_turns_thinking_on_for_a_tokenizer_with_the_tags(capsys, tmp_path, tokenizer, needle_server):
    folder = tmp_path / "reasoner-tokenizer"
    with_tags = copy.deepcopy(tokenizer)
    with_tags.add_tokens(list(TAGS))
    with_tags.save_pretrained(folder)
    result = run(capsys, needle_server, tmp_path / "out", *NEEDLE, "-M", f"tokenizer={folder}",
                 "-M", "thinking_budget=64")
    assert result.code == 0, result.err
    config, records, _ = the_run(tmp_path / "out")
    assert config["thinking"]["from"] == "tokenizer vocabulary"
    assert all(r["scores"]["correct_all"] for r in records)


# ---- a run without thinking is unchanged -------------------------------------------------------


def test_a_run_without_thinking_keeps_its_hash_folder_and_records(capsys, tmp_path):
    needle = ("--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=1", "--no-progress")
    assert invoke(capsys, "run", "--model", "fake:oracle", *needle, "--out", str(tmp_path)).code == 0
    config, records, _ = the_run(tmp_path)
    assert "thinking" not in config  # nor in the hash: the identity every earlier run was hashed by
    identity = run_identity(config["task"], config["params"], config["limit"], config["model"],
                            config["task_versions"]["plan"])
    assert config["hash"] == config_hash(identity_with_step(identity, None))
    assert all("thinking_raw" not in r["info"] for r in records)
    before = (next(tmp_path.iterdir()) / "samples.jsonl").read_text()
    assert invoke(capsys, "run", "--model", "fake:oracle", "-M", "thinking=off", *needle, "--out", str(tmp_path)).code == 0
    assert len(list(tmp_path.iterdir())) == 1  # the same run: nothing added
    assert (next(tmp_path.iterdir()) / "samples.jsonl").read_text() == before


def test_the_hf_backend_takes_the_option_and_a_model_that_does_not_think_answers_as_before(capsys, tmp_path):
    """toy-base writes no tags: with thinking on, its answers (cut by the engine after generating
    on past the stop string) are those it gives with thinking off (cut by the backend)."""
    needle = ("--model", "toy-base", "--device", "cpu", *NEEDLE)
    assert invoke(capsys, "run", *needle, "--out", str(tmp_path / "off")).code == 0
    result = invoke(capsys, "run", *needle, "-M", "thinking=think", "--out", str(tmp_path / "on"))
    assert result.code == 0, result.err
    (_, off, _), (config, on, _) = the_run(tmp_path / "off"), the_run(tmp_path / "on")
    assert config["thinking"]["budget"] == 0 and config["hash"] != the_run(tmp_path / "off")[0]["hash"]
    assert [r["outputs"] for r in on] == [r["outputs"] for r in off]
    assert [r["scores"] for r in on] == [r["scores"] for r in off]


def test_bad_thinking_options_are_one_line_errors(capsys, tmp_path):
    for option, message in (("thinking=<x>,<x>", "-M thinking="), ("thinking_budget=-5", "thinking_budget"),
                            ("thinking_budget=8", "thinking is off for fake-oracle")):
        result = invoke(capsys, "run", "--model", "fake:oracle", "-M", option, *NEEDLE, "--out", str(tmp_path))
        assert result.code == 2 and message in result.err and "Traceback" not in result.err
    dry = invoke(capsys, "run", "--dry-run", "--model", "fake:oracle", "-M", "thinking=think", "--task", "needle",
                 "-T", "lengths=1024", "-T", "samples=1")
    assert dry.code == 0, dry.err


def test_a_suite_leaves_out_the_lengths_the_thinking_budget_leaves_no_room_for():
    from evalsuite.engine.suite_run import clipped

    task = make_task("needle", {"lengths": "1024,2048,4096"})
    kept, note = clipped(task, "lengths", 4096, 1024)
    assert kept.lengths == (1024, 2048)
    assert note == "lengths 4096 left out: over the model's context of 4096 tokens less -M thinking_budget=1024"
    assert clipped(task, "lengths", 4096)[1] is None  # no budget: every length fits, as before
