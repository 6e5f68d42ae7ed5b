"""`evalsuite view`: the results viewer, on real runs of the toy models, written to one file,
served over HTTP, and clicked through in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import invoke
from filelock import FileLock

from evalsuite.analysis.task_of import task_spec
from evalsuite.runs.records import Record, open_run
from evalsuite.viewer import collect, make_server, write_page
from evalsuite.viewer.samples import RIGHT, TEXT_LIMIT, UNSCORED, WRONG, clipped, outcome, pass_fail_metrics

CHROMIUM = next((path for path in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if path and Path(path).is_file()), None)
NEEDLE = ("--task", "needle", "-T", "lengths=256,512", "-T", "depths=0,0.5,1", "-T", "samples=2")


def evalsuite_here(*args: str) -> None:
    """`evalsuite ARGS...` through the same `main()` a user runs, in this process (a module
    fixture has no capsys for conftest's `invoke`); fails the test on a non-zero exit."""
    from evalsuite.cli import main

    argv, sys.argv = sys.argv, ["evalsuite", *args]
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, f"evalsuite {' '.join(args)} exited with {exc.code}"
    finally:
        sys.argv = argv


def xsum_rows(n: int) -> list[dict]:
    """XSum-shaped rows; the summaries of odd rows name a town their document never mentions, so
    the lexical judge finds the reference summary unsupported there: right and wrong in one run."""
    return [{"id": str(i), "summary": f"{100 + i} volunteers cleaned a beach in {'Oslo' if i % 2 else 'Riverton'}.",
             "document": f"Officials in Riverton said that {100 + i} volunteers cleaned the beach on Monday."}
            for i in range(n)]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """Real runs: the toy DIFF and baseline models on needle (two runs and their comparison), and
    two scripted models on hallucination judged by the lexical judge, with prompts logged. Made
    once per test session: xdist workers share their session's folder, and the first one makes them."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with FileLock(str(shared / "viewer-results.lock")):
        out = shared / "viewer-results"
        made = shared / "viewer-results.made"
        if not made.is_file():
            shutil.rmtree(out, ignore_errors=True)
            make_runs(out)
            made.write_text("", encoding="utf-8")
    return out


def make_runs(out: Path) -> None:
    evalsuite_here("run", "--model", "toy-diff", "--model", "toy-base", *NEEDLE, "--no-progress", "--out", str(out))
    data = out.parent / "viewer-xsum.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in xsum_rows(6)), encoding="utf-8")
    evalsuite_here("run", "--model", "fake:target", "--model", "fake:echo", "--task", "hallucination",
                   "-T", "dataset=xsum", "-T", f"data={data}", "-T", "samples=6", "--judge", "lexical",
                   "--log-prompts", "--no-progress", "--out", str(out))


def run_folder(results: Path, prefix: str) -> Path:
    [folder] = [p for p in results.iterdir() if p.name.startswith(prefix)]
    return folder


def records(folder: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    return {row["id"]: row for row in rows}


@pytest.fixture(scope="module")
def data(results) -> dict:
    return collect(results)


def by_name(data: dict, prefix: str) -> dict:
    [run] = [r for r in data["runs"] if r["name"].startswith(prefix)]
    return run


# ---- what the page is made of ----------------------------------------------------------------

def test_collect_finds_every_run_pairs_them_by_task_identity_and_finds_the_comparisons(data, results):
    names = sorted(r["name"] for r in data["runs"])
    assert len(names) == 4 and sum(n.startswith("needle-toy-") for n in names) == 2
    diff, base = by_name(data, "needle-toy-diff"), by_name(data, "needle-toy-base")
    assert diff["partners"] == [base["name"]] and base["partners"] == [diff["name"]]
    target = by_name(data, "hallucination-fake-target")
    assert target["partners"] == [by_name(data, "hallucination-fake-echo")["name"]]
    assert len(diff["samples"]) == 12 and {s["id"] for s in diff["samples"]} == set(records(results / diff["name"]))
    assert diff["summary"]["rows"][0][:4] == ["all"] * 4 and diff["summary"]["header"][-2:] == ["n", "errors"]
    assert [i["name"] for i in diff["images"]] == ["heatmap.png"]
    assert diff["images"][0]["src"].startswith("data:image/png;base64,")
    tasks = sorted(c["task"] for c in data["comparisons"])
    assert tasks == ["hallucination", "needle"]
    needle = next(c for c in data["comparisons"] if c["task"] == "needle")
    assert set(needle["run_links"]) == {diff["name"], base["name"]}
    assert [row[0] for row in needle["overall"]["rows"]] == list(task_spec("needle").metrics)
    assert "heatmap_pair.png" in [i["name"] for i in needle["images"]]


def test_a_length_sweep_shows_its_effective_length_and_a_comparison_its_cells_as_a_heatmap(data, results):
    """The needle runs sweep 256 and 512 tokens: each run says its effective length as `report` does,
    the comparison both models' and their difference as comparison.json has them, and its cells as a
    depth x length grid of the headline metric's differences, each with its tooltip."""
    from evalsuite.analysis.effective_length import effective_length
    from evalsuite.analysis.frame import run_frame

    diff = by_name(data, "needle-toy-diff")
    found = effective_length(run_frame(open_run(results / diff["name"])), "correct_all")
    assert diff["effective"] == f"correct_all: {found.line()}"
    assert by_name(data, "hallucination-fake-target")["effective"] is None  # not swept over lengths
    needle = next(c for c in data["comparisons"] if c["task"] == "needle")
    folder = next(p for p in results.iterdir() if p.name.startswith("compare-needle-"))
    written = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
    assert needle["effective"][-1] == f"correct_all, {needle['names'][0]} minus {needle['names'][1]}: " \
        + written["effective_length"]["text"]
    heat = needle["heatmaps"]
    assert (heat["metric"], heat["columns"], heat["rows"]) == ("correct_all", "context_length", "depth")
    assert heat["column_values"] == ["256", "512"] and heat["grids"][0]["row_values"] == ["0.0", "0.5", "1.0"]
    cells = {(str(c["depth"]), str(c["context_length"])): c for c in written["cells"] if c["metric"] == "correct_all"}
    for r, row in zip(heat["grids"][0]["row_values"], heat["grids"][0]["rows"]):
        for column, cell in zip(heat["column_values"], row):
            assert cell["diff"] == cells[(r, column)]["diff"]
            assert cell["significant"] == cells[(r, column)]["significant"]
            assert f"n={cells[(r, column)]['n']}" in cell["title"]


def test_right_and_wrong_follow_the_gated_metrics_from_the_registry(data, results):
    diff = by_name(data, "needle-toy-diff")
    assert diff["primary_metric"] == task_spec("needle").primary_metric and diff["pass_fail"] == [diff["primary_metric"]]
    on_disk = records(results / diff["name"])
    for sample in diff["samples"]:
        assert sample["outcome"] == ("right" if on_disk[sample["id"]]["scores"]["correct_all"] else "wrong")
    target = by_name(data, "hallucination-fake-target")
    # the primary metric (empty_output, lower is better) and the judge's side metrics
    assert target["gated"][0] == task_spec("hallucination").primary_metric
    assert "judged_lexical" in target["pass_fail"]
    outcomes = {s["id"]: s["outcome"] for s in target["samples"]}
    verdicts = {s["id"]: s["side"]["judgements/lexical"]["verdict"] for s in target["samples"]}
    assert outcomes == {i: "right" if verdicts[i] else "wrong" for i in verdicts}
    assert set(outcomes.values()) == {"right", "wrong"}


def test_logged_prompts_are_shown_as_text_and_others_by_their_hash(data, results):
    target = by_name(data, "hallucination-fake-target")
    on_disk = records(results / target["name"])
    for sample in target["samples"]:
        assert sample["prompt"]["text"] == on_disk[sample["id"]]["prompt"]["text"]
        assert sample["outputs"] == on_disk[sample["id"]]["outputs"]
    needle = by_name(data, "needle-toy-base")["samples"][0]
    assert "text" not in needle["prompt"] and re.fullmatch(r"[0-9a-f]{64}", needle["prompt"]["sha256"])


def record(scores: dict, error: str | None = None) -> Record:
    return Record(id="s", task="t", model="m", axes={}, target=("x",), prompt={"sha256": "0" * 64}, info={},
                  outputs=("y",), scores=scores, error=error)


def test_the_outcome_rules():
    gated = ["correct", "empty"]
    assert outcome(record({"correct": True, "empty": False}), gated, ["empty"]) == RIGHT
    assert outcome(record({"correct": True, "empty": True}), gated, ["empty"]) == WRONG  # lower is better
    assert outcome(record({"correct": None, "empty": False}), gated, ["empty"]) == RIGHT  # no value: not counted
    assert outcome(record({}, error="CUDA out of memory"), gated, []) == WRONG  # as compare counts it
    assert outcome(record({}), gated, []) == UNSCORED
    runs = [record({"nll": 2.5, "correct": 1}), record({"nll": 1.0, "correct": 0})]
    assert pass_fail_metrics(runs, ["nll", "correct", "missing"]) == ["correct"]  # a continuous metric decides nothing


def test_long_texts_are_cut_with_a_note():
    assert clipped("a" * TEXT_LIMIT) == "a" * TEXT_LIMIT
    cut = clipped("a" * (TEXT_LIMIT + 1234))
    assert cut.startswith("a" * TEXT_LIMIT) and cut.endswith("(1,234 more characters not shown)")


NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError("torch is blocked here")

sys.meta_path.insert(0, NoTorch())
from evalsuite.viewer import collect, render
print(len(render(collect(sys.argv[1]))))
"""


def test_the_viewer_reads_runs_without_torch(results):
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(results)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) > 0


# ---- the written page and the server ---------------------------------------------------------

def embedded(page: str) -> dict:
    found = re.search(r'<script id="viewer-data" type="application/json">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


def test_view_write_makes_one_self_contained_page(capsys, results, tmp_path):
    out = tmp_path / "page" / "viewer.html"
    result = invoke(capsys, "view", str(results), "--write", str(out))
    assert result.code == 0, result.err
    assert result.out.strip() == f"written: {out}"
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "an outside resource"
    assert "<link" not in page and not re.search(r"<script[^>]*\bsrc=", page) and "fetch(" not in page
    data = embedded(page)
    assert len(data["runs"]) == 4 and all(i["src"].startswith("data:image/png;base64,")
                                          for r in data["runs"] for i in r["images"])


@pytest.fixture()
def server(results) -> Iterator:
    running = make_server(results, 0)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, "", b""


def test_the_server_answers_the_page_and_the_plots_and_nothing_outside_the_folder(server, results):
    assert server.url.startswith("http://127.0.0.1:")
    status, kind, body = get(server.url)
    assert status == 200 and kind.startswith("text/html")
    data = embedded(body.decode("utf-8"))
    diff = by_name(data, "needle-toy-diff")
    src = diff["images"][0]["src"]
    assert src == f"files/{diff['name']}/plots/heatmap.png"
    status, kind, png = get(server.url + src)
    assert status == 200 and kind == "image/png" and png == (results / diff["name"] / "plots" / "heatmap.png").read_bytes()
    for wrong in (f"files/{diff['name']}/samples.jsonl", "files/../../etc/passwd", "files/%2e%2e/x.png", "nothing"):
        assert get(server.url + wrong)[0] == 404, wrong


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_view_command_serves_on_the_port_it_prints(results):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", "view", str(results), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line, line + process.stderr.read()
        status, kind, body = get(f"http://127.0.0.1:{port}/")
        assert status == 200 and b"needle-toy-diff" in body
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, results):
    empty = tmp_path / "empty"
    empty.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {("view", str(tmp_path / "missing")): "no such results folder",
                 ("view", str(run_folder(results, "needle-toy-diff") / "samples.jsonl")): "not a folder",
                 ("view", str(empty)): "holds no run folders",
                 ("view", str(results), "--port", "70000"): "70000",
                 ("view", str(results), "--port", port): f"port {port} is in use"}
        for args, message in cases.items():
            result = invoke(capsys, *args)
            assert result.code == 2 and message in result.err, (args, result)
            assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


# ---- clicked through in a browser --------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium binary to click through the viewer (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture()
def page(browser):
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    opened.close()
    assert not errors, errors


def test_clicking_through_the_written_page(page, results, tmp_path):
    from playwright.sync_api import expect

    written = write_page(results, tmp_path / "viewer.html")
    page.goto(written.as_uri())
    diff, base = run_folder(results, "needle-toy-diff"), run_folder(results, "needle-toy-base")
    page.click(f'a.run-link[data-run="{diff.name}"]')
    rows = page.locator("#samples tbody tr")
    expect(rows).to_have_count(12)
    page.select_option("#filter-context_length", label="256")  # a cell filter
    expect(rows).to_have_count(6)
    expect(page.locator("#sample-count")).to_have_text("6 of 12 samples")
    page.click('th[data-key="axis:depth"]')
    page.click('th[data-key="axis:depth"]')  # twice: deepest first
    first = rows.first
    sample_id = first.get_attribute("data-id")
    assert sample_id and "-d1-" in sample_id and "-L256-" in sample_id
    first.click()  # a sample opens with its output
    ours, theirs = records(diff)[sample_id], records(base)[sample_id]
    detail = page.locator("#sample-detail")
    expect(detail.locator("pre.output").first).to_have_text(ours["outputs"][0])
    expect(detail.locator(".prompt-hash")).to_have_text(ours["prompt"]["sha256"])
    columns = detail.locator("#pair .pair-col")  # the same sample in the other model's run
    expect(columns).to_have_count(2)
    expect(columns.nth(0)).to_contain_text(diff.name)
    expect(columns.nth(1)).to_contain_text(base.name)
    expect(columns.nth(1).locator("pre.output")).to_have_text(theirs["outputs"][0])

    comparison = next(p.name for p in results.iterdir() if p.name.startswith("compare-needle-"))
    page.click(f'a.cmp-link[data-compare="{comparison}"]')  # a comparison opens with its table
    expect(page.locator("#cmp-overall tbody tr")).to_have_count(len(task_spec("needle").metrics))
    expect(page.locator("#cmp-overall")).to_contain_text("McNemar")
    cells = json.loads((results / comparison / "comparison.json").read_text(encoding="utf-8"))["cells"]
    expect(page.locator("#cmp-cells tbody tr")).to_have_count(len(cells))  # folded under the heatmap
    expect(page.locator("#cmp-heatmaps table.heatmap tbody tr")).to_have_count(3)  # depths 0, 0.5 and 1
    expect(page.locator("#cmp-effective li")).to_have_count(3)
    expect(page.locator("main")).not_to_contain_text("[object")  # every part of the page is an element
    page.click(f'a.cmp-run:text("{base.name}")')
    expect(page.locator("main h2")).to_have_text(base.name)


def test_right_wrong_filter_verdicts_and_prompt_text_in_the_browser(page, results, tmp_path):
    from playwright.sync_api import expect

    written = write_page(results, tmp_path / "viewer.html")
    target = run_folder(results, "hallucination-fake-target")
    page.goto(written.as_uri())
    page.click(f'a.run-link[data-run="{target.name}"]')
    rows = page.locator("#samples tbody tr")
    expect(rows).to_have_count(6)
    page.select_option("#filter-outcome", "wrong")
    expect(rows).to_have_count(3)  # the odd rows: a town the document never names
    rows.first.click()
    detail = page.locator("#sample-detail")
    expect(detail.locator(".verdicts")).to_contain_text("judgements/lexical")
    expect(detail.locator(".verdicts")).to_contain_text("Conclusion: False")
    expect(detail).not_to_contain_text("[object")
    sample_id = rows.first.get_attribute("data-id")
    expect(detail.locator("pre.prompt")).to_have_text(records(target)[sample_id]["prompt"]["text"][0])


def test_the_served_page_shows_its_plots(page, server, results):
    page.goto(server.url)
    page.click(f'a.run-link[data-run="{run_folder(results, "needle-toy-diff").name}"]')
    image = page.locator("main figure img").first
    image.wait_for()
    assert page.evaluate("img => img.complete && img.naturalWidth > 0", image.element_handle())
