"""Prefix reuse in the hf backend: the same answers and log-likelihoods as encoding every
prompt whole, one prefix encoding per block, kept across calls and replaced by the next."""

from __future__ import annotations

import json
import random

import pytest

from evalsuite.types import GenerationRequest, LoglikelihoodRequest

WORDS = "the city river tower magic number question answer type location human where who how many".split()


def _block(rng: random.Random, shots: int) -> str:
    labels = ("location", "human", "number")
    return "".join(f"Question: {' '.join(rng.choices(WORDS, k=rng.randint(3, 10)))}\nType: {rng.choice(labels)}\n\n"
                   for _ in range(shots))


def _workload(seed: int = 0) -> tuple[list[GenerationRequest], list[LoglikelihoodRequest]]:
    """Two demonstration blocks, questions of varied length, constrained and free answers."""
    rng = random.Random(seed)
    blocks = [_block(rng, 8), _block(rng, 12)]
    questions = [f"Question: {' '.join(rng.choices(WORDS, k=rng.randint(1, 14)))}\nType:" for _ in range(5)]
    choices = (" location", " human", " number", " num")
    generation = [GenerationRequest(prompt=q, prefix=b, max_new_tokens=4, choices=choices if i % 3 else None,
                                    stop=("\n",)) for b in blocks for i, q in enumerate(questions)]
    loglik = [LoglikelihoodRequest(context=q, continuation=c, prefix=b) for b in blocks for q in questions[:3]
              for c in choices]
    return generation, loglik


def _load(folder, prefix_cache: bool, batch_size: int):
    from evalsuite.backends.hf import HFModel

    return HFModel.load(str(folder), {"prefix_cache": str(prefix_cache).lower()}, device="cpu",
                        batch_size=batch_size)


@pytest.mark.parametrize("kind", ["base", "diff"])
def test_prefix_reuse_gives_identical_predictions_and_loglikelihoods(tiny_models, kind):
    generation, loglik = _workload()
    results = {}
    for cache, batch in ((False, 1), (True, 1), (True, 3)):
        model = _load(tiny_models[kind], cache, batch)
        # the runner's way: a few requests per call, blocks kept together
        answers = [a for start in range(0, len(generation), 4) for a in model.generate(generation[start:start + 4])]
        scores = model.loglikelihood(loglik)
        results[(cache, batch)] = (answers, scores)
    reference_answers, reference_scores = results[(False, 1)]
    assert len(set(reference_answers)) > 1  # the check compares something
    for key, (answers, scores) in results.items():
        assert answers == reference_answers, key
        for got, want in zip(scores, reference_scores):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4), key
            assert (got.is_greedy, got.tokens) == (want.is_greedy, want.tokens), key


def test_one_encoding_per_prefix_kept_across_calls_and_replaced(tiny_models):
    model = _load(tiny_models["diff"], True, 2)
    encoded = []
    original = model.prefix_cache.encode_prefix

    def counting(prefix: str, attention):
        encoded.append(prefix)
        return original(prefix, attention)

    model.prefix_cache.encode_prefix = counting
    generation, _ = _workload()
    first, second = generation[0].prefix, generation[-1].prefix
    model.generate(generation[:2])
    model.generate(generation[2:5])  # the rest of the first block: no new encoding
    assert encoded == [first]
    state = model.prefix_cache.current
    assert state.text == first and state.length == len(model.encode(first))
    assert state.cache.get_seq_length() == state.length  # cropped back after every batch
    model.generate(generation[3:7])  # the block changes mid-call: the first block's questions come first
    assert encoded == [first, second] and model.prefix_cache.current.text == second
    model.loglikelihood([LoglikelihoodRequest(context="Question: x\nType:", continuation=" human", prefix=second)])
    assert encoded == [first, second]


def test_without_prefix_cache_nothing_is_cached(tiny_models):
    model = _load(tiny_models["base"], False, 4)
    generation, _ = _workload()
    model.generate(generation[:4])
    assert model.prefix_cache.current is None


def test_loglikelihood_icl_run_is_the_same_with_and_without_prefix_reuse(tiny_models, tmp_path):
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    data = tmp_path / "data.jsonl"
    rng = random.Random(3)
    with data.open("w") as fh:
        for i in range(40):
            label = ("location", "human", "number", "entity")[i % 4]
            fh.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=6)) + "?", "label": label}) + "\n")
    task = make_task("icl", {"data": str(data), "shots": "2,8", "permutations": "2", "test_size": "4",
                             "method": "loglikelihood"})
    runs = [run_task(task, _load(tiny_models["diff"], cache, 4), RunOptions(out=tmp_path / str(cache), progress=False))
            for cache in (True, False)]
    assert runs[0].path.name == runs[1].path.name  # prefix reuse is not part of the run's identity
    cached, whole = ([json.loads(line) for line in run.samples_path.read_text().splitlines()] for run in runs)
    assert len(cached) == 2 * 2 * 4 and all(r["axes"]["method"] == "loglikelihood" for r in cached)
    assert [r["scores"] for r in cached] == [r["scores"] for r in whole]
    for a, b in zip(cached, whole):
        assert len(a["outputs"]) == 4  # one log-likelihood per label
        for x, y in zip(a["outputs"], b["outputs"]):
            assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)


def test_attention_quantization_keeps_results_exact(tiny_models):
    """Row-wise logit quantization sees the same keys either way, so the cache stays on and
    exact; a scale shared by query rows (tensor) would not, so the cache steps aside."""
    from evalsuite.backends.hf import HFModel

    generation, _ = _workload(1)
    outputs = {}
    for granularity, cache in (("row", True), ("row", False), ("tensor", True)):
        model = HFModel.load(str(tiny_models["diff"]), {"prefix_cache": str(cache).lower(), "attn_quant": "absmax:4",
                                                        "attn_quant_granularity": granularity}, device="cpu",
                             batch_size=3)
        outputs[(granularity, cache)] = model.generate(generation[:4])
        assert (model.prefix_cache.current is not None) == (cache and granularity == "row")
    assert outputs[("row", True)] == outputs[("row", False)]


# ---- automatic sharing: rows that begin alike, whatever the task ----------------------------


def test_shared_beginnings_are_found_and_rows_keep_the_tokens_they_need():
    from evalsuite.backends.hf.prefix_share import plan_sharing

    trunk = list(range(100, 140))
    rows = [trunk + [1, 2, 3], trunk + [1, 2, 4], trunk[:30] + [7, 8], [5] * 50, trunk[:20]]
    plan = plan_sharing(rows, [1, 1, 1, 1, 5], min_tokens=16, budget=10_000)
    # rows 0 and 1 share 42 tokens, row 2 shares 30 with them, row 3 nothing, row 4 keeps 5 of its 20
    assert plan.shared == [42, 42, 30, 0, 0]  # row 4 could share 15 tokens: under the minimum
    assert plan.anchors == [trunk + [1, 2]]  # row 2's beginning is the start of that anchor
    assert plan.anchor_of[:4] == [0, 0, 0, -1]
    assert plan_sharing(rows, [1] * 5, min_tokens=16, budget=10).any is False  # anchors over the budget
    # a beginning under a fifth of its row is dropped: running the row past it would cost more
    long_rows = [trunk[:19] + [k] * 81 for k in (1, 2)]  # 19 of 100 tokens in common
    assert plan_sharing(long_rows, [1, 1], min_tokens=16, budget=10_000).shared == [0, 0]
    assert plan_sharing([r[:95] for r in long_rows], [1, 1], min_tokens=16, budget=10_000).shared == [19, 19]


@pytest.mark.parametrize("kind", ["base", "diff"])
def test_shared_beginnings_give_the_answers_of_whole_prompts(tiny_models, kind):
    rng = random.Random(5)
    shared = " ".join(rng.choices(WORDS, k=40))
    prompts = [shared + " " + " ".join(rng.choices(WORDS, k=rng.randint(0, 12))) for _ in range(7)]
    prompts += [" ".join(rng.choices(WORDS, k=30))]  # shares nothing
    generation = [GenerationRequest(prompt=p, max_new_tokens=6) for p in prompts]
    loglik = [LoglikelihoodRequest(context=p, continuation=c) for p in prompts[:3] for c in (" city", " magic number")]
    results = {}
    for cache in (False, True):
        model = _load(tiny_models[kind], cache, 3)
        results[cache] = (model.generate(generation), model.loglikelihood(loglik), model.prefilled_tokens)
    (answers, scores, whole), (shared_answers, shared_scores, prefilled) = results[False], results[True]
    assert shared_answers == answers
    for got, want in zip(shared_scores, scores):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert (got.is_greedy, got.tokens) == (want.is_greedy, want.tokens)
    assert prefilled < whole


def _hellaswag_fixture(folder, docs: int = 6, endings: int = 5):
    from evalsuite.tasks.kit.filler import builtin_sentences

    rng = random.Random(11)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(docs):
        sentences = builtin_sentences(rng)
        lines.append(json.dumps({"ind": i, "activity_label": "Village life", "ctx_a": next(sentences),
                                 "ctx_b": "then the baker", "ctx": "", "source_id": f"doc{i}", "split": "val",
                                 "endings": [next(sentences).lower() for _ in range(endings)],
                                 "split_type": "indomain", "label": str(i % endings)}))
    (folder / "hellaswag.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_five_choice_zero_shot_prefills_each_context_once(tiny_models, tmp_path):
    pytest.importorskip("lm_eval")
    from evalsuite.engine.runner import RunOptions, run_task
    from evalsuite.tasks.zeroshot.task import ZeroShot

    data = _hellaswag_fixture(tmp_path / "data")
    runs, models = {}, {}
    for cache in (True, False):
        models[cache] = _load(tiny_models["diff"], cache, 4)
        runs[cache] = run_task(ZeroShot(benchmarks=("hellaswag",), data_dir=str(data)), models[cache],
                               RunOptions(out=tmp_path / str(cache), progress=False, chunk=4))
    shared, whole = ([json.loads(line) for line in run.samples_path.read_text().splitlines()] for run in runs.values())
    assert len(shared) == 6 and all(len(r["outputs"]) == 5 for r in shared)
    for a, b in zip(shared, whole):  # everything but the last bits of a float32 sum is the same
        assert {k: v for k, v in a.items() if k != "outputs"} == {k: v for k, v in b.items() if k != "outputs"}
        for x, y in zip(a["outputs"], b["outputs"]):
            assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)
            assert (x["is_greedy"], x["tokens"]) == (y["is_greedy"], y["tokens"])
    # each context runs once (but its last token, whose logits predict each choice's first),
    # each choice its own tokens; the label every context starts with runs once per call
    from evalsuite.backends.hf.prefix_share import common_length

    task = ZeroShot(benchmarks=("hellaswag",), data_dir=str(data))
    state = task.prepare(models[True])
    model = models[True]
    contexts, choices, calls = 0, 0, [[]]
    for sample in task.plan(state):
        requests, _ = task.requests(sample, model, state)
        split = [model.tokens.split_continuation(r) for r in requests]
        assert len({c for c, _ in split}) == 1  # one context under five endings
        context = model.encode(split[0][0])[:-1]
        contexts += len(context)
        choices += sum(len(ids) for _, ids in split)
        calls[-1].append(context)
        if len(calls[-1]) == 4:  # the runner's chunk: one loglikelihood call
            calls.append([])
    label = sum(common_length(a, b) for call in calls for a, b in zip(sorted(call), sorted(call)[1:]))
    assert model.prefilled_tokens == contexts - label + choices
    assert models[False].prefilled_tokens == 5 * contexts + choices


@pytest.mark.slow
def test_needle_quickstart_records_are_byte_identical_without_prefix_cache(tmp_path):
    """The quickstart's needle run (depths 0 to 1) on toy-diff: the instruction every prompt
    starts with is under a fifth of each prompt, so sharing it would cost more than it saves and
    every row runs whole; the records are the same bytes either way."""
    from evalsuite.backends import load_model
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    task = {"lengths": "256,1024", "depths": "0,0.25,0.5,0.75,1"}
    records, prefilled = {}, {}
    for cache in (True, False):
        model = load_model("toy-diff", {"prefix_cache": str(cache).lower()}, device="cpu", batch_size=8)
        run = run_task(make_task("needle", task), model, RunOptions(out=tmp_path / str(cache), progress=False))
        records[cache], prefilled[cache] = run.samples_path.read_bytes(), model.prefilled_tokens
    assert records[True] == records[False] and len(records[True].splitlines()) == 40
    assert prefilled[True] == prefilled[False]
