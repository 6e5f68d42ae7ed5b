"""Zero-shot benchmarks: evalsuite's path vs lm-eval's own `hf` backend, same model, same data.

    python benchmarks/bench_lmeval_parity.py                       # random toy-size DIFF model, CPU
    python benchmarks/bench_lmeval_parity.py --model PATH --docs 500 --device cuda --batch-size 32

Both paths run lm-eval's task definitions (hellaswag and winogrande) on the same
local jsonl files (hub fields, text from the built-in filler), with the model
already loaded, starting from the task definitions (datasets read, requests built):

- baseline: `lm_eval.simple_evaluate(model=HFLM(...), tasks=...)`;
- evalsuite: the `zeroshot` task through the runner (records written, summary, table);
- wrapper: `lm_eval.simple_evaluate(model=EvalsuiteLM(adapter), tasks=...)`.

Each path runs `--repeats` times, interleaved; the median time is reported with the
ratio to the baseline (below 1 = faster). Per-document accuracy must be identical on
all three paths, and the script fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import lm_eval
import torch
from lm_eval.models.huggingface import HFLM

from evalsuite.backends.hf import HFModel
from evalsuite.engine.runner import RunOptions, run_task
from evalsuite.integrations.lmeval import EvalsuiteLM
from evalsuite.models.toy import ToySize, build_tokenizer, save_random_model
from evalsuite.runs.records import RunFolder
from evalsuite.tasks.kit.filler import builtin_sentences
from evalsuite.tasks.zeroshot.task import ZeroShot, load_benchmark, task_manager

BENCHMARKS = ("hellaswag", "winogrande")


def write_data(folder: Path, docs: int, seed: int = 0) -> None:
    """hub-shaped hellaswag and winogrande files, text from the built-in filler."""
    rng = random.Random(seed)
    sentences = builtin_sentences(rng)
    people = ["the farmer", "the baker", "the sailor", "the teacher", "the weaver", "the miller"]
    with (folder / "hellaswag.jsonl").open("w") as out:
        for i in range(docs):
            out.write(json.dumps({"ind": i, "activity_label": "Village life", "ctx_a": " ".join(
                next(sentences) for _ in range(3)), "ctx_b": "then the baker", "ctx": "",
                "endings": [next(sentences).lower() + " " + next(sentences) for _ in range(4)],
                "source_id": str(i), "split": "val", "split_type": "indomain", "label": str(i % 4)}) + "\n")
    with (folder / "winogrande.jsonl").open("w") as out:
        for i in range(docs):
            a, b = rng.sample(people, 2)
            out.write(json.dumps({"sentence": f"{next(sentences)} {a.capitalize()} gave the map to {b} because _ "
                                  f"{next(sentences).lower()}", "option1": a, "option2": b,
                                  "answer": "12"[i % 2]}) + "\n")


def lm_eval_path(lm, data: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    manager = task_manager(BENCHMARKS)
    tasks = [load_benchmark(b, manager, str(data), 0, 1234) for b in BENCHMARKS]
    result = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=True,
                                     bootstrap_iters=0)
    elapsed = time.perf_counter() - start
    return elapsed, {b: [s["acc"] for s in sorted(result["samples"][b], key=lambda s: s["doc_id"])]
                     for b in BENCHMARKS}


def evalsuite_path(model: HFModel, data: Path, batch_size: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run = run_task(ZeroShot(benchmarks=BENCHMARKS, data_dir=str(data)), model,
                       RunOptions(out=Path(out), progress=False, chunk=batch_size))
        elapsed = time.perf_counter() - start
        records = RunFolder(run.path).read_records()
    return elapsed, {b: [r.scores["acc"] for r in sorted(records, key=lambda r: r.info["doc_id"])
                         if r.axes["benchmark"] == b] for b in BENCHMARKS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model folder (default: a random toy-size DiffLlama)")
    parser.add_argument("--docs", type=int, default=200, help="documents per benchmark")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = Path(scratch)
        folder = args.model or str(save_random_model("diff", scratch_path / "toy-diff", build_tokenizer(),
                                                       ToySize(), seed=0))
        data = scratch_path / "data"
        data.mkdir()
        write_data(data, args.docs)
        ours = HFModel.load(folder, {"dtype": args.dtype}, device=args.device, batch_size=args.batch_size)
        baseline = HFLM(pretrained=folder, dtype=args.dtype, batch_size=args.batch_size, device=args.device)
        wrapper = EvalsuiteLM(ours)
        paths = {"lm-eval hf": lambda: lm_eval_path(baseline, data),
                 "evalsuite zeroshot": lambda: evalsuite_path(ours, data, args.batch_size),
                 "evalsuite as lm-eval LM": lambda: lm_eval_path(wrapper, data)}
        times: dict[str, list[float]] = {name: [] for name in paths}
        answers = {}
        for _ in range(args.repeats):
            for name, run in paths.items():
                elapsed, answers[name] = run()
                times[name].append(elapsed)
        reference = answers["lm-eval hf"]
        for name, got in answers.items():
            if got != reference:
                raise SystemExit(f"per-document accuracy of {name} differs from lm-eval's hf backend")
        base = statistics.median(times["lm-eval hf"])
        print(f"model {folder} on {args.device} ({args.dtype}), {args.docs} docs x {len(BENCHMARKS)} benchmarks, "
              f"batch size {args.batch_size}, torch threads {torch.get_num_threads()}, median of {args.repeats}")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {name:<24} {median:7.2f} s   ratio to lm-eval hf {median / base:5.2f}")
        print("per-document accuracy identical on all paths: yes")


if __name__ == "__main__":
    main()
