"""The two long-context analyses on a GPU: `attention` and `nll` at 32K and 64K tokens on random
~1B-parameter Llama and DiffLlama in bf16, against the plain prefill of a prompt of the same length.

    python benchmarks/bench_gpu_analyses.py                       # CUDA, the table in docs/gpu.md
    python benchmarks/bench_gpu_analyses.py --device cpu --tiny   # a smoke run of the same code path

Each row is one run of the task through the same path as `evalsuite run` (the Python API, the
hf backend, bf16): its wall time and its peak GPU memory (torch.cuda.max_memory_allocated),
next to the peak of one plain prefill of a needle prompt of the same length (the adapter
generating one token, logits for the last position only). The analyses compute only a few
query rows of attention, and the NLL from hidden states a chunk of positions at a time, so
their peak should stay near the prefill's: that ratio is the point of the table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from bench_gpu import ONE_B, TINY, needle_requests

import evalsuite
from evalsuite.backends import load_model
from evalsuite.models.toy import build_tokenizer, save_random_model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def _reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def prefill_peak(folder: Path, device: str, dtype: str, length: int) -> dict:
    """Time and peak memory of one plain prefill at `length` (the reference row)."""
    model = load_model(str(folder), {"dtype": dtype, "max_context": str(length)}, device=device, batch_size=1)
    requests, tokens = needle_requests(model, length, 1)
    model.generate(requests)  # warm-up
    _reset(device)
    start = time.perf_counter()
    model.generate(requests)
    _sync(device)
    row = {"what": "prefill", "length": length, "tokens": tokens[0], "seconds": time.perf_counter() - start,
           "peak_gib": _peak_gib(device)}
    del model
    return row


def task_run(task: str, folder: Path, device: str, dtype: str, length: int, out: Path, params: dict) -> dict:
    """One run of `task` at `length` through the Python API, timed, with its peak memory."""
    _reset(device)
    start = time.perf_counter()
    results = evalsuite.run(task, [str(folder)], out=out, device=device, batch_size=1,
                            model_options={"dtype": dtype, "max_context": str(length)}, lengths=[length], **params)
    _sync(device)
    seconds = time.perf_counter() - start
    return {"what": task, "length": length, "seconds": seconds, "peak_gib": _peak_gib(device),
            "samples": len(results.frame), "summary": results.summaries[0].get("overall", {})}


def table(rows: list[dict]) -> str:
    lines = ["| model | length | what | samples | seconds (incl. loading) | peak GPU memory (GiB) | peak / prefill peak |",
             "|---|---|---|---|---|---|---|"]
    prefill = {(r["kind"], r["length"]): r["peak_gib"] for r in rows if r["what"] == "prefill"}
    for r in rows:
        ratio = r["peak_gib"] / prefill[(r["kind"], r["length"])] if prefill.get((r["kind"], r["length"])) else float("nan")
        lines.append(f"| {r['kind']} | {r['length']} | {r['what']} | {r.get('samples', 1)} | {r['seconds']:.1f} | "
                     f"{r['peak_gib']:.2f} | "
                     f"{ratio:.2f} |")
    return "\n".join(lines)


TASK_PARAMS = {
    "attention": {"depths": [0.5], "samples": 1},
    "nll": {"documents": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models and short lengths (smoke run)")
    parser.add_argument("--lengths", default=None, help="comma-separated lengths (default 32768,65536)")
    parser.add_argument("--tasks", default="attention,nll")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    size = TINY if args.tiny else ONE_B
    lengths = [int(x) for x in (args.lengths or ("512,1024" if args.tiny else "32768,65536")).split(",")]
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    tokenizer = build_tokenizer()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("base", "diff"):
            folder = save_random_model(kind, Path(tmp) / kind, tokenizer, size, seed=0)
            for length in lengths:
                rows.append({"kind": kind, **prefill_peak(folder, args.device, dtype, length)})
                for task in args.tasks.split(","):
                    out = Path(tmp) / f"runs-{kind}-{task}-{length}"
                    rows.append({"kind": kind, **task_run(task, folder, args.device, dtype, length, out,
                                                          TASK_PARAMS[task])})
                print(table(rows), flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
