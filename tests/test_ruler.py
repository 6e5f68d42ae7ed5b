"""The ruler task: lm-eval's own RULER samples run through evalsuite's engine, made once per tokenizer.

Prompts are checked against lm-eval's generator functions called here directly, as lm-eval calls
them (seeded, the toy models' tokenizer loaded by name, essays read by `datasets.load_dataset`),
and built into lm-eval's plain prompt by lm-eval's own `build_qa_turn`; scores against lm-eval's
metric functions on hand-made outputs; a run end to end on the two toy models. Importing lm-eval's
needle module takes a while (it builds a word list of six million pairs): the tests share one import.
A second run on another checkpoint with the same tokenizer reads the samples from the generated-data
cache without importing lm-eval's RULER code, and writes the same records.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import os
import random
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import invoke

import evalsuite.models
from evalsuite.errors import UserError
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.tasks.ruler import stored
from evalsuite.tasks.ruler.calling import draws_after_seed, quiet
from evalsuite.tasks.ruler.task import Ruler
from evalsuite.types import Sample

TOY = Path(evalsuite.models.__file__).parent / "toy-base"
# lm-eval's generator of each sub-task (its YAML's custom_dataset) and the delimiter its YAML puts
# before gen_prefix, written out here rather than read the way the task reads them
LMEVAL = {"niah_single_1": ("niah_utils", "niah_single_1", " "), "niah_multikey_1": ("niah_utils", "niah_multikey_1", " "),
          "cwe": ("cwe_utils", "get_cw_dataset", "\n\n"), "fwe": ("fwe_utils", "fwe_download", " ")}
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


@pytest.fixture(scope="module")
def toy():
    """The toy models' tokenizer under the hf backend's token rules, without weights."""
    from transformers import AutoTokenizer

    from evalsuite.backends.common.tokens import TokenizerAdapter

    return TokenizerAdapter(AutoTokenizer.from_pretrained(TOY), chat_template=False)


@cache
def lmeval_docs(subtask: str, lengths: tuple[int, ...], seed: int = 0, numpy_seed: int = 1234) -> tuple[dict, ...]:
    """lm-eval's documents from its generator, called in this process as an lm-eval process calls it:
    seeded, then the draws its imports make after the seed (measured by the task: the test against a
    real lm-eval process below checks that number)."""
    module_name, function, _ = LMEVAL[subtask]
    module = importlib.import_module(f"lm_eval.tasks.ruler.{module_name}")
    if hasattr(module, "RNG"):  # cwe's shuffler as its import left it: Random(42) after shuffling the word list
        fresh = random.Random(42)
        fresh.shuffle(sorted(module.WORDS))
        module.RNG.setstate(fresh.getstate())
    random.seed(seed)
    np.random.seed(numpy_seed)
    python, numpy = draws_after_seed()
    for _ in range(python):
        random.getrandbits(32)
    for _ in range(numpy):
        np.random.bytes(4)
    with quiet():
        made = getattr(module, function)(max_seq_lengths=list(lengths), tokenizer=str(TOY))
    return tuple(dict(doc) for doc in made["test"])


def lmeval_prompt(subtask: str, doc: dict) -> str:
    """lm-eval's plain (no chat template) prompt of a document, by lm-eval's own code."""
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.api.utils import messages_to_text

    turn = ConfigurableTask.build_qa_turn(None, q=doc["input"], gen_prefix=doc["gen_prefix"],
                                          tgt_delim=LMEVAL[subtask][2], few_delim="")
    return messages_to_text(turn)


def checked_against_lmeval(task: Ruler, model, docs: tuple[dict, ...]) -> list[Sample]:
    state = task.prepare(model)
    planned = list(task.plan(state))
    (subtask,) = task.subtasks
    by_key = {(d["max_length"], d["index"]): d for d in docs}
    for length in task.lengths:  # the first `samples` of each length, in lm-eval's order
        first = [d["index"] for d in docs if d["max_length"] == length][: task.samples]
        assert [s.id for s in planned if s.axes["context_length"] == length] == [
            f"ruler-{subtask}-L{length}-s{task.seed}-{i:03d}" for i in first]
    for sample in planned:
        doc = by_key[(sample.axes["context_length"], int(sample.id.rsplit("-", 1)[1]))]
        assert sample.data["input"] == doc["input"] and sample.target == tuple(doc["outputs"])
        (request,), info = task.requests(sample, model, state)
        assert request.prompt == lmeval_prompt(subtask, doc)
        assert request.max_new_tokens == {"cwe": 120, "fwe": 50}.get(subtask, 128)  # the YAML's max_gen_toks
        assert info["prompt_tokens"] == model.count_tokens(request.prompt)
    return planned


@pytest.mark.parametrize(("subtask", "lengths", "seeds"), [
    ("niah_single_1", (512, 1024), (0, 1234)),  # lm-eval's default --seed
    ("cwe", (2048,), (0, 1234)),  # the toy tokenizer's 1024 holds no word list
    ("fwe", (1024, 512), (3, 7)),  # lengths in the order given, as lm-eval makes them
])
def test_prompts_are_lmeval_generators_for_the_seed_and_lengths(toy, subtask, lengths, seeds):
    task = Ruler(subtasks=(subtask,), lengths=lengths, samples=6, seed=seeds[0], numpy_seed=seeds[1])
    planned = checked_against_lmeval(task, toy, lmeval_docs(subtask, lengths, *seeds))
    assert len(planned) == 6 * len(lengths)


@pytest.mark.slow  # a real lm-eval process: importing its RULER code alone takes half a minute
def test_samples_are_those_of_a_real_lmeval_process(toy, tmp_path):
    """lm-eval itself builds its ruler_cwe task in a fresh process (its dummy model: only the samples are
    compared), with the draws its imports make after seeding; cwe's word draws never fall back into step
    once shifted, so one draw too many or too few shows."""
    (tmp_path / "tokenizers" / "punkt_tab").mkdir(parents=True)  # lm-eval would download it otherwise
    script = (f"import json, lm_eval\nout = lm_eval.simple_evaluate(model='dummy', tasks=['ruler_cwe'], metadata="
              f"{{'tokenizer': {str(TOY)!r}, 'max_seq_lengths': [2048]}}, samples={{'ruler_cwe': [0, 1, 2]}}, "
              "log_samples=True)\nprint(json.dumps([[s['doc']['input'], s['doc']['outputs']] "
              "for s in out['samples']['ruler_cwe']]))")
    env = {**os.environ, "NLTK_DATA": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    task = Ruler(subtasks=("cwe",), lengths=(2048,), samples=3)
    assert [[s.data["input"], list(s.target)] for s in task.plan(task.prepare(toy))] == expected


def test_generation_leaves_the_process_random_state_alone(toy):
    random.seed(11)
    np.random.seed(11)
    expected = (random.random(), np.random.random())
    random.seed(11)
    np.random.seed(11)
    Ruler(subtasks=("fwe",), lengths=(512,), samples=1).prepare(toy)
    assert (random.random(), np.random.random()) == expected


def test_essays_from_a_local_file_make_lmevals_prompts_from_the_same_text(toy, tmp_path, monkeypatch):
    """lm-eval reads the essays through `datasets.load_dataset("baber/paul_graham_essays")`, here a
    local dataset folder of that name; the task reads the same file with -T essays."""
    import nltk
    import pandas as pd
    from lm_eval.tasks.ruler import prepare_niah

    english = tmp_path / "nltk" / "tokenizers" / "punkt_tab" / "english"  # Punkt without learned parameters
    english.mkdir(parents=True)
    for name in PUNKT_FILES:
        (english / name).touch()
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk")])
    stream = builtin_sentences(random.Random(5))
    essays = tmp_path / "baber" / "paul_graham_essays" / "train.parquet"
    essays.parent.mkdir(parents=True)
    pd.DataFrame({"text": [" ".join(next(stream) for _ in range(300)) for _ in range(4)]}).to_parquet(essays)
    monkeypatch.chdir(tmp_path)
    prepare_niah.get_haystack.cache_clear()  # lm-eval caches the essays it read
    try:
        docs = lmeval_docs.__wrapped__("niah_multikey_1", (1024,))
    finally:
        prepare_niah.get_haystack.cache_clear()
    task = Ruler(subtasks=("niah_multikey_1",), lengths=(1024,), samples=4, essays=str(essays))
    planned = checked_against_lmeval(task, toy, docs)
    assert all(0 < s.axes["depth"] < 1 for s in planned) and len(planned) == 4


def squad_file(folder: Path, questions: int = 520) -> Path:
    """A file in SQuAD 2.0's layout (lm-eval's QA generator reads one question per sample index)."""
    rng = random.Random(9)
    stream = builtin_sentences(rng)
    articles = [{"paragraphs": [{"context": " ".join(next(stream) for _ in range(4)) + f" The code is K{i}.",
                                 "qas": [{"question": f"What is the code of paragraph {i}?", "is_impossible": False,
                                          "answers": [{"text": f"K{i}"}]}]} for i in range(j, j + 10)]}
                for j in range(0, questions, 10)]
    path = folder / "dev-v2.0.json"
    path.write_text(json.dumps({"data": articles}))
    return path


def test_qa_reads_a_local_squad_file_through_lmevals_reader(toy, tmp_path, monkeypatch):
    from lm_eval.tasks.ruler import qa_utils

    path = squad_file(tmp_path)
    task = Ruler(subtasks=("qa_squad",), lengths=(1024,), samples=3, squad=str(path))
    planned = list(task.plan(state := task.prepare(toy)))
    monkeypatch.setattr(qa_utils, "download_json", lambda url: json.loads(path.read_text()))  # lm-eval's own reader
    qa_utils.read_squad.cache_clear()
    random.seed(0)
    np.random.seed(1234)
    for _ in range(draws_after_seed()[0]):
        random.getrandbits(32)
    with quiet():
        docs = [dict(d) for d in qa_utils.get_squad(max_seq_lengths=[1024], tokenizer=str(TOY))["test"]][:3]
    qa_utils.read_squad.cache_clear()
    assert [(s.data["input"], s.target) for s in planned] == [(d["input"], tuple(d["outputs"])) for d in docs]
    (request,), _ = task.requests(planned[0], toy, state)
    assert request.prompt.endswith("Question: What is the code of paragraph 0? Answer:")  # the YAML's " " between
    assert request.max_new_tokens == 32 and "depth" not in planned[0].axes


def test_no_request_carries_an_answer_beyond_the_text_it_is_asked_about(toy):
    for subtask, lengths in (("niah_single_1", (512,)), ("fwe", (512,))):
        task = Ruler(subtasks=(subtask,), lengths=lengths, samples=5)
        state = task.prepare(toy)
        for sample in task.plan(state):
            (request,), _ = task.requests(sample, toy, state)
            around = request.prompt.replace(sample.data["input"], "")  # the question's side of the prompt
            assert not any(answer in around for answer in sample.target)
            assert all(answer in sample.data["input"] for answer in sample.target)  # retrieval: in the text
            assert request.choices is None and request.stop == ()


@pytest.mark.parametrize(("references", "output"), [
    (["7654321"], " 7654321."),
    (["7654321"], "765432 1"),
    (["ABCDE", "FGHIJ", "KLMNO"], "abcde, then FGHIJ"),  # case-insensitive, a share of the references
    (["bright-sun"], "\x00bright-sun\t"),  # control characters cleaned as lm-eval cleans them
    (["alpha", "beta"], ""),
    (["New York City", "NYC"], "It is nyc."),  # QA: one of several acceptable answers
])
def test_scores_are_lmevals_metric_functions(references, output):
    from lm_eval.tasks.ruler.common_utils import process_results, process_results_part

    doc = {"max_length": 4096, "outputs": references}
    for lmeval, part in ((process_results, False), (process_results_part, True)):
        sample = Sample(id="s", task="ruler", axes={}, target=tuple(references), data={"part": part})
        scores = Ruler().score(sample, [output])
        assert scores["score"] == lmeval(doc, [output])["4096"]
        assert scores["all_found"] == (scores["score"] == 1.0)
        assert scores["any_found"] == any(r.lower() in output.lower() for r in references)  # RULER's own QA rule


def test_missing_essays_are_one_line_and_a_nonzero_exit(tmp_path, capsys):
    common = ("run", "--model", "fake:echo", "--task", "ruler", "--out", str(tmp_path / "runs"))
    code, out, err = invoke(capsys, *common, "-T", "subtasks=niah_single_1,niah_multikey_1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "niah_multikey_1 needs the Paul Graham essays" in err and "-T essays=PATH" in err
    code, out, err = invoke(capsys, *common, "-T", "subtasks=qa_squad", "-T", f"squad={tmp_path / 'dev.json'}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no such file" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_essays_without_nltks_sentence_model_are_one_line(toy, tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # no punkt_tab anywhere
    (tmp_path / "essays.txt").write_text("One essay. It is short.")
    with pytest.raises(UserError, match="nltk.downloader punkt_tab"):
        Ruler(subtasks=("niah_single_2",), lengths=(512,), essays=str(tmp_path / "essays.txt")).prepare(toy)


def test_lengths_lmeval_would_loop_forever_on_are_refused(toy):
    with pytest.raises(UserError, match="vt cannot fit"):  # the toy tokenizer packs two characters a token
        Ruler(subtasks=("vt",), lengths=(4096,)).prepare(toy)
    with pytest.raises(UserError, match="without an answer at length 512"):  # cwe's empty word list
        Ruler(subtasks=("cwe",), lengths=(512,), samples=2).prepare(toy)


def test_two_toy_models_end_to_end_records_heatmaps_compare_and_per_cell_gate(tmp_path, capsys):
    code, out, err = invoke(capsys, "run", "--model", "toy-diff", "--model", "toy-base", "--task", "ruler",
                            "-T", "subtasks=niah_single_1,fwe", "-T", "lengths=512", "-T", "samples=4",
                            "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    runs = {name: next(tmp_path.glob(f"ruler-{name}-*")) for name in ("toy-diff", "toy-base")}
    expected = {f"ruler-{s}-L512-s0-{d['index']:03d}": hashlib.sha256(lmeval_prompt(s, d).encode()).hexdigest()
                for s in ("niah_single_1", "fwe") for d in lmeval_docs(s, (512,))[:4]}
    for run in runs.values():
        records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert {r["id"]: r["prompt"]["sha256"] for r in records} == expected  # lm-eval's prompts, hash for hash
        assert all(set(r["scores"]) == {"score", "all_found", "any_found"} and not r["error"] for r in records)
        assert all(("depth" in r["axes"]) == r["id"].startswith("ruler-niah") for r in records)
        summary = json.loads((run / "summary.json").read_text())
        assert set(summary["lmeval_scores"]) == {"niah_single_1", "fwe"}
        for subtask in ("niah_single_1", "fwe"):
            assert (run / "plots" / f"heatmap_subtask{subtask}.png").stat().st_size > 1000
    folder = Path(out.split("comparison: ")[1].split()[0])
    for subtask in ("niah_single_1", "fwe"):
        for name in (f"heatmap_pair_subtask{subtask}.png", f"heatmap_diff_subtask{subtask}.png"):
            assert (folder / name).stat().st_size > 1000, name
    code, out, err = invoke(capsys, "check", str(runs["toy-base"]), "--baseline", str(runs["toy-diff"]))
    assert code in (0, 1), err
    assert "subtask=fwe, context_length=512" in out and "subtask=niah_single_1, context_length=512, depth=" in out


CACHED_RUN = ("--task", "ruler", "-T", "subtasks=fwe", "-T", "lengths=512", "-T", "samples=3", "--no-progress")
# what a record holds of the model that wrote it; everything else is the task's
MODEL_FIELDS = {"model", "run", "outputs", "scores", "error"}
SECOND_RUN = textwrap.dedent("""
    import json, sys
    from evalsuite.cli import main

    sys.argv, code = ["evalsuite", *sys.argv[1:]], 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
    print(json.dumps({"code": code, "imported": sorted(m for m in sys.modules if m.startswith(("lm_eval", "nltk")))}))
""")


def task_fields(run) -> list[dict]:
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return [{k: v for k, v in record.items() if k not in MODEL_FIELDS} for record in records]


def test_a_second_checkpoint_with_the_same_tokenizer_reads_the_samples_without_lmevals_ruler(tmp_path, monkeypatch,
                                                                                             capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("EVALSUITE_CACHE", str(cache))
    code, _, err = invoke(capsys, "run", "--model", "toy-diff", *CACHED_RUN, "--out", str(tmp_path / "first"))
    assert code == 0, err
    assert len(list((cache / stored.KIND).rglob("*.json.gz"))) == 1  # an entry per sub-task
    done = subprocess.run([sys.executable, "-c", SECOND_RUN, "run", "--model", "toy-base", *CACHED_RUN,
                           "--out", str(tmp_path / "second")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "EVALSUITE_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["code"] == 0, done.stderr[-2000:]
    assert not [m for m in second["imported"] if m.startswith(("lm_eval.tasks", "nltk"))], second["imported"]
    (first_run,), (second_run,) = (list((tmp_path / name).glob("ruler-*")) for name in ("first", "second"))
    first_fields = task_fields(first_run)
    assert task_fields(second_run) == first_fields and len(first_fields) == 3
    assert {r["prompt"]["sha256"] for r in first_fields} and all(r["info"]["prompt_tokens"] for r in first_fields)


def test_a_damaged_entry_is_generated_again_with_one_line_and_the_same_samples(tmp_path, monkeypatch, capsys):
    from evalsuite.backends import load_model

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path))
    model = load_model("toy-base", {}, device="cpu", batch_size=1)
    task = Ruler(subtasks=("fwe",), lengths=(512,), samples=4)
    made = list(task.plan(task.prepare(model)))
    (entry,) = tmp_path.rglob("*.json.gz")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    capsys.readouterr()
    again = list(task.plan(task.prepare(model)))
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "damaged" in err
    assert again == made
    with gzip.open(entry, "rt") as stream:  # whole again
        assert len(json.load(stream)["value"]["docs"]) == 500


class Counting:
    """A model as the key reads it: its tokenizer, its count and whether prompts are chat-templated."""

    def __init__(self, tokenizer, chat_template: bool):
        from evalsuite.backends.common.tokens import TokenRules

        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.rules = TokenRules(tokenizer, chat_template)

    def count_tokens(self, text: str) -> int:
        return self.rules.count(text)


def test_the_key_holds_the_tokenizers_content_its_counting_and_the_data(toy_tokenizer):
    from evalsuite.tasks.ruler.stand_ins import LocalData

    plain = Counting(toy_tokenizer, False)
    key = stored.sample_key("fwe", (512,), (0, 1234), plain, LocalData(), False, 1)
    assert key is not None and key == stored.sample_key("fwe", (512,), (0, 1234), plain, LocalData(), False, 1)
    for other in (stored.sample_key("fwe", (512,), (0, 1234), Counting(toy_tokenizer, True), LocalData(), False, 1),
                  stored.sample_key("fwe", (1024, 512), (0, 1234), plain, LocalData(), False, 1),
                  stored.sample_key("fwe", (512,), (0, 7), plain, LocalData(), False, 1),
                  stored.sample_key("fwe", (512,), (0, 1234), plain, LocalData(essays=("An essay.",)), False, 1),
                  stored.sample_key("fwe", (512,), (0, 1234), plain, LocalData(), False, 2)):
        assert other is not None and other != key
    assert stored.sample_key("fwe", (512,), (0, 1234), object(), LocalData(), False, 1) is None  # no tokenizer shown
