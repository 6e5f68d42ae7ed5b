"""Prefix reuse vs recomputing the whole prompt, side by side, for many-shot ICL.

A toy-shaped random model (the shipped toy models' shape, or `--model DIR`)
answers the same `icl` samples twice, each path in a fresh process so that
its peak memory is its own:

    reuse       the hf backend encodes the demonstration block once and runs
                every test question from its KV cache (the default)
    recompute   -M prefix_cache=false: every question's full prompt, demonstrations
                included, goes through the model

Predictions must be identical; the script prints both wall times, the speed
ratio, and each path's peak resident memory above the loaded model next to
the size of one prefix's KV cache.

    python benchmarks/bench_prefix_cache.py                # 8K-token block, 100 questions, CPU
    python benchmarks/bench_prefix_cache.py --prefix-tokens 16384 --device cuda

`--needle` measures automatic prefix sharing instead, on the README's quickstart needle run
(toy-diff, depths 0, 0.25, 0.5, 0.75, 1, 4 samples) by default: today's prompts (each depth its
own haystack, so rows share only the instruction) with prefix sharing, then `-T
shared_haystack=true` (one haystack per sample index at every length and depth) with and
without it. It prints the prompt tokens each prefilled (`HFModel.prefilled_tokens`), the drop
against today's run and against no sharing, each run's wall time, and whether the shared runs'
records are the same bytes with and without sharing.

    python benchmarks/bench_prefix_cache.py --needle [--model toy-base] [--lengths 256,512,1024,2048]
    python benchmarks/bench_prefix_cache.py --needle --lengths 4096 --depths 11
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LABELS = ("location", "human", "number", "entity", "description", "abbreviation")
TEMPLATES = ("Where is {}?", "Who {}?", "How many {}?", "What is {}?", "Why {}?", "What does {} stand for?")


def write_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """A trec-shaped jsonl: questions of filler words, six classes."""
    from evalsuite.tasks.kit.filler import builtin_sentences

    rng = random.Random(seed)
    sentences = builtin_sentences(rng)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(rows):
            words = next(sentences).rstrip(".").split()[:8]
            label = i % len(LABELS)
            fh.write(json.dumps({"text": TEMPLATES[label].format(" ".join(words)), "label": LABELS[label]}) + "\n")
    return path


SIZES = {"tiny": dict(hidden=64, layers=2, heads=4, intermediate=128),  # the test suite's tiny models
         "toy": {}}  # the shipped toy models' shape (ToySize defaults)


def make_model(folder: Path, kind: str, size: str, max_context: int) -> Path:
    from evalsuite.models.toy import ToySize, build_tokenizer, save_random_model

    shape = ToySize(**SIZES[size], max_context=max_context)
    return save_random_model(kind, folder, build_tokenizer(), shape, seed=0)


def rss_bytes() -> int:
    """Current resident memory (Linux)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def run_path(args: dict[str, Any]) -> dict[str, Any]:
    """One path in its own process: load, plan, evaluate in runner-sized chunks."""
    import torch

    from evalsuite.backends.hf import HFModel
    from evalsuite.engine.runner import evaluate, make_task

    torch.manual_seed(0)
    model = HFModel.load(args["model"], {"prefix_cache": str(args["cache"]).lower()}, device=args["device"],
                         batch_size=args["batch_size"])
    task = make_task("icl", args["task"])
    state = task.prepare(model)
    samples = list(itertools.islice(task.plan(state), args["questions"]))
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    loaded = rss_bytes()
    start = time.perf_counter()
    outputs = []
    for first in range(0, len(samples), args["batch_size"]):
        records = evaluate(task, model, state, samples[first : first + args["batch_size"]], log_prompts=False)
        outputs += [r.outputs[0] for r in records]
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"seconds": seconds, "outputs": outputs, "peak_above_loaded": max(0, peak_kib * 1024 - loaded),
              "prefix_tokens": task.prefix_tokens(state, model, samples[0].axes["n_shots"], 0)}
    if model.device.type == "cuda":
        result["cuda_peak"] = torch.cuda.max_memory_allocated()
    config = model.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    bytes_per = torch.finfo(model.model.dtype).bits // 8
    result["prefix_cache_bytes"] = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                                    * result["prefix_tokens"] * bytes_per)
    return result


def in_child(args: dict[str, Any], out: Path) -> dict[str, Any]:
    """`run_path` in a fresh interpreter, so each path's peak memory is its own."""
    subprocess.run([sys.executable, __file__, "--child", json.dumps(args), str(out)], check=True)
    return json.loads(out.read_text())


def shots_for(model: str, data: Path, target: int, questions: int) -> int:
    """The smallest shot count whose demonstration block reaches `target` tokens."""
    from evalsuite.backends.hf import HFModel
    from evalsuite.engine.runner import make_task

    adapter = HFModel.load(model, {}, device="cpu")
    task = make_task("icl", {"data": str(data), "shots": "1", "test_size": str(questions)})
    state = task.prepare(None)  # the demonstration blocks need the data only
    per_shot = max(1, adapter.count_tokens(task.prefix(state, 64, 0)) // 64)
    n = max(1, target // per_shot)
    while adapter.count_tokens(task.prefix(state, n, 0)) < target:
        n += max(1, (target - adapter.count_tokens(task.prefix(state, n, 0))) // per_shot)
    return n


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def needle_prefill(model: str, lengths: str, depths: str, samples: int, device: str, batch_size: int) -> None:
    """The needle run three times: today's haystacks with prefix sharing, shared haystacks with
    and without it; prefilled tokens, wall times and records."""
    from evalsuite.backends import load_model
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    if depths.isdigit():  # a count: evenly spaced from 0 to 1
        depths = ",".join(f"{k / (int(depths) - 1):g}" for k in range(int(depths)))
    task = {"lengths": lengths, "depths": depths, "samples": str(samples)}
    runs = {"today": (task, True), "shared": ({**task, "shared_haystack": "true"}, True),
            "shared, no sharing": ({**task, "shared_haystack": "true"}, False)}
    counts, seconds, records = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-needle-") as tmp:
        for name, (params, cache) in runs.items():
            adapter = load_model(model, {"prefix_cache": str(cache).lower()}, device=device, batch_size=batch_size)
            options = RunOptions(out=Path(tmp) / name.replace(" ", "").replace(",", ""), progress=False,
                                 chunk=batch_size)
            start = time.perf_counter()
            run = run_task(make_task("needle", params), adapter, options)
            seconds[name] = time.perf_counter() - start
            counts[name], records[name] = adapter.prefilled_tokens, run.samples_path.read_bytes()
            print(f"{name:>18}: {counts[name]:8d} prefilled tokens, {seconds[name]:7.1f} s", flush=True)
    print(f"needle {model}, lengths {lengths}, depths {depths}, {samples} samples, batch size {batch_size}: "
          f"{len(records['today'].splitlines())} prompts")
    for base in ("today", "shared, no sharing"):
        print(f"shared haystacks against {base}: {100 * (1 - counts['shared'] / counts[base]):.1f}% fewer "
              f"prefilled tokens, {seconds[base] / seconds['shared']:.2f}x faster")
    print(f"shared haystacks' records byte-identical with and without sharing: "
          f"{records['shared'] == records['shared, no sharing']}")


def main() -> None:
    if sys.argv[1:2] == ["--needle"]:
        parser = argparse.ArgumentParser(description="automatic prefix sharing on the quickstart needle run")
        parser.add_argument("--needle", action="store_true")
        parser.add_argument("--model", default="toy-diff")
        parser.add_argument("--lengths", default="256,512,1024,2048")
        parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="a list, or a count spaced from 0 to 1")
        parser.add_argument("--samples", type=int, default=4)
        parser.add_argument("--device", default="cpu")
        parser.add_argument("--batch-size", type=int, default=8)
        needle = parser.parse_args()
        needle_prefill(needle.model, needle.lengths, needle.depths, needle.samples, needle.device, needle.batch_size)
        return
    if sys.argv[1:2] == ["--child"]:
        Path(sys.argv[3]).write_text(json.dumps(run_path(json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix-tokens", type=int, default=8192, help="demonstration block length (tokens)")
    parser.add_argument("--questions", type=int, default=100, help="test questions answered by each path")
    parser.add_argument("--kind", choices=("diff", "base"), default="diff", help="toy architecture to build")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny", help="toy model shape to build")
    parser.add_argument("--model", default=None, help="an HF model folder instead of a random toy model")
    parser.add_argument("--method", choices=("generate", "loglikelihood"), default="generate")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        root = Path(tmp)
        model = args.model or str(make_model(root / "model", args.kind, args.size, max_context=2 * args.prefix_tokens + 1024))
        rows = args.prefix_tokens // 8 + 4 * args.questions  # a demonstration is well over 8 tokens
        data = write_dataset(root / "data.jsonl", rows)
        shots = shots_for(model, data, args.prefix_tokens, args.questions)
        task = {"data": str(data), "shots": str(shots), "test_size": str(args.questions), "method": args.method}
        common = {"model": model, "device": args.device, "batch_size": args.batch_size, "task": task,
                  "questions": args.questions}
        results = {}
        for name, cache in (("reuse", True), ("recompute", False)):
            results[name] = in_child({**common, "cache": cache}, root / f"{name}.json")
            print(f"{name:>9}: {results[name]['seconds']:8.2f} s for {args.questions} questions, peak memory "
                  f"above the loaded model {mib(results[name]['peak_above_loaded'])}"
                  + (f", CUDA peak {mib(results[name]['cuda_peak'])}" if "cuda_peak" in results[name] else ""),
                  flush=True)

    reuse, recompute = results["reuse"], results["recompute"]
    same = reuse["outputs"] == recompute["outputs"]
    print(f"model: {args.model or 'random toy ' + args.kind}, device {args.device}, batch size {args.batch_size}, "
          f"method {args.method}")
    print(f"demonstration block: {shots} shots, {reuse['prefix_tokens']} tokens; one prefix's KV cache "
          f"{mib(reuse['prefix_cache_bytes'])}")
    print(f"identical predictions: {same}")
    print(f"speed-up of prefix reuse: {recompute['seconds'] / reuse['seconds']:.1f}x")
    if not same:
        sys.exit("predictions differ between the two paths")


if __name__ == "__main__":
    main()
