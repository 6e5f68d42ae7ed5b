"""CPU prefills in passes of a token budget (continuous.CPU_PREFILL_TOKENS), stacked for decoding:
the passes are what the budget says, and the answers and a needle run's records are those of
one pass over the whole batch."""

from __future__ import annotations

from evalsuite.backends.hf import continuous
from evalsuite.types import GenerationRequest

WORDS = "the city river tower magic number question answer where who how many".split()


def test_passes_hold_at_most_the_budget_in_padded_tokens():
    lengths = [300, 290, 280, 700, 50, 2000, 10]
    passes = continuous.by_tokens(range(len(lengths)), lengths, 1024)
    assert passes == [[0, 1, 2], [3], [4], [5], [6]]
    assert [i for p in passes for i in p] == list(range(len(lengths)))  # order kept, every row once
    assert all(len(p) == 1 or max(lengths[i] for i in p) * len(p) <= 1024 for p in passes)
    assert continuous.by_tokens([0, 1], [2000, 3000], 1024) == [[0], [1]]  # wider than the budget: alone


def _requests(count: int) -> list[GenerationRequest]:
    return [GenerationRequest(prompt=" ".join(WORDS[(i + j) % len(WORDS)] for j in range(20 + 7 * i)),
                              max_new_tokens=6, stop=("\n",)) for i in range(count)]


def test_prefill_passes_give_the_answers_of_one_pass(tiny_models, monkeypatch):
    from evalsuite.backends.hf import HFModel

    model = HFModel.load(str(tiny_models["diff"]), {}, device="cpu", batch_size=4)
    requests = _requests(7)
    monkeypatch.setattr(continuous, "CPU_PREFILL_TOKENS", 10**9)
    one_pass = model.generate(requests)
    rows_per_call: list[int] = []
    forward = model.model.forward

    def spy(*args, **kwargs):
        rows_per_call.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model.model, "forward", spy)
    monkeypatch.setattr(continuous, "CPU_PREFILL_TOKENS", 64)
    assert model.generate(requests) == one_pass
    assert max(rows_per_call) == 4 and rows_per_call.count(1) >= 4  # one-row prefills, decoded together


def test_needle_records_identical_with_prefill_passes(tmp_path, monkeypatch):
    from evalsuite.backends import load_model
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    task = {"lengths": "256,512", "depths": "0,1", "samples": "2"}
    records = {}
    for label, budget in (("one pass", 10**9), ("passes", 256)):
        monkeypatch.setattr(continuous, "CPU_PREFILL_TOKENS", budget)
        model = load_model("toy-diff", {}, device="cpu", batch_size=8)
        run = run_task(make_task("needle", task), model, RunOptions(out=tmp_path / label, progress=False))
        records[label] = run.samples_path.read_bytes()
    assert len(records["passes"].splitlines()) == 8
    assert records["passes"] == records["one pass"]
