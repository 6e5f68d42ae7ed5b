"""Needle's `shared_haystack`: sample i of a setting keeps one haystack (and its needles) at every
length and depth, so automatic prefix sharing prefills each haystack's beginning once; records keep
their form and are the same bytes with and without prefix sharing. The default is today's plan,
held byte for byte by tests/test_prompt_build.py and tests/test_prompt_versions.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from evalsuite.backends.hf import HFModel
from evalsuite.backends.hf.prefix_share import split_by_own
from evalsuite.engine.runner import RunOptions, make_task, run_task
from evalsuite.params import to_jsonable

QUICKSTART = {"lengths": "256,512,1024,2048", "depths": "0,0.25,0.5,0.75,1", "samples": "4"}


def run(model_dir: Path, out: Path, params: dict[str, str], prefix_cache: bool) -> tuple[int, bytes]:
    """(prefilled tokens, samples.jsonl) of one needle run at the CLI's batch size."""
    model = HFModel.load(str(model_dir), {"prefix_cache": str(prefix_cache).lower()}, device="cpu", batch_size=8)
    folder = run_task(make_task("needle", params), model, RunOptions(out=out, progress=False, chunk=8))
    return model.prefilled_tokens, folder.samples_path.read_bytes()


def test_every_length_and_depth_of_a_sample_shares_its_haystack_and_needles():
    task = make_task("needle", {**QUICKSTART, "shared_haystack": "true"})
    samples = list(task.plan(None))
    assert [s.id for s in samples[:6]] == [f"needle-N1-R1-L{length}-d{depth:g}-s0-000" for length, depth in
                                           [(256, 0), (256, 0.25), (256, 0.5), (256, 0.75), (256, 1), (512, 0)]]
    first = [s for s in samples if s.id.endswith("-000")]
    assert len(first) == 20 and len({(tuple(s.data["cities"]), s.data["filler_seed"]) for s in first}) == 1
    assert len({s.data["filler_seed"] for s in samples}) == 4  # one haystack per sample index
    default = make_task("needle", QUICKSTART)
    assert {s.id for s in default.plan(None)} == {s.id for s in samples}  # same samples, other draws
    assert len({s.data["filler_seed"] for s in default.plan(None)}) == 80


def test_the_parameter_is_left_out_of_the_run_params_at_its_default():
    assert "shared_haystack" not in to_jsonable(make_task("needle", QUICKSTART))  # earlier runs keep their hash
    assert to_jsonable(make_task("needle", {"shared_haystack": "true"}))["shared_haystack"] is True


def test_prompts_of_one_haystack_begin_alike_up_to_the_shallower_needle(tiny_models):
    model = HFModel.load(str(tiny_models["base"]), {}, device="cpu")
    task = make_task("needle", {"lengths": "512,1024", "depths": "0.5,1", "samples": "1", "shared_haystack": "true"})
    state = task.prepare(model)
    built = {s.id: task.requests(s, model, state) for s in task.plan(state)}
    deep_512 = built["needle-N1-R1-L512-d1-s0-000"]
    for other in ("needle-N1-R1-L512-d0.5-s0-000", "needle-N1-R1-L1024-d0.5-s0-000", "needle-N1-R1-L1024-d1-s0-000"):
        shallower = min(deep_512[1]["needle_chars"][0], built[other][1]["needle_chars"][0])
        common = os.path.commonprefix([deep_512[0][0].prompt, built[other][0][0].prompt])
        assert len(common) >= shallower - 200, other  # all but the sentence cut before the needle


def test_split_by_own_gives_rows_of_alike_own_parts_a_pass_each():
    own = [1000, 980, 500, 480, 100, 90, 60]
    assert split_by_own([6, 2, 0, 4, 1, 3, 5], own) == [[0, 1], [2, 3], [4, 5, 6]]
    assert split_by_own([0, 1], [100, 60]) == [[0, 1]]  # 40 tokens apart: not worth a pass


def test_the_quickstart_sweep_prefills_30_percent_fewer_tokens_and_records_keep_their_bytes(tiny_models, tmp_path):
    today, _ = run(tiny_models["diff"], tmp_path / "today", QUICKSTART, prefix_cache=True)
    shared_params = {**QUICKSTART, "shared_haystack": "true"}
    shared, records = run(tiny_models["diff"], tmp_path / "shared", shared_params, prefix_cache=True)
    whole, unshared_records = run(tiny_models["diff"], tmp_path / "whole", shared_params, prefix_cache=False)
    assert records == unshared_records
    assert len(records.splitlines()) == 80
    assert shared <= 0.7 * today, (shared, today)
    assert whole > today  # without sharing every prompt is prefilled whole


def test_record_fields_are_those_of_the_default(tiny_models, tmp_path):
    params = {"lengths": "256", "depths": "0,1", "samples": "1"}
    _, default = run(tiny_models["base"], tmp_path / "default", params, prefix_cache=True)
    _, shared = run(tiny_models["base"], tmp_path / "shared", {**params, "shared_haystack": "true"}, prefix_cache=True)
    for a, b in zip(default.splitlines(), shared.splitlines()):
        one, two = json.loads(a), json.loads(b)
        assert one.keys() == two.keys() and one["info"].keys() == two["info"].keys()
