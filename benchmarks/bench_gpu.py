"""Prefill on a GPU: needle prompts at 32K and 64K tokens on random ~1B Llama, DiffLlama and DIFF V2 (bf16).

    python benchmarks/bench_gpu.py                          # CUDA, the table below
    python benchmarks/bench_gpu.py --device cpu --tiny      # a smoke run of the same code path

For each model and length it builds needle prompts with the needle task itself
(the model's tokenizer, exact token budget), then times the adapter answering
them with one new token (so the time is the prefill), per backend:

- `hf`: evalsuite's hf backend (transformers, SDPA, logits for the last position only);
- `vllm`: vLLM in-process, when it is installed (otherwise the row says so).

Reported: prefill tokens/s, peak GPU memory (torch.cuda.max_memory_allocated for hf;
vLLM preallocates its KV cache, so its row reports its own configured share), the
model FLOPs of a prefill (2 x parameters x tokens, plus the causal attention
products: 2 x layers x n^2 x (width of QK^T + width of AV)), and their rate as a
share of the bf16 matrix-multiply rate measured in the same script on the same GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from evalsuite.backends import load_model
from evalsuite.models.toy import ToySize, build_tokenizer, save_random_model
from evalsuite.tasks.needle.task import Needle

ONE_B = ToySize(hidden=2048, layers=22, heads=32, intermediate=5632, max_context=131072)
TINY = ToySize(hidden=128, layers=2, heads=4, intermediate=256, max_context=8192)  # head_dim 32: vLLM CPU kernels need >= 32


def matmul_rate(device: str, size: int, repeats: int = 10) -> float:
    """Measured bf16 (CPU: float32) matrix-multiply FLOP/s on this device."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prefill_flops(config, tokens: int, params: int) -> float:
    """Dense matmul FLOPs of one prefill: weights, plus causal QK^T and AV (half of n^2 each)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    query_heads = 2 * config.num_attention_heads if config.model_type == "diffllama_v2" else config.num_attention_heads
    qk_width = query_heads * head_dim  # V2: 2h query heads of width d, each with its own map
    av_width = qk_width  # DiffLlama: H/2 heads x 2d value width, the same total
    factor = 2 if config.model_type == "diffllama" else 1  # two softmax maps over the same values
    attention = 2 * config.num_hidden_layers * tokens * tokens / 2 * (qk_width + av_width) * factor
    return 2 * params * tokens + attention


def needle_requests(model, length: int, samples: int):
    task = Needle(lengths=(length,), depths=(0.5,), samples=samples, tokens_per_query=1)
    state = task.prepare(model)
    built = [task.requests(s, model, state) for s in task.plan(state)]
    return [reqs[0] for reqs, _ in built], [info["prompt_tokens"] for _, info in built]


def time_hf(folder: Path, device: str, lengths: list[int], samples: int) -> list[dict]:
    model = load_model(str(folder), {"dtype": "bfloat16" if device.startswith("cuda") else "float32"},
                       device=device, batch_size=1)
    params = sum(p.numel() for p in model.model.parameters())
    rows = []
    for length in lengths:
        requests, tokens = needle_requests(model, length, samples)
        model.generate(requests[:1])  # warm-up: kernels, allocator
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        start = time.perf_counter()
        model.generate(requests)
        _sync(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
        rows.append({"backend": "hf", "kind": model.model.config.model_type, "length": length,
                     "prompt_tokens": sum(tokens) / len(tokens), "seconds": seconds,
                     "tokens_per_s": sum(tokens) / seconds, "peak_gib": peak, "params": params,
                     "flops": sum(prefill_flops(model.model.config, t, params) for t in tokens)})
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def checkpoint_params(folder: Path) -> int:
    """Parameters stored in a folder's safetensors files (read from their headers, not loaded)."""
    from safetensors import safe_open

    total = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as fh:
            total += sum(math.prod(fh.get_slice(name).get_shape()) for name in fh.keys())
    return total


def time_vllm(folder: Path, device: str, lengths: list[int], samples: int) -> list[dict]:
    """The same prompts through the vllm backend (DiffLlama through evalsuite's vLLM model)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return [{"backend": "vllm", "note": "vllm is not installed here (pip install vllm)"}]
    from transformers import AutoConfig

    cuda = device.startswith("cuda")
    options = {"dtype": "bfloat16" if cuda else "float32", "max_model_len": str(max(lengths) + 64)}
    if not cuda:
        options["enforce_eager"] = "true"  # the smoke run: no compile time
    model = load_model(f"vllm:{folder}", options, device="auto" if cuda else "cpu")
    config, params = AutoConfig.from_pretrained(folder), checkpoint_params(folder)
    rows = []
    for length in lengths:
        requests, tokens = needle_requests(model, length, samples)
        model.generate(requests[:1])  # warm-up
        start = time.perf_counter()
        model.generate(requests)
        seconds = time.perf_counter() - start
        # vLLM reserves its KV cache up front (-M gpu_memory_utilization): its peak is that share, not a measure
        rows.append({"backend": "vllm", "kind": config.model_type, "length": length,
                     "prompt_tokens": sum(tokens) / len(tokens), "seconds": seconds,
                     "tokens_per_s": sum(tokens) / seconds, "peak_gib": float("nan"), "params": params,
                     "flops": sum(prefill_flops(config, t, params) for t in tokens)})
    del model
    return rows


def table(rows: list[dict], rate: float) -> str:
    lines = ["| backend | model | length | prompt tokens | prefill tokens/s | peak GPU memory (GiB) | "
             "share of measured matmul rate |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['backend']} | {r['note']} | | | | | |")
            continue
        share = r["flops"] / r["seconds"] / rate if "flops" in r else float("nan")
        lines.append(f"| {r['backend']} | {r['kind']} ({r.get('params', 0) / 1e9:.2f}B) | {r['length']} | "
                     f"{r['prompt_tokens']:.0f} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} | {share:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models and short lengths (smoke run)")
    parser.add_argument("--lengths", default=None, help="comma-separated prompt lengths (default 32768,65536)")
    parser.add_argument("--samples", type=int, default=2, help="prompts per length")
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--kinds", default="base,diff,diff2", help="toy kinds at this size: base (Llama), diff "
                        "(DiffLlama), diff2 (DIFF V2, matched as its authors match: twice the query heads, the same KV heads)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    size = TINY if args.tiny else ONE_B
    lengths = [int(x) for x in (args.lengths or ("512,1024" if args.tiny else "32768,65536")).split(",")]
    rate = matmul_rate(args.device, 1024 if args.tiny else 8192)
    print(f"measured matmul rate on {args.device}: {rate / 1e12:.1f} TFLOP/s")
    tokenizer = build_tokenizer()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            folder = save_random_model(kind, Path(tmp) / kind, tokenizer, size, seed=0)
            if "hf" in args.backends:
                rows += time_hf(folder, args.device, lengths, args.samples)
            if "vllm" in args.backends:
                rows += time_vllm(folder, args.device, lengths, args.samples)
    print(table(rows, rate))
    if args.json:
        args.json.write_text(json.dumps({"matmul_flops": rate, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
