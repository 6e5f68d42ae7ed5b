"""Everything a user's GPU run depends on, measured by one command in at most 8 minutes on one
H100 or H200, written as tables into docs/gpu.md (between the markers below, the rest of the
file kept) with the GPU, the versions and the command:

    python benchmarks/gpu_evidence.py                      # CUDA: ~1B random models in bf16
    python benchmarks/gpu_evidence.py --device cpu --tiny  # every step on tiny models, under a minute

Random-weight Llama, DiffLlama and DIFF V2 of ~1.1B parameters are built from configs (nothing
is downloaded, and the building is not cut), then each step runs in its share of the time (SHARES): prefill tokens/s, share of
the matmul rate measured in the same run and peak memory at 8K/32K/64K; the paper-4k needle grid
end to end; the diff-paper suite at its tiny scale on the pair, with quick's time extrapolated;
the attention and NLL analyses at 32K/64K; decoding with and without the static cache and CUDA
graphs; one forced out-of-memory and the hf backend's recovery. A step over its share is cut
with one line under the rows it finished, and the next step runs. --tiny writes to a temporary
file unless --out is given, so a smoke run never replaces the GPU's tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# nothing is downloaded: a suite entry whose data is missing is skipped at once, not retried
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import gpu_evidence_steps as steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- gpu_evidence:start -->", "<!-- gpu_evidence:end -->"
BUILD = "Models built from configs (random weights)"  # before the steps, not cut: every step needs them
# (heading, function, seconds on a GPU, seconds with --tiny): 420 s in all on a GPU, under the
# 8 minutes with the models' building (about a minute), imports and writing; 36 s with --tiny
SHARES: tuple[tuple[str, Callable[[steps.Context, list[dict]], None], float, float], ...] = (
    ("Prefill at 8K, 32K and 64K tokens", steps.prefill, 90, 6),
    ("The paper-4k needle grid, end to end", steps.needle_grid, 110, 7),
    ("The diff-paper suite at its tiny scale; quick extrapolated", steps.paper_suite, 70, 7),
    ("Attention and NLL analyses at 32K and 64K", steps.analyses, 70, 6),
    ("Decoding: dynamic cache, static cache and CUDA graphs", steps.decoding, 50, 6),
    ("A forced out-of-memory and the back-off", steps.out_of_memory, 30, 4),
)


class StepCut(BaseException):
    """A step's share of time ran out (a BaseException: no `except Exception` inside swallows it)."""


def _cut(signum: int, frame: Any) -> None:
    # raised where the step happens to be; where that swallows it (a weakref callback prints and
    # drops exceptions), the timer fires again shortly, until the step is out
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    raise StepCut


def run_step(ctx: steps.Context, function: Callable[[steps.Context, list[dict]], None], share: float
             ) -> tuple[list[dict], str]:
    """(rows, a line under them): the step's rows as far as it got in `share` seconds."""
    rows: list[dict] = []
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _cut)
    signal.setitimer(signal.ITIMER_REAL, share)
    try:
        function(ctx, rows)
        line = f"Took {time.perf_counter() - start:.1f} s (share {share:.0f} s)."
    except StepCut:
        line = f"**Cut after {time.perf_counter() - start:.1f} s, its share; the rows above are those it finished.**"
    except Exception as exc:  # one step's failure is reported in its place; the others still run
        line = f"**Failed after {time.perf_counter() - start:.1f} s: {type(exc).__name__}: {str(exc)[:300]}**"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return rows, line


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def header(ctx: steps.Context, argv: list[str], seconds: float) -> str:
    import torch
    import transformers

    import evalsuite

    device = torch.cuda.get_device_name() if ctx.cuda else f"CPU ({platform.processor() or platform.machine()})"
    cuda = f", CUDA {torch.version.cuda}" if ctx.cuda else ""
    return (f"Measured on {device}: torch {torch.__version__}{cuda}, transformers {transformers.__version__}, "
            f"evalsuite {evalsuite.__version__}, Python {platform.python_version()}; "
            f"{'tiny random models, float32' if ctx.tiny else '~1.1B random models, bf16'}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:.0f} s in all.\n\n"
            f"```bash\npython benchmarks/gpu_evidence.py {shlex.join(argv)}\n```")


def write(out: Path, text: str) -> None:
    """The section between the markers replaced (appended when the file has none)."""
    section = f"{START}\n{text}\n{END}"
    old = out.read_text(encoding="utf-8") if out.is_file() else ""
    if START in old and END in old:
        new = old[: old.index(START)] + section + old[old.index(END) + len(END):]
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "") + "## Evidence from one run\n\n" + section + "\n"
    out.write_text(new, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models, short lengths, small shares (CI smoke run)")
    parser.add_argument("--share-factor", type=float, default=1.0,
                        help="every step's share of time times this (a slow or shared machine)")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file to write (default docs/gpu.md; with --tiny a temporary file)")
    args = parser.parse_args()
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-evidence-")) / "gpu.md" if args.tiny else ROOT / "docs/gpu.md")
    if args.tiny:  # tiny models gain nothing from threads, and on shared cores threads wait on each other
        import torch

        torch.set_num_threads(1)
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-evidence-") as work:
        ctx = steps.Context(device=args.device, tiny=args.tiny, work=Path(work))
        built: list[dict] = []
        start = time.perf_counter()
        steps.build_models(ctx, built)
        line = f"Took {time.perf_counter() - start:.1f} s."
        print(f"{BUILD}: {line}", flush=True)
        sections = [f"### {BUILD}\n\n{markdown_table(built)}\n\n{line}"]
        for heading, function, share, tiny_share in SHARES:
            rows, line = run_step(ctx, function, (tiny_share if args.tiny else share) * args.share_factor)
            print(f"{heading}: {line}", flush=True)
            sections.append(f"### {heading}\n\n{markdown_table(rows)}\n\n{line}")
    notes = "".join(f"\n\n{note}." for note in ctx.notes)
    write(out, header(ctx, sys.argv[1:], time.perf_counter() - begin) + notes + "\n\n" + "\n\n".join(sections))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
