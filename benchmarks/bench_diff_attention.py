"""DiffLlama's prefill time over a matched Llama's, with transformers' DiffLlama attention (two
attention calls per layer) and with the hf backend's one-pass module (each map scored once,
against the value of width 2d), in one run: the variants alternate within every repeat and the
medians are reported.

    python benchmarks/bench_diff_attention.py                 # sdpa at 8K and 16K tokens, eager at 8K
    python benchmarks/bench_diff_attention.py --lengths 4096 --attention absmax
    python benchmarks/bench_diff_attention.py --kernels 8192  # the attention op alone, torch SDPA

The pair has the toy pair's shapes, larger: hidden 512, 8 heads of width 64 (DiffLlama: 8
component heads, so 4 DIFF heads with values of width 128), as many key heads as query heads,
1 layer, MLP 1536, vocabulary 1024, float32, random weights, one thread. A prefill is one forward
pass over the whole prompt with `logits_to_keep=1`, no cache. The times are the process's CPU
seconds (what the work costs, steady on a shared machine) with wall seconds beside them.
Attention variants:

- `sdpa`: transformers' default. On CPU torch's flash kernel needs the value as wide as the
  query, so the one-pass module widens query and key with zeros to 2d and calls it once
  (`--kernels` shows the kernel alone, all three ways);
- `eager`: transformers' eager attention, n x n maps per head (memory grows with n²);
- `absmax`: evalsuite's attention-logit quantizer at 8 bits (`-M attn_quant=absmax:8`), chunked,
  linear memory: the explicit-logits path that the outliers probe also takes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SHAPES = dict(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=1, num_attention_heads=8,
              num_key_value_heads=8, head_dim=64, max_position_embeddings=32768, pad_token_id=0)


def build(kind: str) -> Any:
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**SHAPES)).eval()
    return DiffLlamaForCausalLM(DiffLlamaConfig(**SHAPES)).eval()


def variant(model: Any, attention: str, diff_mode: str | None) -> Callable[[torch.Tensor], tuple[float, float]]:
    """A function that prefills `ids` under this variant: (CPU seconds, wall seconds)."""
    from evalsuite.backends.hf import diff_attention, quant

    def prefill(ids: torch.Tensor) -> tuple[float, float]:
        if diff_mode is not None:
            diff_attention.install(model, diff_mode)
        model.set_attn_implementation("eager" if attention == "eager" else "sdpa")
        setting = quant.AttnQuant(8 if attention == "absmax" else 16)
        with quant.using(model, setting), torch.inference_mode():
            cpu, wall = time.process_time(), time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            return time.process_time() - cpu, time.perf_counter() - wall

    return prefill


def measure(lengths: list[int], attentions: list[str], repeats: int, explicit_max: int) -> None:
    llama, diff = build("llama"), build("diff")
    variants = {"llama": (llama, None), "before": (diff, "transformers"), "after": (diff, "one_pass")}
    print(f"threads {torch.get_num_threads()}; shapes {SHAPES}; medians of {repeats}")
    print("| tokens | attention | Llama CPU s | DiffLlama before CPU s | DiffLlama after CPU s "
          "| ratio before | ratio after | wall ratio before | wall ratio after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length in lengths:
        ids = torch.randint(3, SHAPES["vocab_size"], (1, length), generator=torch.Generator().manual_seed(length))
        for attention in attentions:
            if attention != "sdpa" and length > explicit_max:
                print(f"| {length} | {attention} | skipped above --explicit-max {explicit_max} |", flush=True)
                continue
            runs = {name: variant(model, attention, mode) for name, (model, mode) in variants.items()}
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
            for _ in range(repeats):  # interleaved: a slow spell of a shared machine hits every variant
                for name, run in runs.items():
                    times[name].append(run(ids))
            cpu = {name: statistics.median(t[0] for t in values) for name, values in times.items()}
            wall = {name: statistics.median(t[1] for t in values) for name, values in times.items()}
            print(f"| {length} | {attention} | {cpu['llama']:.1f} | {cpu['before']:.1f} | {cpu['after']:.1f} "
                  f"| {cpu['before'] / cpu['llama']:.2f} | {cpu['after'] / cpu['llama']:.2f} "
                  f"| {wall['before'] / wall['llama']:.2f} | {wall['after'] / wall['llama']:.2f} |", flush=True)


def kernels(length: int, repeats: int) -> None:
    """torch SDPA alone, 8 heads of width 64, causal: one map (Llama), two maps of value width 64
    (transformers' DiffLlama), one map of value width 128 (what the math kernel runs), and one map
    with query and key widened by zeros to 128 (what the one-pass module runs on a CPU)."""
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, length, 64, generator=generator) for _ in range(3))
    wide = torch.randn(1, 8, length, 128, generator=generator)
    calls = {"one map, value 64": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "two maps, value 64 each": lambda: [F.scaled_dot_product_attention(q, k, v, is_causal=True)
                                                  for _ in range(2)],
             "one map, value 128": lambda: F.scaled_dot_product_attention(q, k, wide, is_causal=True),
             "one map, query, key and value 128": lambda: F.scaled_dot_product_attention(
                 F.pad(q, (0, 64)), F.pad(k, (0, 64)), wide, is_causal=True, scale=64 ** -0.5)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.process_time()
            call()
            times[name].append(time.process_time() - start)
    for name, values in times.items():
        print(f"{length} tokens, {name}: {statistics.median(values):.2f} CPU s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384")
    parser.add_argument("--attention", default="sdpa,eager", help="comma-separated: sdpa, eager, absmax")
    parser.add_argument("--explicit-max", type=int, default=8192,
                        help="longest prompt for eager and absmax (eager holds n x n maps: 2 GiB each at 8K)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", type=int, default=0, help="time torch SDPA alone at this length instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.kernels:
        kernels(args.kernels, args.repeats)
        return
    measure([int(n) for n in args.lengths.split(",")], args.attention.split(","), args.repeats, args.explicit_max)


if __name__ == "__main__":
    main()
