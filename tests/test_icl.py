"""The icl task: data loading, prompts, label shortening, orders, the spread statistic,
constrained decoding, the done-when run and each bad input through the CLI."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import invoke

from evalsuite.backends.fake import FakeModel
from evalsuite.engine.runner import make_task
from evalsuite.errors import UserError
from evalsuite.tasks.icl import order
from evalsuite.tasks.icl.data import Example, arrange, balanced_pool, trec_readable
from evalsuite.tasks.icl.task import question, resolve_answer, shortest_unique_prefixes

CLASSES = ("location", "human", "number", "entity", "description", "abbreviation")
TEMPLATES = {
    "location": "Where is {}?", "human": "Who built {}?", "number": "How many {} are there?",
    "entity": "What kind of thing is {}?", "description": "Why is {} famous?", "abbreviation": "What does {} stand for?",
}
THINGS = ("the river", "the tower", "a comet", "the museum", "NASA", "a violin", "the desert", "gold", "the bridge")


def write_trec(path: Path, rows: int = 120, classes: tuple[str, ...] = CLASSES, text: str = "text",
               label: str = "label", split: bool = False) -> Path:
    """A trec-style jsonl: one question per line, classes in turn."""
    rng = random.Random(len(classes) * 1000 + rows)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(rows):
            name = classes[i % len(classes)]
            row = {text: TEMPLATES.get(name, "What about {}?").format(rng.choice(THINGS)), label: name}
            if split:
                row["split"] = "test" if i % 4 == 0 else "train"
            fh.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def trec_file(tmp_path_factory) -> Path:
    return write_trec(tmp_path_factory.mktemp("icl") / "trec.jsonl")


def fake() -> FakeModel:
    return FakeModel.from_options("oracle", {})


# ---- label shortening and answers -------------------------------------------------------------

@pytest.mark.parametrize("labels, expected", [
    ([" location", " human", " number"], [" l", " h", " n"]),
    ([" number", " num", " name"], [" numb", " num", " na"]),  # ' num' begins ' number': stays whole
    ([" entity animal", " entity body", " entity"], [" entity a", " entity b", " entity"]),
    ([" abc", " abd"], [" abc", " abd"]),
])
def test_shortest_unique_prefix_with_one_token_per_character(labels, expected):
    assert shortest_unique_prefixes(labels, list) == expected


def test_shortest_unique_prefix_cuts_at_the_models_token_boundaries(toy_tokenizer):
    def tokenize(text: str) -> list[int]:
        return toy_tokenizer(text, add_special_tokens=False)["input_ids"]

    labels = [" " + trec_readable(n) for n in ("LOC:city", "LOC:country", "LOC:other", "NUM:count", "NUM:date",
                                               "HUM:ind", "HUM:gr", "ENTY:animal", "DESC:def")]
    shorts = shortest_unique_prefixes(labels, tokenize)
    assert len(set(shorts)) == len(labels)
    for label, short in zip(labels, shorts):
        assert label.startswith(short)
        tokens, short_tokens = tokenize(label), tokenize(short)
        assert short_tokens == tokens[: len(short_tokens)]  # a whole-token prefix of the label
        assert not any(o != label and o.startswith(short) for o in labels)
        if short != label:  # one token fewer would no longer identify the label
            shorter = [label[:end] for end in range(1, len(short))
                       if tokenize(label[:end]) == tokens[: len(short_tokens) - 1]]
            assert all(any(o != label and o.startswith(s) for o in labels) for s in shorter)
    assert shorts[0] != labels[0]  # 'location city' needs fewer tokens than it has


def test_resolve_answer_maps_prefixes_back_to_labels():
    labels = ("number", "num", "location")
    assert resolve_answer(" num", labels) == "num"
    assert resolve_answer(" numb", labels) == "number"
    assert resolve_answer(" loc", labels) == "location"
    assert resolve_answer(" x", labels) is None


# ---- data -------------------------------------------------------------------------------------

def test_local_jsonl_held_out_split_and_test_sample(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "4", "test_size": "20"})
    state = task.prepare(None)
    data = state.data
    assert data.labels == tuple(sorted(CLASSES))
    assert len(data.test) == 20 and len(data.train) == 100
    assert not {e.index for e in data.test} & {e.index for e in data.train}
    assert data.fields == ("Question", "Type")
    again = make_task("icl", {"data": str(trec_file), "shots": "4", "test_size": "20"})
    assert [e.index for e in again.prepare(None).test] == [e.index for e in state.test]
    other_seed = make_task("icl", {"data": str(trec_file), "shots": "4", "test_size": "20", "seed": "1"})
    assert [e.index for e in other_seed.prepare(None).test] != [e.index for e in state.test]


def test_local_csv_and_parquet_with_split_column_and_field_names(tmp_path):
    source = write_trec(tmp_path / "rows.jsonl", rows=48, text="utterance", label="intent", split=True)
    frame = pd.read_json(source, lines=True)
    for path in (tmp_path / "rows.csv", tmp_path / "rows.parquet"):
        frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path)
        task = make_task("icl", {"data": str(path), "text_field": "utterance", "label_field": "intent",
                                 "shots": "2", "test_size": "5"})
        state = task.prepare(None)
        data = state.data
        assert (len(data.train), len(data.test)) == (36, 12)
        assert data.split_rule == "split column"
        assert len(state.test) == 5
        assert data.train[0].text == frame["utterance"][1] and data.train[0].label == frame["intent"][1]


def test_pool_is_label_balanced_and_nested(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "4"})
    state = task.prepare(None)
    pool = state.pool
    assert sorted(e.index for e in pool) == sorted(e.index for e in state.data.train)
    for n in (1, 5, 6, 13, 50):
        counts = Counter(e.label for e in pool[:n])
        assert max(counts.values()) - min(counts.values()) <= 1
        assert len(counts) == min(n, len(CLASSES))
    assert balanced_pool(state.data.train, seed=0) == pool
    assert balanced_pool(state.data.train, seed=1) != pool


# ---- orders and prompts -----------------------------------------------------------------------

def _demos(n_per_class: int = 3) -> list[Example]:
    return [Example(i, f"q{i}", CLASSES[i % 4]) for i in range(4 * n_per_class)]


def test_random_order_is_a_seeded_shuffle_of_the_same_demonstrations():
    demos = _demos()
    first, again = arrange(demos, "random", random.Random(1)), arrange(demos, "random", random.Random(1))
    other = arrange(demos, "random", random.Random(2))
    assert first == again and first != other and first != demos
    assert sorted(first, key=lambda e: e.index) == demos == sorted(other, key=lambda e: e.index)


def test_grouped_order_keeps_each_class_together():
    for seed in range(5):
        labels = [e.label for e in arrange(_demos(), "grouped", random.Random(seed))]
        blocks = [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]
        assert len(blocks) == 4 and sorted(blocks) == sorted(set(labels))


def test_alternating_order_cycles_through_the_classes():
    orders = set()
    for seed in range(5):
        labels = [e.label for e in arrange(_demos(), "alternating", random.Random(seed))]
        cycle = labels[:4]
        assert len(set(cycle)) == 4 and labels == cycle * 3
        orders.add(tuple(cycle))
    assert len(orders) > 1  # permutations change the class order too


def test_permutations_share_demonstrations_and_the_prompt_format(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "6", "permutations": "3", "order": "grouped"})
    state = task.prepare(fake())
    blocks = [task.prefix(state, 6, p) for p in range(3)]
    assert len(set(blocks)) > 1
    assert len({frozenset(b.split("\n==\n")) for b in blocks}) == 1  # same demonstrations, other order
    demos = blocks[0].split("\n==\n")  # the cited protocol's separator line
    assert demos[-1] == "" and len(demos) == 7
    for demo in demos[:-1]:
        q, t = demo.split("\n")
        assert q.startswith("Question: ") and t.removeprefix("Type: ") in CLASSES
    sample = next(task.plan(state))
    requests, info = task.requests(sample, fake(), state)
    (request,) = requests
    assert request.prefix is task.prefix(state, 6, 0)  # one shared string per block
    assert request.prompt == question(sample.data["text"], ("Question", "Type")) and request.prompt.endswith("\nType:")
    assert request.choices == (" a", " d", " e", " h", " l", " n")  # one byte per token on the fake model
    assert info["prompt_tokens"] == fake().count_tokens(request.prefix + request.prompt)


def test_plan_keeps_each_blocks_questions_together(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "1,4", "permutations": "2", "test_size": "5"})
    samples = list(task.plan(task.prepare(fake())))
    blocks = [(s.axes["n_shots"], s.axes["permutation"]) for s in samples]
    assert blocks == [(n, p) for n in (1, 4) for p in range(2) for _ in range(5)]
    assert len({s.id for s in samples}) == 20


def test_the_plan_needs_no_model_unless_shots_are_fitted_to_one(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "1,4", "permutations": "2", "test_size": "5"})
    fields = dict(vars(task))
    without = list(task.plan(task.prepare(None)))
    assert [s.id for s in without] == [s.id for s in task.plan(task.prepare(fake()))]
    assert vars(task) == fields  # the frozen task keeps no state of its runs
    with pytest.raises(UserError, match="prepared with the model"):
        task.requests(without[0], fake(), task.prepare(None))
    auto = make_task("icl", {"data": str(trec_file), "shots": "auto"})
    with pytest.raises(UserError, match="shots=auto fits the shot counts to a model's context"):
        next(auto.plan(auto.prepare(None)))
    with pytest.raises(UserError, match="more than the 60 demonstrations"):  # no model needed to know that
        make_task("icl", {"data": str(trec_file), "shots": "500"}).prepare(None)


def test_auto_shots_are_powers_of_two_then_the_last_count_that_fits(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "auto", "max_tokens": "700", "permutations": "2"})
    model = fake()
    state = task.prepare(model)
    counts = state.shot_counts
    assert counts[:-1] == tuple(2**k for k in range(len(counts) - 1)) and len(counts) >= 3
    assert counts == (1, 2, 4, 8, 12)
    # the sweep ends at the limit, not at the power of two below it
    assert task.needed_tokens(state, model, counts[-1]) <= 700 < task.needed_tokens(state, model, counts[-1] + 1)


# ---- scoring and the spread statistic ---------------------------------------------------------

def test_scores_both_methods(trec_file):
    from evalsuite.types import Loglikelihood

    task = make_task("icl", {"data": str(trec_file), "shots": "1", "method": "loglikelihood"})
    state = task.prepare(None)
    sample = next(task.plan(state))
    labels = state.data.labels
    target = labels.index(sample.target[0])
    outputs = [Loglikelihood(logprob=-5.0 + (i == target) * 3, is_greedy=False, tokens=1) for i in range(len(labels))]
    assert task.score(sample, outputs) == {"correct": True, "predicted": sample.target[0]}
    generate = make_task("icl", {"data": str(trec_file), "shots": "1"})
    assert generate.score(sample, [" " + sample.target[0][:2]])["correct"]
    assert not generate.score(sample, [" zz"])["correct"]


def test_summary_mean_spread_and_std_over_permutations(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "4"})
    outcomes = {0: [1, 1, 1, 1], 1: [1, 1, 0, 0], 2: [0, 1, 0, 0]}  # accuracies 1.0, 0.5, 0.25
    rows = [{"order": "random", "n_shots": 4, "permutation": p, "test_index": t, "correct": bool(v), "prompt_tokens": 100}
            for p, values in outcomes.items() for t, v in enumerate(values)]
    rows += [{"order": "random", "n_shots": 8, "permutation": 0, "test_index": t, "correct": t < 3, "prompt_tokens": 200}
             for t in range(4)]
    (four, eight) = task.summary(pd.DataFrame(rows), None)["icl"]["shots"]
    assert four["accuracy"] == [1.0, 0.5, 0.25]
    assert four["mean"] == pytest.approx(7 / 12) and four["spread"] == pytest.approx(0.75)
    assert four["std"] == pytest.approx(pd.Series([1.0, 0.5, 0.25]).std(ddof=1))
    assert (four["best_permutation"], four["worst_permutation"]) == (0, 2)
    # Cochran's Q: column totals 4, 2, 1, row totals 2, 3, 1, 1: Q = 2 (3 * 21 - 49) / (21 - 15) = 14/3
    assert four["order_p_value"] == pytest.approx(math.exp(-(14 / 3) / 2))  # chi2 with 2 df
    assert four["mean_low"] < four["mean"] < four["mean_high"]
    assert eight["spread"] == 0 and eight["std"] is None and eight["mean"] == 0.75
    # no label column (a run recorded before it was): each question is its own cluster, and the
    # permutation test is exact here, (3!)^4 = 1296 arrangements: count them
    assert (four["order_cluster"], four["order_clusters"]) == ("test_index", 4)
    matrix = np.array([outcomes[p] for p in range(3)], dtype=float).T
    arrangements = [np.sum(np.sum([row[list(shuffle)] for row, shuffle in zip(matrix, pick)], axis=0) ** 2)
                    for pick in itertools.product(itertools.permutations(range(3)), repeat=4)]
    observed = np.sum(matrix.sum(axis=0) ** 2)
    assert four["order_cluster_p_value"] == pytest.approx(np.mean(np.array(arrangements) >= observed))
    assert four["order_p_holm"] == four["order_cluster_p_value"]  # the only row tested
    assert eight["order_cluster_p_value"] is None and eight["order_p_holm"] is None  # one permutation
    assert four["spread_noise_floor"] == pytest.approx(
        order.expected_range(3) * math.sqrt(matrix.var(axis=1).sum() * 3 / 2) / 4)


# ---- the order statistics: clustered questions, Holm over shot counts, two models -------------

def topic_outcomes(rng: np.random.Generator, runs: int, topics: int, sd: float, effect: float = 0.0,
                   mean: float = 0.5, questions: int = 250, permutations: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(runs x questions x permutations) 0/1 outcomes: question i in topic i mod `topics`, right with
    probability sigmoid(difficulty + topic x permutation effect (sd) + order effect (effect))."""
    topic = np.arange(questions) % topics
    logit = (rng.normal(mean, 1.0, size=(runs, questions, 1))
             + rng.normal(0.0, sd, size=(runs, topics, permutations))[:, topic]
             + rng.normal(0.0, effect, size=(runs, 1, permutations)))
    return (rng.random(logit.shape) < 1 / (1 + np.exp(-logit))).astype(float), topic


@pytest.mark.parametrize("topics, sd, effect, q_rate, cluster_rate", [
    # questions of a topic share each permutation's effect, mean zero over topics: no order effect
    (25, 1.0, 0.0, (0.45, 0.80), (0.0, 0.10)),
    (6, 1.0, 0.0, (0.85, 1.00), (0.0, 0.10)),
    (25, 0.0, 0.0, (0.0, 0.10), (0.0, 0.10)),  # independent questions: both hold
    # a real order effect, the same for every question: the cluster test sees it
    (25, 0.0, 0.3, (0.90, 1.00), (0.90, 1.00)),
])
def test_the_cluster_order_test_holds_its_level_where_cochrans_q_does_not(topics, sd, effect, q_rate, cluster_rate):
    from evalsuite.analysis.stats import cochran_q

    runs = 120
    outcomes, topic = topic_outcomes(np.random.default_rng(topics + int(10 * sd) + int(100 * effect)), runs, topics,
                                     sd, effect)
    q = np.mean([cochran_q(x)["p_value"] < 0.05 for x in outcomes])
    cluster = np.mean([order.order_test(x, topic, resamples=199, seed=r)["p_value"] < 0.05
                       for r, x in enumerate(outcomes)])
    assert q_rate[0] <= q <= q_rate[1] and cluster_rate[0] <= cluster <= cluster_rate[1], (q, cluster)


def test_order_test_edge_cases():
    same = np.tile(np.array([[1.0], [0.0], [1.0]]), (1, 4))
    assert order.order_test(same, [0, 1, 2])["p_value"] == 1.0  # no question changes with the order
    assert math.isnan(order.order_test(np.eye(3), [0, 0, 0])["p_value"])  # one cluster: nothing to compare
    with_missing = np.array([[1, 0, 1], [np.nan, 1, 0], [0, 1, 1]], dtype=float)
    totals, counts = order.cluster_totals(with_missing, ["x", "y", "x"])
    assert totals.tolist() == [[1, 1, 2]] and counts.tolist() == [2]  # the incomplete question is left out


@pytest.mark.parametrize("k, expected", [(2, 2 / math.sqrt(math.pi)), (3, 3 / math.sqrt(math.pi)), (10, 3.0775)])
def test_expected_range_of_normals(k, expected):
    assert order.expected_range(k) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("topics, mean, permutations", [(250, 0.5, 10), (250, 2.5, 10), (25, 0.5, 3), (6, 0.0, 10)])
def test_noise_floor_is_the_mean_spread_of_shuffled_clusters(topics, mean, permutations):
    rng = np.random.default_rng(topics + permutations)
    (x,), topic = topic_outcomes(rng, 1, topics, 0.3, 0.2, mean, permutations=permutations)
    totals, counts = order.cluster_totals(x, topic)
    shuffled = np.take_along_axis(np.broadcast_to(totals, (4000, *totals.shape)),
                                  np.argsort(rng.random((4000, *totals.shape)), axis=-1), axis=-1)
    simulated = order.spread(shuffled, np.broadcast_to(counts, (4000, counts.size))).mean()
    assert float(order.noise_floor(totals, counts)) == pytest.approx(simulated, rel=0.05)


def order_frame(outcomes: np.ndarray, topic: np.ndarray, shots: tuple[int, ...]) -> pd.DataFrame:
    """A run's frame from (shot counts x questions x permutations) outcomes."""
    rows = [{"id": f"{n}-{p}-{t}", "order": "random", "n_shots": n, "permutation": p, "test_index": t,
             "label": f"class {topic[t]}", "correct": bool(outcomes[s, t, p])}
            for s, n in enumerate(shots) for t in range(outcomes.shape[1]) for p in range(outcomes.shape[2])]
    return pd.DataFrame(rows)


def test_order_rows_cluster_by_label_and_holm_over_shot_counts():
    from evalsuite.analysis.stats import holm

    outcomes, topic = topic_outcomes(np.random.default_rng(3), 3, 6, 0.5, 0.4, questions=60, permutations=4)
    rows = order.order_rows(order_frame(outcomes, topic, (2, 4, 8)), resamples=999)
    assert [(r["order_cluster"], r["order_clusters"]) for r in rows] == [("label", 6)] * 3
    raw = [r["order_cluster_p_value"] for r in rows]
    assert [r["order_p_holm"] for r in rows] == pytest.approx(holm(raw))
    assert min(r["order_p_holm"] for r in rows) == pytest.approx(3 * min(raw))  # three shot counts tested
    again = order.order_rows(order_frame(outcomes, topic, (2, 4, 8)), resamples=999)
    assert [r["order_cluster_p_value"] for r in again] == raw  # seeded
    by_question = order.order_rows(order_frame(outcomes, topic, (2, 4, 8)), cluster="test_index", resamples=999)
    assert {r["order_clusters"] for r in by_question} == {60}


def test_a_declared_cluster_column_clusters_the_order_statistics(tmp_path):
    """Topics that cut across the label classes: a `cluster` column in the data says so, the samples
    carry it, and the order statistics cluster by it instead of by the label."""
    source = write_trec(tmp_path / "rows.jsonl", rows=60, split=True)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    source.write_text("".join(json.dumps({**row, "cluster": f"topic {i % 5}"}) + "\n" for i, row in enumerate(rows)))
    task = make_task("icl", {"data": str(source), "shots": "2", "permutations": "2"})
    samples = list(task.plan(task.prepare(None)))
    assert {s.axes["cluster"] for s in samples} == {f"topic {i % 5}" for i in range(60) if i % 4 == 0}
    outcomes, topic = topic_outcomes(np.random.default_rng(4), 1, 5, 0.5, 0.0, questions=40, permutations=4)
    frame = order_frame(outcomes, np.zeros(40, dtype=int), (4,)).assign(cluster=[f"t{topic[t]}" for t in
                                                                               order_frame(outcomes, topic, (4,))[
                                                                                   "test_index"]])
    (row,) = order.order_rows(frame, resamples=199)
    assert (row["order_cluster"], row["order_clusters"]) == ("cluster", 5)  # not the label's single class
    plain = make_task("icl", {"data": str(write_trec(tmp_path / "plain.jsonl")), "shots": "2"})
    assert all("cluster" not in s.axes for s in plain.plan(plain.prepare(None)))  # nothing declared, nothing added


@pytest.mark.parametrize("means, effects, significant", [
    ((3.5, 0.5), (0.0, 0.0), False),  # no order effect; A far more accurate: a smaller spread, no more robust
    ((0.5, 0.5), (0.0, 0.0), False),
    ((0.5, 0.5), (0.0, 0.8), True),   # B's accuracy moves with the order, A's does not
    ((0.5, 0.5), (0.8, 0.0), True),
])
def test_spread_difference_corrects_for_the_noise_floor(means, effects, significant):
    rng = np.random.default_rng(int(10 * sum(effects)) + int(means[0]))
    (a,), topic = topic_outcomes(rng, 1, 25, 0.0, effects[0], means[0])
    (b,), _ = topic_outcomes(rng, 1, 25, 0.0, effects[1], means[1])
    result = order.spread_difference(a, b, topic, resamples=1999)
    assert result["diff"] == pytest.approx(result["spread_a"] - result["spread_b"])
    assert result["excess_diff"] == pytest.approx(result["diff"] - result["floor_a"] + result["floor_b"])
    assert result["low"] <= result["var_diff"] <= result["high"]
    assert (result["p_value"] < 0.05) == significant, result
    if significant:
        assert np.sign(result["var_diff"]) == np.sign(result["excess_diff"]) == np.sign(effects[0] - effects[1])
    if means[0] > means[1]:
        assert result["spread_a"] < result["spread_b"] and result["floor_a"] < result["floor_b"]


def test_spread_difference_rejects_at_most_alpha_when_neither_model_has_an_order_effect():
    rng = np.random.default_rng(11)
    a, topic = topic_outcomes(rng, 100, 25, 1.0, 0.0, 3.0)
    b, _ = topic_outcomes(rng, 100, 25, 1.0, 0.0, 0.0)
    rejected = [order.spread_difference(x, y, topic, resamples=499, seed=r)["p_value"] < 0.05
                for r, (x, y) in enumerate(zip(a, b))]
    assert np.mean(rejected) <= 0.06


def test_two_equally_order_sensitive_models_are_not_called_more_robust():
    """Each model its own order effects of the same sd over 10 permutations: which of them drew the
    larger spread is chance. Holding the permutations fixed (the earlier cluster bootstrap) named one
    "more robust" in about a third of runs at sd 0.5; resampling the permutations holds alpha."""
    rng = np.random.default_rng(21)
    a, topic = topic_outcomes(rng, 120, 25, 0.0, 0.5)
    b, _ = topic_outcomes(rng, 120, 25, 0.0, 0.5)
    rejected = [order.spread_difference(x, y, topic, resamples=299, seed=r)["p_value"] < 0.05
                for r, (x, y) in enumerate(zip(a, b))]
    assert np.mean(rejected) <= 0.06


def test_robustness_table_names_the_more_robust_model(tmp_path):
    from evalsuite.tasks.icl.view import write_robustness

    rng = np.random.default_rng(5)
    a, topic = topic_outcomes(rng, 2, 6, 0.0, 0.0, questions=120)
    b, _ = topic_outcomes(rng, 2, 6, 0.0, 0.8, questions=120)
    for x in (a, b):  # one shot: one order, the same answers under every permutation
        x[0] = x[0][:, :1]
    frame_a, frame_b = order_frame(a, topic, (1, 8)), order_frame(b, topic, (1, 8))
    written = write_robustness(frame_a, frame_b, ("diff", "base"), 0.05, tmp_path)
    assert [p.name for p in written] == ["order_robustness.md", "order_robustness.csv"]
    table = pd.read_csv(tmp_path / "order_robustness.csv")
    assert table["n_shots"].tolist() == [1, 8] and table["cluster"].tolist() == ["label"] * 2
    assert pd.isna(table["p_holm"][0]) and table["p_holm"][1] < 0.05 and table["more_robust"][1] == "diff"
    text = (tmp_path / "order_robustness.md").read_text()
    assert "| random | 1 |" in text and "not testable" in text and text.rstrip().endswith("| diff |")
    assert "6 clusters of questions by `label`" in text
    one_order = frame_a[frame_a["permutation"] == 0]
    assert write_robustness(one_order, one_order, ("diff", "base"), 0.05, tmp_path / "none") == []


# ---- constrained decoding on real (tiny) models -----------------------------------------------

@pytest.mark.parametrize("kind", ["base", "diff"])
def test_constrained_generation_always_returns_a_choice(tiny_models, kind):
    from evalsuite.backends.hf import HFModel
    from evalsuite.types import GenerationRequest

    model = HFModel.load(str(tiny_models[kind]), {}, device="cpu", batch_size=4)
    choice_sets = [(" location", " human", " number"), (" num", " number", " numeral"), (" yes",),
                   (" a b c d e f g", " a b c d e f h"), ("\n", " the magic number")]
    rng = random.Random(0)
    requests = [GenerationRequest(prompt=f"Question: {rng.choice(THINGS)} {i}\nType:", prefix="Demo\n\n" * (i % 2),
                                  max_new_tokens=1, choices=choices)
                for i, choices in enumerate(choice_sets * 2)]
    outputs = model.generate(requests)
    assert all(out in r.choices for out, r in zip(outputs, requests))
    free = model.generate([GenerationRequest(prompt="Question: x\nType:", max_new_tokens=3)])[0]
    assert len(model.encode(free, first=False)) <= 3


def test_choice_trie_walks_only_allowed_tokens():
    import torch

    from evalsuite.backends.common.choices import END, ChoiceTrie

    trie = ChoiceTrie([" a", " ab", " b"], encode=lambda text: [ord(c) for c in text])
    logits = torch.zeros(256)
    logits[ord("z")] = 9.0  # the model's favourite is never allowed
    logits[ord(" ")] = 1.0
    token, node = trie.pick(trie.root, logits)
    assert token == ord(" ") and ChoiceTrie.settled(node) is None
    logits[ord("b")], logits[ord("a")] = 2.0, 1.0
    token, node = trie.pick(node, logits)
    assert token == ord("b") and ChoiceTrie.settled(node) == 2
    _, node = trie.pick(trie.root, logits)
    token, node = trie.pick(node, torch.where(torch.arange(256) == ord("a"), 5.0, 0.0))
    assert token == ord("a") and END in node and ChoiceTrie.settled(node) is None
    # ' a' is complete and ' ab' continues: stop unless the model's own argmax continues
    assert trie.pick(node, logits)[0] is None
    assert trie.pick(node, torch.where(torch.arange(256) == ord("b"), 5.0, 0.0))[0] == ord("b")


# ---- the done-when run ------------------------------------------------------------------------

def test_two_models_shots_sweep_with_permutations_writes_records_summary_and_plots(capsys, tiny_models, trec_file, tmp_path):
    out = tmp_path / "out"
    result = invoke(capsys, "run", "--model", str(tiny_models["base"]), "--model", str(tiny_models["diff"]), "--task", "icl",
                    "-T", f"data={trec_file}", "-T", "shots=1,4,16", "-T", "permutations=3", "-T", "test_size=6",
                    "--device", "cpu", "--no-progress", "--out", str(out))
    assert result.returncode == 0, result.stderr
    runs = sorted(out.glob("icl-*"))
    assert len(runs) == 2
    for run in runs:
        records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert len(records) == 3 * 3 * 6
        assert {(r["axes"]["n_shots"], r["axes"]["order"], r["axes"]["method"]) for r in records} == {
            (n, "random", "generate") for n in (1, 4, 16)}
        assert all(r["scores"]["predicted"] in CLASSES for r in records)
        assert all(r["axes"]["label"] == r["target"][0] for r in records)  # the order statistics' clusters
        summary = json.loads((run / "summary.json").read_text())
        shots = summary["icl"]["shots"]
        assert [s["n_shots"] for s in shots] == [1, 4, 16]
        for entry in shots:
            assert entry["permutations"] == 3 and entry["n_test"] == 6
            assert entry["spread"] == pytest.approx(max(entry["accuracy"]) - min(entry["accuracy"]))
            assert entry["mean"] == pytest.approx(sum(entry["accuracy"]) / 3) and entry["std"] is not None
        assert shots[0]["spread"] == 0  # one demonstration has one order
        assert shots[0]["order_cluster_p_value"] is None and shots[0]["order_p_holm"] is None
        assert {(s["order_cluster"], s["order_clusters"]) for s in shots} == {("label", len({
            r["axes"]["label"] for r in records}))}
        assert all(0 < s["order_p_holm"] <= 1 and s["order_p_holm"] >= s["order_cluster_p_value"] for s in shots[1:])
        for plot in ("accuracy_vs_shots.png", "permutation_spread.png"):
            assert (run / "plots" / plot).stat().st_size > 5000
    (comparison,) = out.glob("compare-icl-*")  # both models on one plot of each kind
    for plot in ("accuracy_vs_shots.png", "permutation_spread.png"):
        assert (comparison / plot).stat().st_size > 5000
    robustness = pd.read_csv(comparison / "order_robustness.csv")  # which model is the more robust to the order
    assert robustness["n_shots"].tolist() == [1, 4, 16] and robustness["n"].tolist() == [6, 6, 6]
    assert "| random | 16 |" in (comparison / "order_robustness.md").read_text()


def test_icl_plots_draw_one_line_per_model(tmp_path):
    from evalsuite.tasks.icl.view import icl_accuracy_vs_shots, icl_curves

    rows = [{"model": m, "n_shots": n, "permutation": p, "test_index": t,
             "correct": (t * (p + 1) + n + (m == "b")) % 3 == 0}
            for m in ("a", "b") for n in (1, 2, 4) for p in range(2) for t in range(6)]
    frame = pd.DataFrame(rows)
    curves = icl_curves(frame)
    assert list(curves["model"]) == ["a"] * 3 + ["b"] * 3 and list(curves["n_shots"]) == [1, 2, 4] * 2
    expected = frame.groupby(["model", "n_shots"])["correct"].mean().tolist()
    assert curves["accuracy"].tolist() == pytest.approx(expected)
    assert (curves["low"] < curves["accuracy"]).all() and (curves["accuracy"] < curves["high"]).all()
    assert icl_accuracy_vs_shots(frame, tmp_path / "acc.png", "two models").stat().st_size > 5000


def test_the_order_spread_figure_is_the_same_for_the_same_records(tmp_path):
    """Its points are jittered: from a fixed seed, and numpy's global generator is left as it was."""
    import numpy as np

    from evalsuite.tasks.icl.view import icl_permutation_spread

    rows = [{"model": m, "n_shots": n, "permutation": p, "test_index": t, "correct": (t + p * n + (m == "b")) % 2 == 0}
            for m in ("a", "b") for n in (2, 4) for p in range(4) for t in range(5)]
    frame = pd.DataFrame(rows)
    np.random.seed(1)
    first = icl_permutation_spread(frame, tmp_path / "first.png", "spread").read_bytes()
    after = np.random.random()
    np.random.seed(1)
    second = icl_permutation_spread(frame, tmp_path / "second.png", "spread").read_bytes()
    assert np.random.random() == after  # the caller's random stream is untouched
    np.random.seed(2)
    assert icl_permutation_spread(frame, tmp_path / "third.png", "spread").read_bytes() == first == second


# ---- bad input: one line, exit 2 --------------------------------------------------------------

def test_bad_inputs_are_one_line_errors(tmp_path, trec_file, capsys):
    def bad(*options: str) -> str:
        code, _, err = invoke(capsys, "run", "--model", "fake", "--task", "icl", *options, "--no-progress",
                              "--out", str(tmp_path))
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]

    assert "did you mean 'trec'" in bad("-T", "dataset=trek")
    no_text = write_trec(tmp_path / "no_text.jsonl", text="question")
    assert "no text column 'text'" in bad("-T", f"data={no_text}", "-T", "shots=1")
    no_label = write_trec(tmp_path / "no_label.jsonl", label="category")
    assert "set -T label_field=NAME" in bad("-T", f"data={no_label}", "-T", "shots=1")
    one_class = write_trec(tmp_path / "one.jsonl", rows=20, classes=("location",))
    assert "at least 2 labels" in bad("-T", f"data={one_class}", "-T", "shots=1")
    assert "more than the 60 demonstrations" in bad("-T", f"data={trec_file}", "-T", "shots=4,500")
    assert "cannot fit even one shot" in bad("-T", f"data={trec_file}", "-T", "shots=1", "-M", "max_context=40")
    assert "-T shots must be auto" in bad("-T", f"data={trec_file}", "-T", "shots=1,two")


def test_no_prefix_cache_flag_is_accepted_and_not_part_of_the_run_identity(trec_file, tmp_path, capsys):
    args = ("run", "--model", "fake", "--task", "icl", "-T", f"data={trec_file}", "-T", "shots=2", "-T", "test_size=4",
            "--no-progress", "--out", str(tmp_path))
    first, second = invoke(capsys, *args), invoke(capsys, *args, "--no-prefix-cache")
    assert first[0] == 0 and second[0] == 0, first[2] + second[2]
    assert first[1].split(":")[0] == second[1].split(":")[0]  # the same run folder: nothing to redo
    assert len(list(tmp_path.glob("icl-*"))) == 1


def test_bad_input_errors_in_process(trec_file, tmp_path):
    with pytest.raises(UserError, match=r"could not load dataset banking77 \(PolyAI/banking77\).*-T data=PATH"):
        make_task("icl", {"dataset": "banking77", "shots": "1"}).prepare(fake())  # no network in tests
    with pytest.raises(UserError, match="file not found"):
        make_task("icl", {"data": str(tmp_path / "missing.jsonl")}).prepare(None)
    with pytest.raises(UserError, match="did you mean 'grouped'"):
        make_task("icl", {"data": str(trec_file), "order": "groupd"})
    with pytest.raises(UserError, match="needs .* tokens, more than"):
        make_task("icl", {"data": str(trec_file), "shots": "1,32"}).prepare(FakeModel.from_options(
            "oracle", {"max_context": "1000"}))


def test_the_separator_is_a_parameter_with_escapes(trec_file):
    task = make_task("icl", {"data": str(trec_file), "shots": "2", "separator": "\\n\\n"})
    state = task.prepare(fake())
    assert task.prefix(state, 2, 0).count("\n\n") == 2 and "==" not in task.prefix(state, 2, 0)
    with pytest.raises(UserError):
        make_task("icl", {"data": str(trec_file), "separator": ""})


def test_the_order_preset_runs_random_and_alternating_orders_side_by_side(trec_file, tmp_path):
    task = make_task("icl", {"preset": "paper-order", "data": str(trec_file), "shots": "2,4", "test_size": "3",
                             "permutations": "2"})
    samples = list(task.plan(task.prepare(fake())))
    assert {s.axes["order"] for s in samples} == {"random", "alternating"} and len(samples) == 2 * 2 * 2 * 3
    assert make_task("icl", {"preset": "paper-order", "data": str(trec_file)}).permutations == 10
    frame = pd.DataFrame([{**s.axes, "correct": i % 3 == 0, "prompt_tokens": 1} for i, s in enumerate(samples)])
    rows = task.summary(frame, None)["icl"]["shots"]
    assert [(r["order"], r["n_shots"]) for r in rows] == [("alternating", 2), ("alternating", 4), ("random", 2),
                                                          ("random", 4)]
