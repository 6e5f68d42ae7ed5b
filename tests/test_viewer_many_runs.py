"""`evalsuite view --write` over many runs: each run named by its suite entry, task, model and
dataset, and a page that stays small (samples capped per run, plots linked beyond a number of
runs) while the served viewer keeps every sample."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.backends import load_model
from evalsuite.engine.runner import RunOptions, make_task, run_task
from evalsuite.viewer import collect
from evalsuite.viewer.data import EMBED_RUNS, WRITTEN_SAMPLES, dataset_of

SAMPLES = 60  # of each run: more than a written page holds
RUNS = EMBED_RUNS + 2  # more than a written page embeds the plots of


def embedded(page: str) -> dict:
    found = re.search(r'<script id="viewer-data" type="application/json">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """RUNS finished needle runs of 60 samples (one made, the rest copies under other names), the
    first listed by a suite result as its entry needle-4k."""
    root = tmp_path_factory.mktemp("many")
    params = {"lengths": "1024", "depths": "0,0.25,0.5,0.75,1", "samples": str(SAMPLES // 5)}
    first = run_task(make_task("needle", params), load_model("fake:oracle", {}, "cpu"),
                     RunOptions(out=root, progress=False)).path
    for index in range(1, RUNS):
        shutil.copytree(first, root / f"{first.name}-copy{index:03d}")
    suite = {"format": "evalsuite-suite-result", "suite": "s", "model": "fake-oracle",
             "runs": [{"name": "needle-4k", "run": first.name}], "skipped": []}
    (root / "suite-s-fake-oracle.json").write_text(json.dumps(suite), encoding="utf-8")
    return root


def test_a_written_page_of_many_runs_stays_small_and_names_what_each_ran(many, tmp_path, capsys):
    out = tmp_path / "page" / "view.html"
    result = invoke(capsys, "view", str(many), "--write", str(out))
    assert result.code == 0, result.err
    assert f"the page links the plots of its {RUNS} runs" in result.err
    page = out.read_text(encoding="utf-8")
    data = embedded(page)
    assert len(data["runs"]) == RUNS
    for run in data["runs"]:
        assert len(run["samples"]) == WRITTEN_SAMPLES and run["samples_total"] == SAMPLES
        assert run["model"] == "fake-oracle" and run["dataset"] == "built-in" and run["task"] == "needle"
        for image in run["images"]:  # linked from the page, and the link reaches the plot
            assert not image["src"].startswith("data:") and (out.parent / image["src"]).is_file()
    assert all(run["images"] for run in data["runs"])
    assert [r["entry"] for r in data["runs"]].count("needle-4k") == 1
    # the samples a page holds spread over every cell (every depth of the sweep keeps some)
    depths = {s["axes"]["depth"] for s in data["runs"][0]["samples"]}
    assert depths == {0.0, 0.25, 0.5, 0.75, 1.0}
    full = len(json.dumps(collect(many, embed_images=True)))
    assert len(page.encode("utf-8")) < full / 2, (len(page), full)
    served = collect(many, embed_images=False)
    assert all(len(r["samples"]) == SAMPLES for r in served["runs"])  # the served viewer: every sample


@pytest.mark.parametrize("params, shown", [
    ({"dataset": "trec", "data": "/data/icl/trec.jsonl"}, "trec (trec.jsonl)"),
    ({"dataset": "xsum", "data": ""}, "xsum"),
    ({"benchmarks": ["hellaswag", "piqa"]}, "hellaswag,piqa"),
    ({"data": "/books/pg19/"}, "pg19"),
    ({"haystack": "builtin"}, "built-in"),
])
def test_the_dataset_a_run_read_is_named_from_its_parameters(params, shown):
    assert dataset_of(params) == shown
