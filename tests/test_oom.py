"""Out-of-memory backoff in the hf backend: a forward pass that raises torch.OutOfMemoryError
halves the batch and runs the same requests again; the size that fits is kept; the records
are those of a run that never ran out; a request too long on its own is one line naming it.

The limit is simulated at the forward seam: the transformers model's forward raises
torch.OutOfMemoryError when it is handed more rows (or padded tokens) than a pretend device holds."""

from __future__ import annotations

import json

import pytest

from evalsuite.errors import UserError
from evalsuite.types import GenerationRequest, LoglikelihoodRequest


def _load(folder, batch_size: int = 8, **options: str):
    from evalsuite.backends.hf import HFModel

    return HFModel.load(str(folder), dict(options), device="cpu", batch_size=batch_size)


def _limit_rows(model, rows: int, tokens: int | None = None) -> list[tuple[int, int]]:
    """Make the model's forward raise OutOfMemoryError above `rows` rows (or `tokens` padded
    tokens); returns the (rows, width) of every pass that was let through."""
    import torch

    forward = model.model.forward
    seen: list[tuple[int, int]] = []

    def limited(*args, **kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[0] > rows or (tokens is not None and ids.shape[0] * ids.shape[1] > tokens):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        seen.append(tuple(ids.shape))
        return forward(*args, **kwargs)

    model.model.forward = limited
    return seen


def _requests() -> list[GenerationRequest]:
    words = "the city river tower magic number question answer".split()
    return [GenerationRequest(prompt=" ".join(words[: 2 + i % 7]) + f" {i}", max_new_tokens=5) for i in range(11)]


def test_a_batch_that_runs_out_of_memory_is_halved_and_the_size_kept(tiny_models, capsys):
    reference = _load(tiny_models["diff"], prefix_cache="false").generate(_requests())
    model = _load(tiny_models["diff"], prefix_cache="false")
    seen = _limit_rows(model, 3)
    answers = model.generate(_requests())
    assert answers == reference
    assert max(rows for rows, _ in seen) <= 3
    limits = model.batch_limits
    assert limits["rows"] == 2  # 8 -> 4 -> 2, then kept
    assert [h["failed_rows"] for h in limits["halvings"]] == [8, 4]
    assert "ran out of memory on a batch of 8 rows" in capsys.readouterr().err
    model.generate(_requests())  # the next call starts at the size that fits: no new halving
    assert len(model.batch_limits["halvings"]) == 2


def test_loglikelihoods_after_backoff_match_a_batch_size_that_always_fitted(tiny_models):
    requests = [LoglikelihoodRequest(context=f"the city {i} river", continuation=c)
                for i in range(4) for c in (" tower", " magic number")]
    fitted = _load(tiny_models["base"], batch_size=2, prefix_cache="false").loglikelihood(requests)
    model = _load(tiny_models["base"], prefix_cache="false")
    _limit_rows(model, 2)
    assert model.loglikelihood(requests) == fitted
    assert model.batch_limits["rows"] == 2


def test_the_padded_token_budget_is_halved_too(tiny_models):
    model = _load(tiny_models["diff"], prefix_cache="false")
    seen = _limit_rows(model, 8, tokens=50)
    model.generate(_requests())
    assert all(rows * width <= 50 for rows, width in seen)
    assert model.batch_limits["tokens"] <= 50


def test_a_request_that_cannot_fit_alone_is_one_line_naming_its_length(tiny_models):
    model = _load(tiny_models["diff"], prefix_cache="false")
    _limit_rows(model, 0)
    request = GenerationRequest(prompt="the city river tower", max_new_tokens=3)
    with pytest.raises(UserError, match=rf"a request of {len(model.encode(request.prompt))} tokens does not fit"):
        model.generate([request])


def test_needle_run_with_backoff_writes_the_records_of_a_run_that_fitted(tiny_models, tmp_path, capsys):
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    task = {"lengths": "128,256", "depths": "0,0.5,1", "samples": "2"}
    runs = {}
    for name, limit in (("fits", None), ("backoff", 2)):
        model = _load(tiny_models["diff"])
        if limit:
            _limit_rows(model, limit)
        runs[name] = run_task(make_task("needle", task), model, RunOptions(out=tmp_path / name, progress=False))
    fits, backoff = (run.samples_path.read_bytes() for run in runs.values())
    assert fits == backoff and len(fits.splitlines()) == 12
    # the records cannot show the backoff: the run folder keeps it, and the size that fitted (prefill
    # runs of alike rows are joined, so the first batch that overflows holds the 6 rows of one join)
    kept = json.loads((runs["backoff"].path / "batch_limits.json").read_text())
    assert kept["rows"] == 1 and [h["failed_rows"] for h in kept["halvings"]] == [6, 3]
    assert not (runs["fits"].path / "batch_limits.json").exists()
    later = run_task(make_task("needle", {**task, "samples": "1"}), model, RunOptions(out=tmp_path / "later",
                                                                                     progress=False))
    assert not (later.path / "batch_limits.json").exists()  # the same model, no halving during this run
    assert json.loads(fits.splitlines()[0])["outputs"]
