"""The nll task: token NLLs against a naive full-logits pass, memory-bounded slices, the compact
curve, documents from files / folders / datasets, skipped documents, and the CLI end to end."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import invoke

from evalsuite.analysis.stats import mean_band
from evalsuite.backends import load_model
from evalsuite.backends.hf import HFModel
from evalsuite.backends.hf import token_nll as token_nll_module
from evalsuite.engine.runner import RunOptions, make_task, run_task
from evalsuite.errors import UserError
from evalsuite.runs.records import RunFolder
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.tasks.nll.task import checkpoints, leading_ids, load_documents, running_sums


def filler(seed: int, sentences: int) -> str:
    return " ".join(s for s, _ in zip(builtin_sentences(random.Random(seed)), range(sentences)))


def naive_nll(model: HFModel, window: list[int]) -> list[float]:
    """What TOKEN_NLL avoids: the whole (sequence x vocabulary) logits, log-softmaxed."""
    ids = torch.tensor([window])
    with torch.inference_mode():
        logprobs = model.model(input_ids=ids).logits.float().log_softmax(-1)
    return (-logprobs[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]).tolist()


def windows_of(model: HFModel, lengths: tuple[int, ...]) -> list[list[int]]:
    return [model.encode(filler(seed, 80))[:length] for seed, length in enumerate(lengths)]


# ---- the hf backend's TOKEN_NLL --------------------------------------------------------------


@pytest.mark.parametrize("kind", ("base", "diff"))
@pytest.mark.parametrize("attention", ("sdpa", "eager"))  # one pass; slices of 48 tokens over a KV cache
def test_token_nll_matches_the_naive_full_logits_pass(tiny_models, kind, attention):
    options = {"dtype": "float32", "attn_implementation": attention, "prefill_chunk": "48"}
    model = HFModel.load(str(tiny_models[kind]), options, device="cpu")
    windows = windows_of(model, (2, 17, 100, 211))
    got = model.token_nll(windows)
    for window, values in zip(windows, got):
        want = naive_nll(model, window)
        assert len(values) == len(window) - 1
        assert np.abs(np.array(values) - np.array(want)).max() <= 1e-5
    assert model.token_nll([[5]]) == [[]]  # one token predicts nothing


@pytest.mark.parametrize("spec", ("toy-base", "toy-diff"))
def test_token_nll_is_identical_across_batch_sizes(spec):
    results = []
    for batch_size in (1, 3, 8):
        model = load_model(spec, {"prefill_chunk": "64"}, device="cpu", batch_size=batch_size)
        results.append(model.token_nll(windows_of(model, (150, 150, 90, 150))))
    assert results[0] == results[1] == results[2]
    assert len({tuple(r) for r in results[0]}) == 4  # four different windows, not one repeated


@pytest.mark.parametrize("attention, slices", (("sdpa", [161]), ("eager", [40, 40, 40, 40])))
def test_no_call_sees_more_than_a_slice_or_a_chunk_of_logits(tiny_models, monkeypatch, attention, slices):
    """sdpa runs the window whole (causal, no mask: linear memory); eager attention, whose score
    map is quadratic, goes slice by slice. The head never sees more than 16 positions here."""
    options = {"dtype": "float32", "attn_implementation": attention, "prefill_chunk": "40"}
    model = HFModel.load(str(tiny_models["base"]), options, device="cpu")
    window = windows_of(model, (161,))[0]
    want = model.token_nll([window])[0]
    vocabulary = model.model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(token_nll_module, "LOGIT_CHUNK_BYTES", 4 * vocabulary * 16)  # 16 positions of logits
    fed: list[int] = []
    scored: list[int] = []
    hooks = [model.model.get_decoder().register_forward_pre_hook(
                 lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True),
             model.model.get_output_embeddings().register_forward_pre_hook(
                 lambda module, args: scored.append(args[0].shape[1]))]
    try:
        got = model.token_nll([window])[0]
    finally:
        for hook in hooks:
            hook.remove()
    assert fed == slices  # a slice of the last token alone is skipped: it predicts nothing
    assert max(scored) == 16 and sum(scored) == 160
    assert np.abs(np.array(got) - np.array(want)).max() <= 1e-5


def test_a_backend_without_token_nll_is_refused_before_the_run(tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "fake", "--task", "nll", "--out", str(tmp_path))
    assert code == 2 and "needs token_nll" in err and "Traceback" not in err
    assert not list(tmp_path.glob("nll-*"))


# ---- the compact curve and the documents -------------------------------------------------------


def test_running_sums_give_the_cumulative_average_at_log_spaced_positions():
    nll = np.random.default_rng(0).gamma(2.0, size=2047)
    kept = running_sums(nll.tolist(), per_octave=4)
    positions = kept["positions"]
    assert positions[:4] == [1, 2, 3, 4] and positions[-1] == 2047 and 1023 in positions
    assert {2**k for k in range(11)} <= set(positions) and len(positions) < 50
    assert np.allclose(np.array(kept["nll_sum"]) / positions, [nll[:p].mean() for p in positions], rtol=1e-12)
    assert checkpoints(1, 16) == [1]


def test_leading_ids_are_the_whole_texts_first_ids(toy_tokenizer):
    def encode(text: str) -> list[int]:
        return toy_tokenizer(text, add_special_tokens=False)["input_ids"]

    text = filler(3, 400)
    whole = encode(text)
    for needed in (1, 50, 700):
        assert leading_ids(encode, lambda chars: text[:chars], needed) == whole[:needed]
    assert leading_ids(encode, lambda chars: text[:chars], len(whole) + 10) == whole  # shorter: all of it


def test_documents_from_a_file_a_folder_and_a_dataset(tmp_path):
    text_file = tmp_path / "docs.txt"
    text_file.write_text("First document,\nover two lines.\n\n \t\nSecond one.\n\n\n\nThird.\n", encoding="utf-8")
    docs = load_documents(str(text_file), "text", limit=10)
    assert [d.text for d in docs] == ["First document,\nover two lines.", "Second one.", "Third."]
    assert len(load_documents(str(text_file), "text", limit=2)) == 2
    books = tmp_path / "books"
    books.mkdir()
    for name in ("b.txt", "a.txt", "notes.md"):
        (books / name).write_text(f"book {name}\n\nwith paragraphs", encoding="utf-8")
    assert [(d.name, d.text) for d in load_documents(str(books), "text", 10)] == [
        ("a.txt", "book a.txt\n\nwith paragraphs"), ("b.txt", "book b.txt\n\nwith paragraphs")]
    table = tmp_path / "table"
    table.mkdir()
    (table / "train.jsonl").write_text("\n".join(json.dumps({"body": f"row {i}"}) for i in range(5)), encoding="utf-8")
    assert [d.text for d in load_documents(f"dataset:{table}", "body", 3)] == ["row 0", "row 1", "row 2"]


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "missing.txt"), "nll data not found"),
    (lambda p: (p / "empty.txt").write_text("\n \n") and str(p / "empty.txt"), "holds no documents"),
    (lambda p: (p / "folder").mkdir() or str(p / "folder"), "holds no .txt files"),
])
def test_unusable_data_is_a_one_line_user_error(tmp_path, make, message):
    with pytest.raises(UserError, match=message):
        load_documents(make(tmp_path), "text", 5)


def test_dataset_errors_name_the_problem(tmp_path):
    table = tmp_path / "table"
    table.mkdir()
    (table / "train.jsonl").write_text(json.dumps({"text": "x"}), encoding="utf-8")
    with pytest.raises(UserError, match="no column 'body'"):
        load_documents(f"dataset:{table}", "body", 5)
    with pytest.raises(UserError, match="cannot load nll data from dataset"):
        load_documents(f"dataset:{tmp_path / 'nothing'}", "text", 5)


def test_mean_band_resamples_rows_and_handles_degenerate_input():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(30, 5)) + np.arange(5)
    mean, low, high = mean_band(values)
    assert np.allclose(mean, values.mean(axis=0)) and np.all(low < mean) and np.all(mean < high)
    assert np.all(high - low < 1.2)  # about 4 standard errors of 1/sqrt(30)
    assert np.isnan(mean_band(values[:1])[1]).all()
    assert np.array_equal(mean_band(np.ones((4, 3)))[1], np.ones(3))


# ---- the task ----------------------------------------------------------------------------------


def test_a_shorter_length_is_the_start_of_a_longer_pass(tmp_path):
    model = load_model("toy-base", {}, device="cpu", batch_size=2)
    task = make_task("nll", {"lengths": "48,96", "documents": "2", "points_per_octave": "4"})
    records = {r.id: r for r in run_task(task, model, RunOptions(out=tmp_path, progress=False)).read_records()}
    for index in range(2):
        short, long = (records[f"nll-L{n}-s0-{index:05d}"].outputs[0] for n in (48, 96))
        at = dict(zip(long["positions"], long["nll_sum"]))
        for position, total in zip(short["positions"], short["nll_sum"]):
            assert total == pytest.approx(at.get(position, total), abs=1e-4)
        assert set(short["positions"]) - {47} <= set(long["positions"])


def documents_file(folder: Path) -> Path:
    """Five documents: four long enough for 96 tokens of the toy tokenizer, one far too short."""
    blocks = [filler(seed, 25) for seed in range(4)] + ["Too short to score."]
    path = folder / "docs.txt"
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def test_cli_two_models_write_records_plots_and_the_comparison(tmp_path, capsys):
    data = documents_file(tmp_path)
    args = ["run", "--model", "toy-diff", "--model", "toy-base", "--task", "nll", "-T", "lengths=48,96",
            "-T", f"data={data}", "-T", "points_per_octave=4", "--out", str(tmp_path / "out"), "--no-progress"]
    code, out, err = invoke(capsys, *args)
    assert code == 0, err
    assert "n=8, records=10" in out
    runs = sorted((tmp_path / "out").glob("nll-toy-*"))
    assert len(runs) == 2
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["documents"] == {"48": {"scored": 4, "skipped": 1, "errors": 0, "not_finite": 0},
                                        "96": {"scored": 4, "skipped": 1, "errors": 0, "not_finite": 0}}
        # a skipped document is a record but not a sample of the mean: n counts the scored ones
        assert summary["n"] == 10 and summary["overall"]["n"] == 8
        assert [cell["n"] for cell in summary["cells"]] == [4, 4]
        assert (run / "plots" / "nll_cumulative.png").stat().st_size > 10_000
        records = RunFolder(run).read_records()
        skipped = [r for r in records if r.info["skipped"]]
        assert len(records) == 10 and all(not r.outputs and not r.scores for r in skipped)
        assert all(r.info["tokens"] == r.axes["context_length"] for r in records if not r.info["skipped"])
    folder = next((tmp_path / "out").glob("compare-nll-*"))
    assert {"nll_curves.png", "nll_difference.png", "nll_difference.csv", "comparison.md"} <= {
        p.name for p in folder.iterdir()}
    table = pd.read_csv(folder / "nll_difference.csv")
    assert np.allclose(table["diff"], table["mean_a"] - table["mean_b"])
    assert (table["low"] <= table["diff"] + 1e-12).all() and (table["diff"] <= table["high"] + 1e-12).all()
    # the cumulative average at the last position is the per-document `nll` score
    frames = {run.name.split("-")[1] + "-" + run.name.split("-")[2]: RunFolder(run).read_records() for run in runs}
    for length in (48, 96):
        last = table[(table["context_length"] == length)].iloc[-1]
        mean_nll = {name: np.mean([r.scores["nll"] for r in recs if r.scores and r.axes["context_length"] == length])
                    for name, recs in frames.items()}
        assert last["position"] == length - 1
        assert last["mean_a"] == pytest.approx(mean_nll["toy-diff"]) and last["mean_b"] == pytest.approx(
            mean_nll["toy-base"])

    # killed after its first records: the same command finishes with the same records
    run = runs[0]
    lines = (run / "samples.jsonl").read_text().splitlines(keepends=True)
    (run / "samples.jsonl").write_text("".join(lines[:3]) + lines[3][:20])
    (run / "summary.json").unlink()
    assert invoke(capsys, *args)[0] == 0
    assert (run / "samples.jsonl").read_text() == "".join(lines)


def test_cli_all_documents_too_short_is_one_line(tmp_path, capsys):
    data = tmp_path / "short.txt"
    data.write_text("A few words.\n\nAnd a few more.\n", encoding="utf-8")
    code, _, err = invoke(capsys, "run", "--model", "toy-base", "--task", "nll", "-T", f"data={data}",
                          "-T", "lengths=64", "--out", str(tmp_path / "out"))
    assert code == 2 and "none of the 2 documents" in err and "reaches 64 tokens" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---- huge counts and values that are not numbers --------------------------------------------------


def test_generated_documents_are_made_only_as_the_plan_reaches_them():
    """-T documents near the cap with --limit 2 costs two samples, not a million documents."""
    from evalsuite.engine.runner import planned_samples

    def plan(documents: str) -> tuple[object, list]:
        task = make_task("nll", {"documents": documents, "lengths": "64,128"})
        state = task.prepare(None)
        return state, planned_samples(task, state, limit=2)

    plan("2")  # the task's modules loaded before memory is measured
    tracemalloc.start()
    try:
        state, samples = plan("1000000")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.id for s in samples] == ["nll-L64-s0-00000", "nll-L64-s0-00001"]
    assert state.read == () and state.count == 1_000_000
    assert peak < 1_000_000  # bytes: two samples' worth, counted rather than timed (time moves with the load)


def test_a_keyword_stays_a_keyword_and_a_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "builtin").write_text("a file named like the keyword")
    (tmp_path / "docs.txt").write_text("text")
    assert make_task("nll", {"data": "builtin"}).data == "builtin"
    assert make_task("nll", {"data": "docs.txt"}).data == str(tmp_path / "docs.txt")
    assert make_task("nll", {"data": "dataset:pg19"}).data == "dataset:pg19"


class NanNLL:
    """A TOKEN_NLL adapter whose second window overflows (every NLL NaN), as float16 can."""

    name = "nan-nll"
    max_context = 1 << 16
    chat_template = False

    def __init__(self) -> None:
        self.calls = 0

    def fingerprint(self) -> dict:
        return {"backend": "test", "name": self.name}

    def encode(self, text: str, first: bool = True) -> list[int]:
        return list(text.encode())

    def count_tokens(self, text: str) -> int:
        return len(text.encode())

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        return user + assistant_prefix

    def generate(self, requests):
        raise AssertionError("the nll task only measures")

    loglikelihood = generate

    def token_nll(self, windows):
        self.calls += 1
        value = float("nan") if self.calls == 2 else 1.5
        return [[value] * (len(window) - 1) for window in windows]


def test_a_document_whose_nll_is_not_finite_is_counted_not_averaged(tmp_path, recwarn):
    from evalsuite import api

    task = make_task("nll", {"documents": "3", "lengths": "64"})
    run = run_task(task, NanNLL(), RunOptions(out=tmp_path, progress=False))
    summary = json.loads(run.summary_path.read_text())
    assert summary["documents"] == {"64": {"scored": 2, "skipped": 0, "errors": 0, "not_finite": 1}}
    assert summary["cumulative_nll"]["64"]["documents"] == 2
    assert summary["cumulative_nll"]["64"]["mean"][-1] == pytest.approx(1.5)
    assert summary["overall"]["nll"] == pytest.approx(1.5) and summary["overall"]["n"] == 2
    assert "| 64 | 63 | 1.500" in api.report([run.path])
    assert (run.path / "plots" / "nll_cumulative.png").is_file()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning) or "Degenerate" in w.category.__name__]


def test_two_runs_whose_every_nll_is_nan_compare_without_a_traceback(tmp_path, recwarn):
    from evalsuite import api

    task = make_task("nll", {"documents": "3", "lengths": "64"})
    runs = []
    for name in ("nan-a", "nan-b"):
        model = NanNLL()
        model.name = name
        model.token_nll = lambda windows: [[float("nan")] * (len(w) - 1) for w in windows]
        runs.append(run_task(task, model, RunOptions(out=tmp_path, progress=False)).path)
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["documents"]["64"]["not_finite"] == 3 and summary["overall"]["n"] == 0
    ((comparison, folder),) = api.compare(runs[0], runs[1], out=tmp_path)
    assert (folder / "comparison.md").is_file()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning) or "Degenerate" in w.category.__name__]
