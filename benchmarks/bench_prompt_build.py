"""How long a needle prompt takes to build, as a multiple of one tokenization of it.

    python benchmarks/bench_prompt_build.py                          # SmolLM2's tokenizer, 4K/16K/64K
    python benchmarks/bench_prompt_build.py --lengths 4096 --samples 3 --no-chat-template
    python benchmarks/bench_prompt_build.py --exact                  # the builder that counts every candidate

For every sample of a needle plan (one needle, depths 0, 0.5 and 1), the time of the task's
`requests` (haystack drawn and counted, needle placed, prompt verified, depth measured) and
the time of one `count_tokens` of the finished prompt, through the hf backend's token rules
over the model's own tokenizer (no weights are loaded). The table gives, per length, the
median of the per-sample ratios and the median times. `--exact` builds with
`kit.depth.fit_at_depth`, which tokenizes every candidate prompt whole, for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from evalsuite.backends.common.tokens import TokenizerAdapter
from evalsuite.backends.server.tokens import load_tokenizer
from evalsuite.tasks.kit import prompt as kit_prompt
from evalsuite.tasks.kit.depth import fit_at_depth
from evalsuite.tasks.needle.task import Needle


def exact_builder(target: int, depth: float, supply: Any, *args: Any) -> Any:
    return fit_at_depth(target, depth, supply.sentences, *args)


def time_length(model: TokenizerAdapter, length: int, samples: int, repeats: int) -> dict[str, float]:
    task = Needle(lengths=(length,), depths=(0.0, 0.5, 1.0), samples=samples)
    state = task.prepare(model)
    ratios, builds, counts = [], [], []
    for sample in task.plan(state):
        for _ in range(repeats):
            start = time.perf_counter()
            (request,), _ = task.requests(sample, model, state)
            built = time.perf_counter() - start
            start = time.perf_counter()
            model.count_tokens(request.prompt)
            counted = time.perf_counter() - start
            ratios.append(built / counted)
            builds.append(built)
            counts.append(counted)
    return {"ratio": statistics.median(ratios), "build": statistics.median(builds),
            "count": statistics.median(counts), "n": len(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="smollm2", help="a model name, folder or gguf:PATH (default smollm2)")
    parser.add_argument("--lengths", default="4096,16384,65536")
    parser.add_argument("--samples", type=int, default=2, help="samples per depth (3 depths)")
    parser.add_argument("--repeats", type=int, default=3, help="builds per sample")
    parser.add_argument("--no-chat-template", action="store_true")
    parser.add_argument("--exact", action="store_true", help="build with fit_at_depth (every candidate counted)")
    args = parser.parse_args()
    if args.exact:
        kit_prompt.place_at_depth = exact_builder  # type: ignore[assignment]
    model = TokenizerAdapter(load_tokenizer(args.tokenizer), chat_template=not args.no_chat_template)
    builder = "fit_at_depth (exact)" if args.exact else "place_at_depth"
    print(f"tokenizer {Path(args.tokenizer).name}, chat template {model.chat_template}, builder {builder}")
    print(f"{'length':>7} {'builds':>6} {'build ms':>9} {'count ms':>9} {'build / count':>14}")
    for length in (int(x) for x in args.lengths.split(",")):
        row = time_length(model, length, args.samples, args.repeats)
        print(f"{length:>7} {row['n']:>6} {row['build'] * 1e3:>9.1f} {row['count'] * 1e3:>9.1f} {row['ratio']:>14.2f}")


if __name__ == "__main__":
    main()
