"""Zero-shot benchmarks through lm-eval: parity with lm-eval's own `hf` backend on
local jsonl fixtures, the attention-bits sweep end to end, resume, the lm-eval
wrapper's other request types, and clear errors. Nothing touches the hub."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.backends.fake import FakeModel, FakeOptions
from evalsuite.backends.hf import HFModel
from evalsuite.engine.runner import RunOptions, run_task
from evalsuite.errors import UserError
from evalsuite.runs.records import RunFolder
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.tasks.zeroshot.task import ZeroShot, load_benchmark, task_manager

lm_eval = pytest.importorskip("lm_eval")

BENCHMARKS = ("hellaswag", "winogrande")


def hellaswag_doc(i: int, rng: random.Random) -> dict:
    """The hub dataset's fields (Rowan/hellaswag), text the toy tokenizer knows."""
    sentences = builtin_sentences(rng)
    return {"ind": i, "activity_label": "Village life", "ctx_a": next(sentences), "ctx_b": "then the baker",
            "ctx": "", "endings": [next(sentences).lower() for _ in range(4)], "source_id": f"doc{i}",
            "split": "val", "split_type": "indomain", "label": str(i % 4)}


def winogrande_doc(i: int, rng: random.Random) -> dict:
    subject, other = rng.sample(["the farmer", "the baker", "the sailor", "the teacher"], 2)
    return {"sentence": f"{subject.capitalize()} gave the map to {other} because _ was tired.",
            "option1": subject, "option2": other, "answer": "12"[i % 2]}


def write_fixtures(folder: Path, docs: int = 8, train: int = 0) -> Path:
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    for name, make in (("hellaswag", hellaswag_doc), ("winogrande", winogrande_doc)):
        lines = [json.dumps(make(i, rng)) for i in range(docs)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        if train:
            lines = [json.dumps(make(100 + i, rng)) for i in range(train)]
            (folder / f"{name}.train.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_fixtures(tmp_path_factory.mktemp("zeroshot-data"))


@pytest.fixture(scope="module")
def diff_model(tiny_models) -> HFModel:
    return HFModel.load(str(tiny_models["diff"]), {"dtype": "float32"}, device="cpu", batch_size=3)


def lm_eval_run(model: str, model_args: str, data_dir: Path) -> dict:
    """lm-eval's own evaluator on the same task definitions and local files."""
    manager = task_manager(BENCHMARKS)
    tasks = [load_benchmark(name, manager, str(data_dir), 0, 1234) for name in BENCHMARKS]
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, task_manager=manager,
                                   batch_size=4, device="cpu", log_samples=True)


def records_by_doc(run: RunFolder, benchmark: str) -> dict[int, object]:
    return {r.info["doc_id"]: r for r in run.read_records() if r.axes["benchmark"] == benchmark}


def test_accuracy_identical_to_lm_eval_hf_backend(tiny_models, data_dir, diff_model, tmp_path):
    import evalsuite.integrations.lmeval  # noqa: F401  (registers model="evalsuite")

    reference = lm_eval_run("hf", f"pretrained={tiny_models['diff']},dtype=float32", data_dir)
    wrapped = lm_eval_run("evalsuite", f"model={tiny_models['diff']},dtype=float32", data_dir)
    run = run_task(ZeroShot(benchmarks=BENCHMARKS, data_dir=str(data_dir)), diff_model,
                   RunOptions(out=tmp_path, progress=False))
    summary = json.loads(run.summary_path.read_text())
    for benchmark in BENCHMARKS:
        expected = reference["results"][benchmark]
        ours = records_by_doc(run, benchmark)
        assert len(ours) == len(reference["samples"][benchmark]) == 8
        for lm_sample, wrapped_sample in zip(reference["samples"][benchmark], wrapped["samples"][benchmark]):
            record = ours[lm_sample["doc_id"]]
            logprobs = [resp[0][0] for resp in lm_sample["resps"]]
            assert [o["logprob"] for o in record.outputs] == pytest.approx(logprobs, abs=1e-4)
            assert [resp[0][0] for resp in wrapped_sample["resps"]] == pytest.approx(logprobs, abs=1e-4)
            assert record.info["doc_hash"] == lm_sample["doc_hash"]
            assert record.info["prompt_hash"] == lm_sample["prompt_hash"]
            for metric in ("acc", "acc_norm"):
                if metric in lm_sample:
                    assert record.scores[metric] == lm_sample[metric] == wrapped_sample[metric]
        for metric in ("acc", "acc_norm"):
            if f"{metric},none" not in expected:
                continue
            row = next(r for r in summary["lm_eval"] if r["benchmark"] == benchmark and r["metric"] == metric)
            assert row["value"] == pytest.approx(expected[f"{metric},none"], abs=1e-12)
            assert row["stderr"] == pytest.approx(expected[f"{metric}_stderr,none"], abs=1e-12)
            assert wrapped["results"][benchmark][f"{metric},none"] == expected[f"{metric},none"]
    paper = {r["benchmark"]: r["value"] for r in summary["lm_eval"] if r["metric"] == "score"}
    assert paper["hellaswag"] == reference["results"]["hellaswag"]["acc_norm,none"]  # the paper's metric
    assert paper["winogrande"] == reference["results"]["winogrande"]["acc,none"]
    assert "| hellaswag (acc_norm) | winogrande (acc) | avg |" in summary["table"]


def test_bits_sweep_for_two_models_writes_records_table_and_plot(capsys, tiny_models, data_dir, tmp_path):
    result = invoke(capsys, "run", "--model", str(tiny_models["diff"]), "--model", str(tiny_models["base"]),
                    "--task", "zeroshot", "-T", "benchmarks=hellaswag", "-T", f"data_dir={data_dir}",
                    "-T", "bits=16,8,4", "-T", "limit=2", "-M", "dtype=float32", "--device", "cpu",
                    "--no-progress", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    runs = sorted(p for p in tmp_path.glob("zeroshot-*") if p.is_dir())
    assert [p.name.split("-")[2] for p in runs] == ["base", "diff"]
    for path in runs:
        records = RunFolder(path).read_records()
        assert sorted((r.axes["bits"], r.info["doc_id"]) for r in records) == [
            (b, d) for b in (4, 8, 16) for d in range(2)]
        summary = json.loads((path / "summary.json").read_text())
        assert summary["table"].count("\n") == 4  # header, rule, one line per bit width
        assert (path / "plots" / "accuracy_vs_bits.png").stat().st_size > 0
        by_key = {(r.axes["bits"], r.info["doc_id"]): [o["logprob"] for o in r.outputs] for r in records}
        assert by_key[(4, 0)] != by_key[(16, 0)]  # quantization reached the model...
        assert by_key[(8, 0)] == pytest.approx(by_key[(16, 0)], abs=0.05)  # ...mildly at 8 bits
    compare = next(tmp_path.glob("compare-zeroshot-*"))
    assert (compare / "accuracy_vs_bits.png").stat().st_size > 0
    table = (compare / "zeroshot_table.md").read_text()
    assert "tiny-diff" in table and "tiny-base" in table and table.count("\n") == 2 + 6


def test_resume_after_a_kill_gives_the_same_records_and_16_bits_is_unquantized(diff_model, data_dir, tmp_path):
    params = dict(benchmarks=("hellaswag",), data_dir=str(data_dir), bits=(16, 4), limit=4)
    task = ZeroShot(**params)
    whole = run_task(task, diff_model, RunOptions(out=tmp_path / "whole", progress=False, chunk=3))
    killed = run_task(task, diff_model, RunOptions(out=tmp_path / "killed", progress=False, chunk=3))
    lines = killed.samples_path.read_bytes().splitlines(keepends=True)
    killed.samples_path.write_bytes(b"".join(lines[:3]) + lines[3][:40])  # a torn line, as after a kill
    killed.summary_path.unlink()
    resumed = run_task(ZeroShot(**params), diff_model, RunOptions(out=tmp_path / "killed", progress=False, chunk=5))
    key = lambda r: (r.id, r.outputs, tuple(sorted(r.scores.items())))  # noqa: E731
    assert sorted(map(key, resumed.read_records())) == sorted(map(key, whole.read_records()))
    assert len(resumed.read_records()) == 8
    plain = run_task(ZeroShot(benchmarks=("hellaswag",), data_dir=str(data_dir), limit=4), diff_model,
                     RunOptions(out=tmp_path / "plain", progress=False))
    sixteen = {r.info["doc_id"]: r.outputs for r in whole.read_records() if r.axes["bits"] == 16}
    assert sixteen == {r.info["doc_id"]: r.outputs for r in plain.read_records()}
    assert diff_model.model.config._attn_implementation == "sdpa"  # the sweep left the model as loaded


def test_fewshot_examples_come_from_the_train_file(diff_model, tmp_path):
    folder = write_fixtures(tmp_path / "data", docs=3, train=4)
    task = ZeroShot(benchmarks=("hellaswag",), data_dir=str(folder), fewshot=2)
    state = task.prepare(diff_model)
    sample = next(task.plan(state))
    requests, _ = task.requests(sample, diff_model, state)
    # the plan is the same without a model, and the frozen task keeps nothing of either run
    assert [s.id for s in task.plan(task.prepare(None))] == [s.id for s in task.plan(state)]
    assert vars(task) == {f: getattr(task, f) for f in ("benchmarks", "fewshot", "limit", "bits", "data_dir", "seed")}
    train = [json.loads(line) for line in (folder / "hellaswag.train.jsonl").read_text().splitlines()]
    assert sum(doc["ctx_a"] in requests[0].context for doc in train) == 2
    with pytest.raises(UserError, match="few-shot examples"):
        ZeroShot(benchmarks=("hellaswag",), data_dir=str(write_fixtures(tmp_path / "bare", docs=2)),
                 fewshot=1).prepare(None)


def test_bad_input_is_a_clear_error(data_dir, tmp_path):
    from evalsuite.backends.fake import FakeModel
    from evalsuite.engine.runner import make_task

    with pytest.raises(UserError, match="did you mean 'hellaswag'"):  # (a name outside the paper's seven
        load_benchmark("hellaswg", task_manager(("hellaswag",)), str(data_dir), 0, 0)  # indexes all of lm-eval)
    with pytest.raises(UserError, match="piqa.jsonl not found"):
        ZeroShot(benchmarks=("piqa",), data_dir=str(data_dir)).prepare(None)
    (tmp_path / "hellaswag.jsonl").write_text(json.dumps({"question": "no hellaswag fields"}) + "\n")
    with pytest.raises(UserError, match="cannot read|cannot load"):
        ZeroShot(benchmarks=("hellaswag",), data_dir=str(tmp_path)).prepare(None)
    for raw, message in (({"bits": "16,1"}, "between 2 and 16"), ({"data_dir": str(tmp_path / "nope")}, "folder"),
                         ({"benchmarks": ""}, "at least one")):
        with pytest.raises(UserError, match=message):
            make_task("zeroshot", raw)
    from evalsuite.engine.runner import check_task

    with pytest.raises(UserError, match="task zeroshot needs attention_quantization, which model fake-oracle"):
        check_task(ZeroShot(bits=(16, 4)), FakeModel.from_options("oracle", {}))
    no_sweep = ZeroShot(benchmarks=("hellaswag",), data_dir=str(data_dir))
    assert check_task(no_sweep, FakeModel.from_options("oracle", {})).benchmarks.keys() == {"hellaswag"}  # any backend


def test_bits_sweep_and_load_time_quantization_do_not_mix(tiny_models):
    model = HFModel.load(str(tiny_models["base"]), {"attn_quant": "absmax:8"}, device="cpu")
    with pytest.raises(UserError, match="drop -M attn_quant"):
        ZeroShot(bits=(16, 4)).prepare(model)  # refused before any benchmark loads


def test_wrapper_generates_greedily_and_scores_rolling_text(diff_model, tiny_models):
    from lm_eval.api.instance import Instance

    from evalsuite.integrations.lmeval import EvalsuiteLM
    from evalsuite.types import GenerationRequest

    lm = EvalsuiteLM(diff_model)
    prompt = "The farmer carried a wooden basket near the river."
    request = Instance("generate_until", {}, (prompt, {"until": ["\n"], "max_gen_toks": 6}), 0)
    assert lm.generate_until([request]) == diff_model.generate([GenerationRequest(prompt, max_new_tokens=6,
                                                                                  stop=("\n",))])
    with pytest.raises(UserError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, (prompt, {"do_sample": True}), 0)])
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (prompt,), 0)])
    assert rolling[0] < 0


def test_rolling_loglikelihood_equals_lm_eval_hf_backend_over_several_windows(tiny_models):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from evalsuite.integrations.lmeval import EvalsuiteLM

    folder = str(tiny_models["diff"])
    sentences = builtin_sentences(random.Random(5))
    texts = [" ".join(next(sentences) for _ in range(n)) for n in (1, 4, 9)]
    requests = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    reference = HFLM(pretrained=folder, dtype="float32", max_length=24, device="cpu", batch_size=4)
    ours = EvalsuiteLM(HFModel.load(folder, {"max_context": "24", "dtype": "float32"}, device="cpu", batch_size=3))
    expected = reference.loglikelihood_rolling(requests, disable_tqdm=True)
    assert ours.adapter.count_tokens(texts[-1]) > 3 * 24  # several windows
    assert ours.loglikelihood_rolling(requests) == pytest.approx(expected, abs=1e-4)


def test_rolling_text_without_token_scoring_is_cut_at_whitespace():
    from lm_eval.api.instance import Instance

    from evalsuite.integrations.lmeval import EvalsuiteLM

    short = EvalsuiteLM(FakeModel("echo", FakeOptions(max_context=24)))
    text = " ".join(["The farmer carried a wooden basket near the river."] * 8)
    spans = short._rolling_pieces(text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text) and len(spans) > 2
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous: every character scored once
    assert all(short.adapter.count_tokens(text[s:e]) <= 12 for s, e in spans)
    assert isinstance(short.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0], float)
