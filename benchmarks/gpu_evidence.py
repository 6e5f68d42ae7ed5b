"""Everything a user's GPU run depends on, measured by one command in about 9 minutes on one
H100 or H200, written as tables into docs/gpu.md (between the markers below, the rest of the
file kept) with the GPU, the versions and the command:

    python benchmarks/gpu_evidence.py                      # CUDA: ~1B random models in bf16
    python benchmarks/gpu_evidence.py --resume             # a second device: only the tables not finished
    python benchmarks/gpu_evidence.py --device cpu --tiny  # every step on tiny models, a few minutes on a CPU

Random-weight Llama, DiffLlama and DIFF V2 of ~1.1B parameters are built from configs (nothing
is downloaded), then each step runs in its share of the time (STEPS): prefill tokens/s, share of
the matmul rate measured in the same run and peak memory at 8K/32K/64K; the paper-4k needle grid
end to end; the diff-paper suite at its tiny scale on the pair, with quick's time extrapolated;
the attention and NLL analyses at 32K/64K; decoding with and without the static cache and CUDA
graphs; one forced out-of-memory and the hf backend's recovery; the long-context suite's quick
scale on the pair, tokens/s per entry and length (a few samples a cell).

Each step (the building too) runs in a process of its own, a child of this one (which imports
nothing heavy itself): its share counts from the moment its process has imported its libraries and
starts the step, and at the share's end this process stops the child's whole process group
(SIGTERM: the child writes the rows it finished and exits; SIGKILL after a grace). A cut, a
crash or a half-finished import ends that process only, and the next step starts clean. Each
table is written to the file the moment its step ends; `--resume` keeps the tables of the steps
that passed and runs only the others, so a second device continues where the first stopped.
The exit code is the number of steps that did not pass (0: every table complete; 64: bad
options). --tiny writes to a temporary file unless --out is given, so a smoke run never
replaces the GPU's tables.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

# nothing is downloaded: a suite entry whose data is missing is skipped at once, not retried
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
STEPS_FILE = Path(__file__).resolve().with_name("gpu_evidence_steps.py")
START, END = "<!-- gpu_evidence:start -->", "<!-- gpu_evidence:end -->"


@dataclass(frozen=True)
class Step:
    """One table: the function of the steps module that fills it, and its share of time in seconds
    on a GPU and with --tiny."""

    function: str
    heading: str
    share: float
    tiny_share: float


# the models every step reads; a limit, not a share to fit in: it takes about a minute on a GPU
BUILD = Step("build_models", "Models built from configs (random weights)", 300, 60)
# 450 s in all on a GPU: with the building and each process's imports (a few seconds a step,
# outside the shares) about 9 minutes; 46 s with --tiny. Prefill and the out-of-memory step took
# 18 s and 3 s of their shares on an H200: their shares are a bound, not what they need
STEPS = (
    Step("prefill", "Prefill at 8K, 32K and 64K tokens", 60, 6),
    Step("needle_grid", "The paper-4k needle grid, end to end", 110, 7),
    Step("paper_suite", "The diff-paper suite at its tiny scale; quick extrapolated", 70, 7),
    Step("analyses", "Attention and NLL analyses at 32K and 64K", 70, 6),
    Step("decoding", "Decoding: dynamic cache, static cache and CUDA graphs", 50, 6),
    Step("out_of_memory", "A forced out-of-memory and the back-off", 20, 4),
    Step("long_context", "The long-context suite: tokens/s per entry and length", 70, 10),
)
STARTUP_LIMIT = 180.0  # seconds a step's process may take to import torch and its models' code
GRACE = 2.0  # seconds a stopped step has to write its rows before its process group is killed
USAGE_ERROR = os.EX_USAGE  # 64: apart from the step counts
PASSED = "Took "  # how the line under a passed step's table begins


# ---- the child: one step in its own process ----------------------------------------------------------


@dataclass
class ChildSpec:
    """What a step's process is told, as JSON on its command line."""

    function: str
    device: str
    tiny: bool
    steps: str  # the steps module's file
    work: str  # the run's folder: the models, each step's outputs
    result: str  # the JSON file the step's rows go to
    lifeline: int  # a socket: the step's start is sent on it; its end means the parent is gone


class Record:
    """What a step's process reports, rewritten whole at every change (written aside, then renamed):
    the rows finished so far survive any end of the process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = SavedRows(self)
        self.data: dict[str, Any] = {"about": "", "rows": self.rows, "notes": [], "began": False,
                                     "imports": None, "seconds": 0.0, "error": None, "done": False}
        self.created, self.began = time.perf_counter(), 0.0

    def save(self) -> None:
        if self.data["began"]:
            self.data["seconds"] = time.perf_counter() - self.began
        aside = self.path.with_suffix(".tmp")
        aside.write_text(json.dumps(self.data, default=str), encoding="utf-8")
        os.replace(aside, self.path)

    def begin(self) -> None:
        self.began, self.data["began"] = time.perf_counter(), True
        self.data["imports"] = self.began - self.created
        self.save()

    def end(self, code: int, **data: Any) -> NoReturn:
        """Saved and gone at once: nothing of the process (atexit, CUDA's teardown) runs after."""
        self.data.update(data)
        self.save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def fail(self, exc: BaseException) -> NoReturn:
        traceback.print_exc()
        self.end(1, error=" ".join(f"{type(exc).__name__}: {exc}".split())[:300])


class SavedRows(list):
    """A step's row list: each row appended is saved at once."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    def append(self, row: Any) -> None:
        super().append(row)
        self.record.save()


def load_steps(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def end_with_parent(lifeline: socket.socket) -> None:
    """Blocks until the parent's end of the lifeline closes, then kills this step's process group:
    a step never outlives the run that started it (killed or not)."""
    try:
        while lifeline.recv(1):
            pass
    finally:
        os.killpg(os.getpgrp(), signal.SIGKILL)


def run_child(spec: ChildSpec) -> NoReturn:
    """One step: imports, the step's start sent to the parent, the step, its record."""
    record = Record(Path(spec.result))
    os.set_inheritable(spec.lifeline, False)  # the step's own subprocesses must not hold it open
    lifeline = socket.socket(fileno=spec.lifeline)
    threading.Thread(target=end_with_parent, args=(lifeline,), daemon=True).start()
    try:
        steps = load_steps(Path(spec.steps))
        ctx = steps.context(spec.device, spec.tiny, Path(spec.work))
        record.data.update(about=steps.environment(ctx), notes=ctx.notes)
        function: Callable[[Any, list[dict]], None] = getattr(steps, spec.function)
    except Exception as exc:  # reported in the step's place
        record.fail(exc)
    signal.signal(signal.SIGTERM, lambda signum, frame: record.end(128 + signum))
    record.begin()
    lifeline.sendall(b"s")
    try:
        function(ctx, record.rows)
    except Exception as exc:
        record.fail(exc)
    record.end(0, done=True)


# ---- the parent: each step started, timed and stopped from outside ------------------------------------


@dataclass
class Run:
    """This invocation: where the steps' processes look and how long they get."""

    device: str
    tiny: bool
    steps: Path
    work: Path
    share_factor: float

    def limit(self, step: Step) -> float:
        return (step.tiny_share if self.tiny else step.share) * self.share_factor


@dataclass
class Outcome:
    """One step's table as it ends up: its rows, its notes and the line under them."""

    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    line: str = ""
    about: str = ""

    @property
    def passed(self) -> bool:
        return self.line.startswith(PASSED)


def kill_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # the group is gone already
        pass


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the step's process group (the step writes its rows), SIGKILL after GRACE."""
    kill_group(process, signal.SIGTERM)
    try:
        process.wait(GRACE)
    except subprocess.TimeoutExpired:
        kill_group(process, signal.SIGKILL)


def watch(process: subprocess.Popen, lifeline: socket.socket, limit: float) -> tuple[str, float]:
    """("ended" | "cut" | "no start", seconds since the step began): the step's process waited for
    until it ends, stopped when its imports pass STARTUP_LIMIT or its step passes `limit`."""
    if not select.select([lifeline], [], [], STARTUP_LIMIT)[0]:
        stop(process)
        return "no start", 0.0
    began = time.perf_counter()
    if lifeline.recv(1) != b"s":  # it ended before its step began
        process.wait()
        return "ended", 0.0
    try:
        process.wait(limit)
        return "ended", time.perf_counter() - began
    except subprocess.TimeoutExpired:
        seconds = time.perf_counter() - began
        stop(process)
        return "cut", seconds


def run_step(step: Step, run: Run) -> Outcome:
    """The step in a process of its own, its share enforced from here; its table as far as it got."""
    result, limit = run.work / f"{step.function}.json", run.limit(step)
    ours, theirs = socket.socketpair()
    spec = ChildSpec(step.function, run.device, run.tiny, str(run.steps), str(run.work), str(result), theirs.fileno())
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(spec))],
                               pass_fds=(theirs.fileno(),), start_new_session=True)
    theirs.close()
    try:
        state, seconds = watch(process, ours, limit)
    finally:  # whatever happened here (a cut, ^C, SIGTERM), the step's whole group goes
        kill_group(process, signal.SIGKILL)
        process.wait()
        ours.close()
    record = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else {}
    line = outcome_line(state, seconds, limit, record, process.returncode, step is BUILD)
    if record.get("imports") is not None:  # the cost of a fresh process, outside the share
        line += f" Its process imported for {record['imports']:.1f} s before the step."
    return Outcome(record.get("rows", []), record.get("notes", []), line, record.get("about", ""))


def outcome_line(state: str, seconds: float, limit: float, record: dict, code: int, building: bool) -> str:
    """The line under a step's table: how long it took, or why its table is short."""
    if state == "no start":
        return f"**Cut: its process had not started the step after {STARTUP_LIMIT:.0f} s of imports.**"
    if state == "cut":
        return f"**Cut after {seconds:.1f} s, its share; the rows above are those it finished.**"
    if record.get("done") and code == 0:
        return f"{PASSED}{record['seconds']:.1f} s ({'limit' if building else 'share'} {limit:.0f} s)."
    if not record.get("began"):
        return f"**Failed before the step began: {record.get('error') or exit_status(code)}**"
    if record.get("error"):
        return f"**Failed after {record['seconds']:.1f} s: {record['error']}**"
    return f"**Failed after {seconds:.1f} s: its process ended with {exit_status(code)}.**"


def exit_status(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal, which has no name
        return f"signal {-code}"


# ---- the file: tables, headers, what an earlier run left ------------------------------------------------


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def section(step: Step, outcome: Outcome) -> str:
    notes = "".join(f"{note}.\n\n" for note in outcome.notes)
    return f"### {step.heading}\n\n{markdown_table(outcome.rows)}\n\n{notes}{outcome.line}"


def header(about: str, resumed: bool, argv: list[str], seconds: float) -> str:
    return (f"{'Resumed' if resumed else 'Measured'} on {about}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:.0f} s.\n\n"
            f"```bash\npython benchmarks/gpu_evidence.py {shlex.join(argv)}\n```")


def earlier_run(out: Path) -> tuple[str, dict[str, str]]:
    """(the headers above the tables, heading -> section for each step that passed) from the
    section an earlier run wrote into `out`; nothing when no step's table there is complete."""
    text = out.read_text(encoding="utf-8") if out.is_file() else ""
    if START not in text or END not in text:
        return "", {}
    parts = re.split(r"^(?=### )", text[text.index(START) + len(START): text.index(END)], flags=re.M)
    headings = {step.heading for step in STEPS}
    passed = {}
    for part in parts[1:]:
        heading, body = part.strip().removeprefix("### ").split("\n", 1)[0], part.strip()
        if heading in headings and body.splitlines()[-1].startswith(PASSED):
            passed[heading] = body
    return (parts[0].strip() if passed else ""), passed


def write(out: Path, text: str) -> None:
    """The section between the markers replaced (appended when the file has none); the file is
    written aside and renamed, so a kill mid-write leaves the last complete one."""
    block = f"{START}\n{text}\n{END}"
    old = out.read_text(encoding="utf-8") if out.is_file() else ""
    if START in old and END in old:
        new = old[: old.index(START)] + block + old[old.index(END) + len(END):]
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "") + "## Evidence from one run\n\n" + block + "\n"
    aside = out.with_name(out.name + ".tmp")
    aside.write_text(new, encoding="utf-8")
    os.replace(aside, out)


# ---- the whole run ------------------------------------------------------------------------------------


class Report:
    """The run's tables, in STEPS' order, written to `out` after every step."""

    def __init__(self, out: Path, earlier: str, kept: dict[str, str], argv: list[str]) -> None:
        self.out, self.earlier, self.argv = out, earlier, argv
        self.sections = dict(kept)
        self.about, self.begin = "", time.perf_counter()

    def add(self, step: Step, outcome: Outcome) -> None:
        print(f"{step.heading}: {outcome.line}", flush=True)
        self.about = self.about or outcome.about
        self.sections[step.heading] = section(step, outcome)
        own = header(self.about or "an undescribed device", bool(self.earlier), self.argv,
                     time.perf_counter() - self.begin)
        tables = [self.sections[s.heading] for s in (BUILD, *STEPS) if s.heading in self.sections]
        write(self.out, "\n\n".join(filter(None, [self.earlier, own, *tables])))

    def failed(self) -> int:
        """The steps whose tables did not pass (the building included)."""
        return sum(not text.splitlines()[-1].startswith(PASSED) for text in self.sections.values())


def run_all(run: Run, plan: list[Step], report: Report) -> None:
    built = run_step(BUILD, run)
    report.add(BUILD, built)
    for step in plan:
        report.add(step, run_step(step, run) if built.passed else Outcome(line="**Not run: the models were not built.**"))


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line and USAGE_ERROR, not 2 (which reads as two steps)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(description=(__doc__ or "").split("\n\n")[0],
                    epilog="exit code: the number of steps that did not pass (0: every table complete); 64: bad options")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models, short lengths, small shares (CI smoke run)")
    parser.add_argument("--share-factor", type=float, default=1.0,
                        help="every step's share of time times this (a slow or shared machine)")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file to write (default docs/gpu.md; with --tiny a temporary file)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the tables of the steps that passed in --out and run only the others")
    parser.add_argument("--steps", type=Path, default=STEPS_FILE,
                        help="the Python file of the step functions (default benchmarks/gpu_evidence_steps.py)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a step's own process: its ChildSpec as JSON
    args = parser.parse_args(argv)
    if args.resume and args.tiny and args.out is None:
        parser.error("--resume with --tiny needs --out: a tiny run's default file is a new temporary one")
    if not args.steps.is_file():
        parser.error(f"--steps: no such file: {args.steps}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.child:
        run_child(ChildSpec(**json.loads(args.child)))
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-evidence-")) / "gpu.md" if args.tiny else ROOT / "docs/gpu.md")
    earlier, kept = earlier_run(out) if args.resume else ("", {})
    plan = [step for step in STEPS if step.heading not in kept]
    if not plan:
        print(f"every step's table in {out} is complete: nothing to run")
        return 0
    # a SIGTERM to this process ends it through its `finally`s: the running step's group killed, the folder removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report = Report(out, earlier, kept, argv)
    with tempfile.TemporaryDirectory(prefix="gpu-evidence-") as work:
        run_all(Run(args.device, args.tiny, args.steps.resolve(), Path(work), args.share_factor), plan, report)
    print(f"wrote {out}")
    return report.failed()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
