"""The measurements of `gpu_evidence.py`, one function a table: each appends its rows to the list
it is given as it goes, so a step cut for time keeps the rows it finished.

Each step runs in a process of its own: `context` makes the run's `Context` (device, sizes, model
folders) there, `environment` describes the device and versions for the line above the tables,
and the step's function takes the context and the row list. `build_models` runs first and saves
the models into the folders every later step loads them from."""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_decoding import timed_run
from bench_gpu import ONE_B, TINY, matmul_rate, needle_requests
from bench_gpu_analyses import TASK_PARAMS, prefill_peak, task_run

from evalsuite.backends import load_model
from evalsuite.errors import UserError
from evalsuite.models.toy import ToySize, build_tokenizer, random_model

TINY_SIZE = ToySize(hidden=TINY.hidden, layers=TINY.layers, heads=TINY.heads, intermediate=TINY.intermediate,
                    max_context=4096)


@dataclass
class Context:
    device: str
    tiny: bool
    work: Path
    folders: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # lines printed under the step's table (the matmul rate...)
    rate: float = float("nan")

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.cuda else "float32"

    def lengths(self, gpu: tuple[int, ...], tiny: tuple[int, ...]) -> tuple[int, ...]:
        return tiny if self.tiny else gpu

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else float("nan")


KINDS = ("base", "diff", "diff2")
# imported by `context`, before a step's share begins: the code most steps reach, which each step's
# fresh process would otherwise import inside its share (transformers' model code alone takes seconds).
# DIFF V2's module first: it imports Llama's model code and registers itself with transformers' Auto
# classes; Llama's module imported first would start that registration half-way through itself
WARM = ("evalsuite.modeling.diffllama_v2", "transformers.models.diffllama.modeling_diffllama",
        "evalsuite.engine.runner", "evalsuite.analysis.plots")


def context(device: str, tiny: bool, work: Path) -> Context:
    """A step's context: the models' folders under `work` (built or not yet), the shared code imported."""
    if tiny:  # tiny models gain nothing from threads, and on shared cores threads wait on each other
        torch.set_num_threads(1)
    for module in WARM:
        importlib.import_module(module)
    return Context(device=device, tiny=tiny, work=work, folders={kind: work / kind for kind in KINDS})


def environment(ctx: Context) -> str:
    """The device, the versions and the models: what the tables were measured on."""
    import platform

    import transformers

    import evalsuite

    device = torch.cuda.get_device_name() if ctx.cuda else f"CPU ({platform.processor() or platform.machine()})"
    cuda = f", CUDA {torch.version.cuda}" if ctx.cuda else ""
    return (f"{device}: torch {torch.__version__}{cuda}, transformers {transformers.__version__}, "
            f"evalsuite {evalsuite.__version__}, Python {platform.python_version()}; "
            f"{'tiny random models, float32' if ctx.tiny else '~1.1B random models, bf16'}")


# ---- models: built once, random weights, saved in the dtype they run in ---------------------------------


def build_models(ctx: Context, rows: list[dict]) -> None:
    """Random ~1B Llama, DiffLlama and DIFF V2 (tiny ones on a CPU), saved in bf16 on a GPU: a
    float32 1B checkpoint would double the time spent writing and reading it."""
    size, tokenizer = (TINY_SIZE if ctx.tiny else ONE_B), build_tokenizer()
    for kind in KINDS:
        start = time.perf_counter()
        model = random_model(kind, len(tokenizer), size, seed=0)
        if ctx.cuda:
            model = model.to(torch.bfloat16)
        model.save_pretrained(ctx.folders[kind])
        tokenizer.save_pretrained(ctx.folders[kind])
        rows.append({"model": kind, "parameters (B)": f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f}",
                     "seconds": f"{time.perf_counter() - start:.1f}"})
        del model


# ---- prefill: tokens/s, share of the measured matmul rate, peak memory ------------------------------------


def work_flops(config: Any, tokens: int, params: int) -> float:
    """The FLOPs the equations ask of one prefill: 2 x parameters x tokens, plus causal QK^T and AV
    (half of n^2 each, per layer). DiffLlama: H maps of width d against values of width 2d, 1.5x
    a Llama's attention; DIFF V2: 2H query heads, each its own map, against values of width d."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = config.num_attention_heads
    if config.model_type == "diffllama_v2":
        qk, av = 2 * heads * head_dim, 2 * heads * head_dim
    elif config.model_type == "diffllama":
        qk, av = heads * head_dim, 2 * heads * head_dim
    else:
        qk, av = heads * head_dim, heads * head_dim
    return 2 * params * tokens + 2 * config.num_hidden_layers * tokens * tokens / 2 * (qk + av)


PREFILL_VARIANTS = (("base", "Llama", {}), ("diff", "DiffLlama, one pass", {}),
                    ("diff", "DiffLlama, transformers' two calls", {"diff_attention": "transformers"}),
                    ("diff2", "DIFF V2", {}))


def prefill(ctx: Context, rows: list[dict]) -> None:
    """One needle prompt per length through the hf backend, one new token: the prefill."""
    ctx.rate = matmul_rate(ctx.device, 1024 if ctx.tiny else 8192)
    ctx.notes.append(f"bf16 matrix-multiply rate measured in this run: {ctx.rate / 1e12:.1f} TFLOP/s"
                     if ctx.cuda else f"float32 matmul rate measured in this run: {ctx.rate / 1e9:.1f} GFLOP/s")
    lengths = ctx.lengths((8192, 32768, 65536), (256, 512, 1024))
    for kind, label, options in PREFILL_VARIANTS:
        model = load_model(str(ctx.folders[kind]), {"dtype": ctx.dtype, **options}, device=ctx.device, batch_size=1)
        params = sum(p.numel() for p in model.model.parameters())
        model.generate(needle_requests(model, 256, 1)[0])  # warm-up: kernels, allocator
        for length in lengths:
            requests, tokens = needle_requests(model, length, 1)
            ctx.reset_peak()
            ctx.sync()
            start = time.perf_counter()
            model.generate(requests)
            ctx.sync()
            seconds = time.perf_counter() - start
            share = work_flops(model.model.config, tokens[0], params) / seconds / ctx.rate
            rows.append({"model": label, "length": length, "prompt tokens": tokens[0],
                         "prefill tokens/s": f"{tokens[0] / seconds:,.0f}", "share of matmul rate": f"{share:.0%}",
                         "peak memory (GiB)": f"{ctx.peak_gib():.1f}"})
        del model
        ctx.reset_peak()


# ---- the paper-4k needle grid, end to end ------------------------------------------------------------


def needle_grid(ctx: Context, rows: list[dict]) -> None:
    """`evalsuite run --task needle -T preset=paper-4k` on the ~1B DiffLlama, through the runner.
    The row counts the prompts answered as they land, so a cut still says how far it got."""
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    params = {"preset": "paper-4k", **({"lengths": "384", "depths": "0,1", "samples": "1"} if ctx.tiny else {})}
    row: dict[str, Any] = {"model": "DiffLlama", "parameters": " ".join(f"{k}={v}" for k, v in params.items())}
    rows.append(row)
    start = time.perf_counter()
    batch = 32 if ctx.cuda else 8
    model = load_model(str(ctx.folders["diff"]), {"dtype": ctx.dtype}, device=ctx.device, batch_size=batch)
    task = make_task("needle", params)
    row["prompts"] = len(list(task.plan(None)))
    row["batch size"] = batch
    done = threading.Event()
    counting = threading.Thread(target=count_answers, args=(ctx.work / "grid", row, start, done), daemon=True)
    counting.start()
    run = run_task(task, model, RunOptions(out=ctx.work / "grid", progress=False, chunk=batch))
    ctx.sync()
    done.set()
    counting.join()
    row["seconds (loading included)"] = f"{time.perf_counter() - start:.1f}"
    row["answered"] = row["prompts"]
    row["correct_all"] = f"{json.loads((run.path / 'summary.json').read_text())['overall']['correct_all']:.3f}"
    row["prefilled tokens"] = model.prefilled_tokens


def count_answers(out: Path, row: dict[str, Any], start: float, done: threading.Event) -> None:
    """Every second until `done`: the samples written under `out` so far and the time, into the step's row."""
    while not done.wait(1.0):
        lines = sum(path.read_bytes().count(b"\n") for path in out.glob("**/samples.jsonl"))
        row["answered"], row["seconds (loading included)"] = lines, f"{time.perf_counter() - start:.1f}"


# ---- the diff-paper suite at a scale that fits; quick extrapolated from it --------------------------------


def paper_suite(ctx: Context, rows: list[dict]) -> None:
    """Each entry of the `diff-paper` suite that runs without data, on the pair, at the `tiny`
    scale (the whole thing in --tiny mode: one sample an entry); its time per prompt token
    times the `quick` scale's prompt tokens gives quick's time, extrapolated (linear in tokens:
    attention's growth with length is left out, so at 64K it is a floor)."""
    from evalsuite.engine.plan_cost import Calibration, plan_cost
    from evalsuite.engine.runner import RunOptions, check_task, planned_samples, run_task
    from evalsuite.engine.suite_run import check_needs, clipped
    from evalsuite.engine.suites import SuiteSettings, load_suite

    scales = {name: check_needs(load_suite("diff-paper", settings=SuiteSettings(scale=name)))
              for name in ("tiny", "quick")}
    quick = {entry.name: entry for entry in scales["quick"].entries}
    free = Calibration(0.0, 0.0)  # token counts only
    limit = 1 if ctx.tiny else None
    for kind, label in (("base", "Llama"), ("diff", "DiffLlama")):
        model = load_model(str(ctx.folders[kind]), {"dtype": ctx.dtype}, device=ctx.device, batch_size=8)
        for entry in scales["tiny"].entries[: 2 if ctx.tiny else None]:  # --tiny: the code path, briefly
            task, _ = clipped(entry.task, entry.clip, model.max_context)
            samples = planned_samples(task, check_task(task, model), limit)
            start = time.perf_counter()
            run_task(task, model, RunOptions(out=ctx.work / "suite" / kind, limit=limit, progress=False, chunk=8))
            ctx.sync()
            seconds = time.perf_counter() - start
            ran = plan_cost(task, model, samples, check_task(task, model), free).prompt_tokens
            big, _ = clipped(quick[entry.name].task, entry.clip, model.max_context)
            big_state = check_task(big, model)
            planned = plan_cost(big, model, planned_samples(big, big_state, None), big_state, free)
            rows.append({"model": label, "entry": entry.name, "samples run": len(samples),
                         "seconds": f"{seconds:.1f}", "prompt tokens run": ran,
                         "quick: samples": planned.samples, "quick: prompt tokens": planned.prompt_tokens,
                         "quick: seconds, extrapolated": f"{seconds * planned.prompt_tokens / max(1, ran):.0f}"})
        del model


# ---- attention and NLL at 32K / 64K ----------------------------------------------------------------------


def analyses(ctx: Context, rows: list[dict]) -> None:
    """bench_gpu_analyses' rows: a plain prefill's peak beside each analysis run's."""
    for kind in ("base", "diff"):
        for length in ctx.lengths((32768, 65536), (256,)):
            prefill_row = prefill_peak(ctx.folders[kind], ctx.device, ctx.dtype, length)
            rows.append({"model": kind, "length": length, "what": "prefill", "seconds": f"{prefill_row['seconds']:.1f}",
                         "peak memory (GiB)": f"{prefill_row['peak_gib']:.2f}"})
            for task in ("attention", "nll"):  # nll reads generated filler by default: nothing to download
                got = task_run(task, ctx.folders[kind], ctx.device, ctx.dtype, length,
                               ctx.work / f"{task}-{kind}-{length}", dict(TASK_PARAMS[task]))
                rows.append({"model": kind, "length": length, "what": task, "seconds": f"{got['seconds']:.1f}",
                             "peak memory (GiB)": f"{got['peak_gib']:.2f}"})


# ---- decoding: dynamic cache, static cache with CUDA graphs ------------------------------------------------


def decoding(ctx: Context, rows: list[dict]) -> None:
    """The needle sweep on the ~1B Llama under each decoding mode, the second run timed."""
    modes = {"continuous batching, dynamic cache (default)": {},  # the static cache next: before a cut comes
             "static cache + CUDA graphs (-M compile=true)": {"compile": "true"},
             "per batch, dynamic cache": {"continuous_batching": "false"}}
    lengths = "128" if ctx.tiny else "1024,2048"
    reference = None
    for name, options in modes.items():
        if options.get("compile") and not ctx.cuda:
            rows.append({"mode": name, "seconds": "CUDA only", "first run (s)": "", "records identical": "",
                         "records equal": ""})
            continue
        first, _ = timed_run(str(ctx.folders["base"]), {**options, "dtype": ctx.dtype}, 8, ctx.device, lengths,
                             ctx.work / f"decode-{len(rows)}-1")
        seconds, records = timed_run(str(ctx.folders["base"]), {**options, "dtype": ctx.dtype}, 8, ctx.device,
                                     lengths, ctx.work / f"decode-{len(rows)}-2")
        reference = reference or records
        rows.append({"mode": name, "seconds": f"{seconds:.2f}", "first run (s)": f"{first:.2f}",
                     "records identical": records == reference, "records equal": equal_lines(records, reference)})


def equal_lines(records: bytes, reference: bytes) -> str:
    """How many of the run's records equal the reference run's, line for line ("k of n"): in bf16
    on a GPU a batch's make-up can move a near-tie between two tokens of a random model."""
    ours, theirs = records.splitlines(), reference.splitlines()
    return f"{sum(a == b for a, b in zip(ours, theirs))} of {max(len(ours), len(theirs))}"


# ---- one real out-of-memory and the hf backend's back-off ------------------------------------------------


def out_of_memory(ctx: Context, rows: list[dict]) -> None:
    """Eight copies of one needle prompt in one call, with the GPU's free memory cut (by a held
    block) to about four rows' need: the first pass raises torch.OutOfMemoryError, the backend
    halves its batch (oom.py) and answers every row; the answers must equal one row's alone.
    A CPU cannot run out of memory safely: there the error is raised by a wrapped forward pass
    (labelled simulated) and the same back-off runs."""
    width = 256 if ctx.tiny else 8192
    model = load_model(str(ctx.folders["base"]), {"dtype": ctx.dtype, "max_batch_tokens": str(64 * width)},
                       device=ctx.device, batch_size=8)
    requests, _ = needle_requests(model, width, 1)
    ctx.reset_peak()
    before = torch.cuda.memory_allocated() if ctx.cuda else 0
    alone = model.generate(requests)[0]  # one row: the reference answer and the memory a row takes
    per_row = (torch.cuda.max_memory_allocated() - before) if ctx.cuda else 0
    block = None
    if ctx.cuda:
        free = torch.cuda.mem_get_info()[0]
        block = torch.empty(max(0, free - int(4.5 * per_row)), dtype=torch.uint8, device=ctx.device)
    else:
        simulate_oom(model.model, rows_over=4)
    start = time.perf_counter()
    try:
        answers = model.generate(requests * 8)
    finally:
        del block
    ctx.sync()
    limits = model.batch_limits
    rows.append({"kind": "real (torch.OutOfMemoryError from the CUDA allocator)" if ctx.cuda else "simulated on a CPU",
                 "rows x tokens asked": f"8 x {width}", "halvings": len(limits["halvings"]),
                 "rows after back-off": limits["rows"], "seconds": f"{time.perf_counter() - start:.1f}",
                 "answers equal one row's": all(answer == alone for answer in answers)})
    del model
    ctx.reset_peak()


def simulate_oom(module: torch.nn.Module, rows_over: int) -> None:
    """The module's forward raises torch.OutOfMemoryError on a batch of more than `rows_over` rows."""
    forward = module.forward

    def guarded(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[0] > rows_over:
            raise torch.OutOfMemoryError("simulated")
        return forward(*args, **kwargs)

    module.forward = guarded  # type: ignore[method-assign]


# ---- the long-context suite: tokens/s per entry and length ------------------------------------------------

CELL_SAMPLES = {False: 2, True: 1}  # samples run of each cell (tiny or not), spread over the cell's plan


def long_context(ctx: Context, rows: list[dict]) -> None:
    """The `long-context` suite's quick scale (tiny's with --tiny) on the pair, one cell (an entry at one
    length) at a time, shortest lengths first, each on the Llama then the DiffLlama: a few of the cell's
    samples through the runner's own `evaluate` (prompts built, answered, scored), timed, with the
    whole cell's time extrapolated. An entry that cannot run here (its data, lm-eval for ruler) is a
    row with the reason."""
    from evalsuite.engine.suites import SuiteSettings, load_suite

    suite = load_suite("long-context", settings=SuiteSettings(scale="tiny" if ctx.tiny else "quick"))
    per_cell = CELL_SAMPLES[ctx.tiny]
    ctx.notes.append(f"The suite's {suite.scale} scale; of each cell, {per_cell} sample(s) spread over its plan. "
                     "Prompt tokens/s: the cell's prompt tokens over its seconds (prompts built, prefilled, answered "
                     "and scored); tokens prefilled: what the model ran (a prefix shared by two prompts runs once)")
    models = {}
    for kind, label in (("base", "Llama"), ("diff", "DiffLlama")):
        models[label] = load_model(str(ctx.folders[kind]), {"dtype": ctx.dtype}, device=ctx.device, batch_size=8)
        models[label].generate(needle_requests(models[label], 256, 1)[0])  # warm-up: kernels, allocator
    cells = SuiteCells(suite.entries, rows)
    for length, entry in cells.order():
        for label, model in models.items():
            cells.run(ctx, entry, length, label, model, per_cell)


class SuiteCells:
    """The suite's entries as cells: each entry's task clipped to a model's context and prepared on it
    once (lm-eval's generation, for ruler) at its first cell; an entry that cannot run here is one row."""

    def __init__(self, entries: Sequence[Any], rows: list[dict]) -> None:
        self.rows = rows
        self.prepared: dict[tuple[str, str], tuple[Any, Any]] = {}  # (entry, model) -> (clipped task, state)
        self.skipped: set[str] = set()
        self.entries: list[Any] = []
        for entry in entries:
            why = entry.missing or unprepared(entry.task)
            if why is None:
                self.entries.append(entry)
            else:
                self.skip(entry, why)

    def order(self) -> list[tuple[int, Any]]:
        """(length, entry) by length, then the suite's order: every entry's shorter cells come first."""
        cells = [(length, index, entry) for index, entry in enumerate(self.entries) for length in entry.task.lengths]
        return [(length, entry) for length, _, entry in sorted(cells, key=lambda cell: cell[:2])]

    def skip(self, entry: Any, why: str) -> None:
        self.skipped.add(entry.name)
        self.rows.append({"model": "both", "entry": entry.name, "length": "all",
                          "samples run": f"none, skipped: {' '.join(why.split())}"})

    def state(self, entry: Any, label: str, model: Any) -> tuple[Any, Any] | None:
        """(the task clipped to the model's context, its state on the model); None when the entry is skipped."""
        from evalsuite.engine.runner import check_task
        from evalsuite.engine.suite_run import clipped

        if entry.name in self.skipped:
            return None
        if (entry.name, label) not in self.prepared:
            task, _ = clipped(entry.task, entry.clip, model.max_context)
            try:
                self.prepared[entry.name, label] = task, check_task(task, model)
            except (UserError, ImportError) as exc:  # what this machine lacks (lm-eval for ruler, a dataset)
                self.skip(entry, str(exc))
                return None
        return self.prepared[entry.name, label]

    def run(self, ctx: Context, entry: Any, length: int, label: str, model: Any, per_cell: int) -> None:
        """The cell's row: `per_cell` of its samples evaluated and timed (none for a skipped entry or a
        length over the model's context)."""
        from evalsuite.engine.runner import evaluate, planned_samples

        prepared = self.state(entry, label, model)
        if prepared is None or length not in prepared[0].lengths:
            return
        task, state = prepared
        cell = [s for s in planned_samples(task, state, None) if s.axes.get("context_length") == length]
        picked = [cell[i * len(cell) // per_cell] for i in range(min(per_cell, len(cell)))]
        before = model.prefilled_tokens
        ctx.sync()
        start = time.perf_counter()
        records = evaluate(task, model, state, picked, log_prompts=True)
        ctx.sync()
        seconds = time.perf_counter() - start
        prompts = [text for record in records for text in record.prompt["text"]]
        tokens = sum(model.count_tokens(text) for text in prompts)
        self.rows.append({"model": label, "entry": entry.name, "length": length,
                          "samples run": f"{len(picked)} of {len(cell)}", "prompts": len(prompts),
                          "prompt tokens": tokens, "tokens prefilled": model.prefilled_tokens - before,
                          "seconds": f"{seconds:.2f}", "prompt tokens/s": f"{tokens / seconds:,.0f}",
                          "whole cell (s), extrapolated": f"{seconds * len(cell) / max(1, len(picked)):.1f}"})


def unprepared(task: Any) -> str | None:
    """Why the task cannot be prepared without a model (its data files), or None."""
    try:
        task.prepare(None)
    except (UserError, ImportError) as exc:
        return str(exc)
    return None
