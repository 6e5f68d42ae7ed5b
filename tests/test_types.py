"""Typed outputs and their JSON form; requests without answers; the scripted model's own channel."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from evalsuite.backends.fake import FakeModel
from evalsuite.contracts import SCRIPTED_ANSWERS, capabilities_of, tell_expected_answers
from evalsuite.types import (
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    output_from_json,
    output_to_json,
    request_kind,
)

ICL_DATA = Path(__file__).resolve().parents[1] / "evalsuite" / "suites" / "data" / "icl-smoke.jsonl"


@pytest.mark.parametrize("kind, output", [
    ("generation", " 1234567."),
    ("loglikelihood", Loglikelihood(logprob=-1.15625, is_greedy=True, tokens=3)),
    ("probe", {"layers": [0, 1], "per_layer": {"needle": [0.25, 0.5]}}),
])
def test_an_output_read_back_from_its_record_is_what_the_scorer_got_live(kind, output):
    stored = json.loads(json.dumps(output_to_json(output)))
    assert output_from_json(kind, stored) == output


def test_a_loglikelihood_is_stored_as_the_records_have_always_stored_it():
    stored = output_to_json(Loglikelihood(logprob=-0.1, is_greedy=False, tokens=2))
    assert json.dumps(stored, sort_keys=True) == '{"is_greedy": false, "logprob": -0.1, "tokens": 2}'


@pytest.mark.parametrize("kind, raw", [
    ("generation", {"logprob": -1.0}), ("loglikelihood", " text"), ("loglikelihood", {"logprob": -1.0}),
    ("probe", " text"),
])
def test_a_stored_output_of_another_kind_is_refused(kind, raw):
    with pytest.raises(ValueError, match=f"not the stored output of a {kind} request"):
        output_from_json(kind, raw)


def test_request_kinds_and_requests_carry_no_answer():
    assert request_kind(GenerationRequest(prompt="q")) == "generation"
    assert request_kind(LoglikelihoodRequest(context="q", continuation=" a")) == "loglikelihood"
    assert request_kind(object()) == "probe"
    for request in (GenerationRequest, LoglikelihoodRequest):
        assert "target" not in {f.name for f in dataclasses.fields(request)}


def test_only_the_scripted_fake_offers_scripted_answers():
    assert SCRIPTED_ANSWERS in capabilities_of(FakeModel.from_options("target", {}))
    for behaviour in ("oracle", "wrong", "echo"):
        assert SCRIPTED_ANSWERS not in capabilities_of(FakeModel.from_options(behaviour, {}))


def test_the_scripted_fake_answers_what_it_was_told_for_those_very_requests():
    model = FakeModel.from_options("target", {})
    free, closed = GenerationRequest(prompt="q?"), GenerationRequest(prompt="q?", choices=(" no", " yes"))
    right, wrong = LoglikelihoodRequest("q?", " yes"), LoglikelihoodRequest("q?", " no")
    tell_expected_answers(model, [free, closed, right, wrong], [("1", "2"), ("yes",), ("yes",), ("yes",)])
    assert model.generate([free, closed]) == [" 1 2", " yes"]
    assert [(o.logprob, o.is_greedy) for o in model.loglikelihood([right, wrong])] == [(-0.1, True), (-5.0, False)]
    # an equal request that was not told (another object) gets what an untold request always got
    assert model.generate([GenerationRequest(prompt="q?")]) == [" "]
    tell_expected_answers(model, [closed], [("no",)])  # a new call forgets what the last one was told
    assert model.generate([free, closed]) == [" ", " no"]


def test_a_model_without_the_capability_is_told_nothing():
    class Plain:
        name = "plain"

    tell_expected_answers(Plain(), [GenerationRequest(prompt="q")], [("a",)])  # type: ignore[arg-type]


def test_a_run_rescored_from_its_records_scores_the_same(tmp_path):
    """Log-likelihood outputs go to samples.jsonl and back into the scorer as the same Loglikelihood."""
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    task = make_task("icl", {"data": str(ICL_DATA), "shots": "1", "test_size": "6", "method": "loglikelihood"})
    model = FakeModel.from_options("target", {})
    run = run_task(task, model, RunOptions(out=tmp_path, progress=False))
    samples = {s.id: s for s in task.plan(task.prepare(model))}
    records = run.read_records()
    assert records and {"correct", "predicted"} <= set(records[0].scores)
    for record in records:
        outputs = [output_from_json("loglikelihood", raw) for raw in record.outputs]
        assert dict(task.score(samples[record.id], outputs)) == dict(record.scores)
