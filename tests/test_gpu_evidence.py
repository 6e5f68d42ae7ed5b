"""benchmarks/gpu_evidence.py: its --device cpu --tiny mode writes every table the GPU run writes,
each with rows, so the script cannot rot before a GPU comes; each step runs in a process of its
own, so a step cut in the middle of an import or crashed spoils no later step; --resume runs only
the steps whose tables are missing or incomplete; on a GPU, the forced out-of-memory is a real
one and recovers.

The fast tests run the real script with stand-in steps (--steps): real processes, real signals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_evidence  # noqa: E402

HEADINGS = [step.heading for step in (gpu_evidence.BUILD, *gpu_evidence.STEPS)]
HEADING = {step.function: step.heading for step in (gpu_evidence.BUILD, *gpu_evidence.STEPS)}

# Stand-ins for gpu_evidence_steps.py: every step appends a row, does what FAKE_BEHAVIOUR says
# for it, then imports `plotting` (written beside it) and uses one of its names, as the real
# steps import matplotlib; the import sleeps when FAKE_IMPORT_SLOWLY is set, so a cut lands in it.
FAKE_STEPS = '''
import json, os, signal, time
from dataclasses import dataclass, field


@dataclass
class Context:
    notes: list = field(default_factory=list)


def context(device, tiny, work):
    return Context()


def environment(ctx):
    return "a test machine"


def log(event):
    with open(os.environ["FAKE_LOG"], "a") as file:
        file.write(f"{os.environ['FAKE_RUN']} {event}\\n")


def step(name):
    def function(ctx, rows):
        log(f"{name} {os.getpid()}")
        rows.append({"step": name, "run": os.environ["FAKE_RUN"]})
        behaviour = json.loads(os.environ.get("FAKE_BEHAVIOUR", "{}")).get(name)
        if behaviour == "import slowly":
            os.environ["FAKE_IMPORT_SLOWLY"] = "1"
        elif behaviour == "raise":
            raise RuntimeError(f"{name} broke")
        elif behaviour == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif behaviour == "ignore the stop":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
        elif behaviour == "sleep":
            time.sleep(60)
        import plotting
        rows.append({"step": name, "run": os.environ["FAKE_RUN"], "artist": plotting.artist})
        ctx.notes.append(f"{name} noted")
    return function


for name in ("build_models", "prefill", "needle_grid", "paper_suite", "analyses", "decoding", "out_of_memory",
             "long_context"):
    globals()[name] = step(name)
'''
PLOTTING = '''
import os, time

if os.environ.get("FAKE_IMPORT_SLOWLY"):
    time.sleep(60)  # a cut comes here, with the module half-imported
artist = "drawn"
'''


def sections(text: str) -> dict[str, str]:
    """### heading -> the text under it, within the script's markers."""
    inside = text[text.index(gpu_evidence.START): text.index(gpu_evidence.END)]
    parts = re.split(r"^### (.+)$", inside, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def table_rows(body: str) -> list[str]:
    lines = [line for line in body.splitlines() if line.startswith("|")]
    return lines[2:]  # past the header and the rule


@pytest.fixture
def fake(tmp_path):
    """(the command before its options, the environment, the log of the steps run) for runs with
    the stand-in steps; the runs' scratch folders under tmp_path."""
    (tmp_path / "fake_steps.py").write_text(FAKE_STEPS)
    (tmp_path / "plotting.py").write_text(PLOTTING)
    log = tmp_path / "steps.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path), "FAKE_LOG": str(log)}
    command = [sys.executable, str(BENCHMARKS / "gpu_evidence.py"), "--device", "cpu", "--tiny",
               "--steps", str(tmp_path / "fake_steps.py"), "--out", str(tmp_path / "gpu.md")]
    return command, env, log


def steps_run(log: Path, run: str) -> list[str]:
    lines = log.read_text().splitlines() if log.is_file() else []
    return [line.split()[1] for line in lines if line.split()[0] == run]


def test_a_cut_in_an_import_and_crashes_spoil_no_later_step_and_the_exit_code_counts_them(fake, tmp_path):
    command, env, log = fake
    behaviour = {"needle_grid": "import slowly", "paper_suite": "raise", "analyses": "die", "decoding": "ignore the stop"}
    # tiny shares x0.15: 0.6-1.05 s, ample for a stand-in step's milliseconds, short for the sleeps
    done = subprocess.run([*command, "--share-factor", "0.15"], env={**env, "FAKE_RUN": "1",
                          "FAKE_BEHAVIOUR": json.dumps(behaviour)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stdout + done.stderr
    found = sections((tmp_path / "gpu.md").read_text())
    assert list(found) == HEADINGS
    assert "Measured on a test machine;" in (tmp_path / "gpu.md").read_text()
    for function in ("build_models", "prefill", "out_of_memory", "long_context"):  # imports what needle_grid's cut left
        body = found[HEADING[function]]
        assert len(table_rows(body)) == 2 and "| drawn |" in body and f"{function} noted." in body, body
        assert body.strip().splitlines()[-1].startswith("Took "), body
    for function in ("needle_grid", "paper_suite", "analyses", "decoding"):
        assert len(table_rows(found[HEADING[function]])) == 1, found[HEADING[function]]  # the row before the trouble
    assert "**Cut after" in found[HEADING["needle_grid"]]
    assert "**Failed after" in found[HEADING["paper_suite"]]
    assert "RuntimeError: paper_suite broke" in found[HEADING["paper_suite"]]
    assert "its process ended with signal SIGKILL" in found[HEADING["analyses"]]
    assert "**Cut after" in found[HEADING["decoding"]]  # killed after GRACE: its row was saved when appended

    # a resume runs the four that did not pass (after the models' building) and keeps the rest
    resumed = subprocess.run([*command, "--resume"], env={**env, "FAKE_RUN": "2"}, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert steps_run(log, "2") == ["build_models", "needle_grid", "paper_suite", "analyses", "decoding"]
    again = sections((tmp_path / "gpu.md").read_text())
    assert again[HEADING["prefill"]] == found[HEADING["prefill"]]
    assert all("| drawn |" in body for body in again.values())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its reaping is left


def test_resume_after_a_killed_run_writes_only_the_missing_tables(fake, tmp_path):
    command, env, log = fake
    out = tmp_path / "gpu.md"
    out.write_text("# GPU measurements\n\nEarlier text.\n\n<!-- gpu_evidence:start -->\nNot measured yet.\n"
                   "<!-- gpu_evidence:end -->\n\nText after.\n")
    first = subprocess.Popen([*command, "--share-factor", "20"], env={**env, "FAKE_RUN": "1",
                             "FAKE_BEHAVIOUR": json.dumps({"analyses": "sleep"})}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while "analyses" not in steps_run(log, "1") and time.monotonic() < deadline:
        time.sleep(0.05)
    first.kill()  # SIGKILL: no chance to clean up
    first.wait()
    orphan = int(log.read_text().split()[-1])
    killed = sections(out.read_text())
    assert list(killed) == HEADINGS[:4]  # the building and three steps, written as each ended

    resumed = subprocess.run([*command, "--resume"], env={**env, "FAKE_RUN": "2"}, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert steps_run(log, "2") == ["build_models", "analyses", "decoding", "out_of_memory", "long_context"]
    text = out.read_text()
    assert text.startswith("# GPU measurements\n\nEarlier text.\n") and text.endswith("\n\nText after.\n")
    assert "Measured on a test machine;" in text and "Resumed on a test machine;" in text
    assert "Not measured yet." not in text
    found = sections(text)
    assert list(found) == HEADINGS
    for heading in HEADINGS[1:4]:
        assert found[heading].strip() == killed[heading].strip() and "| 1 |" in found[heading]
    for heading in (HEADINGS[0], *HEADINGS[4:]):
        assert "| 2 |" in found[heading] and "| 1 |" not in found[heading]
    # the step running when its parent was killed went with it
    deadline = time.monotonic() + 10
    while alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(orphan)

    # every table complete: a resume runs nothing and leaves the file as it is
    nothing = subprocess.run([*command, "--resume"], env={**env, "FAKE_RUN": "3"}, capture_output=True, text=True,
                             timeout=60)
    assert nothing.returncode == 0 and "nothing to run" in nothing.stdout
    assert out.read_text() == text and steps_run(log, "3") == []


def test_bad_options_end_with_one_line_and_an_exit_code_apart_from_the_step_counts(capsys, tmp_path):
    with pytest.raises(SystemExit) as ended:
        gpu_evidence.main(["--device", "cpu", "--tiny", "--resume"])
    assert ended.value.code == gpu_evidence.USAGE_ERROR > len(HEADINGS)
    (line,) = capsys.readouterr().err.splitlines()
    assert "error: --resume with --tiny needs --out" in line
    with pytest.raises(SystemExit) as ended:
        gpu_evidence.main(["--steps", str(tmp_path / "missing.py")])
    assert ended.value.code == gpu_evidence.USAGE_ERROR


@pytest.mark.slow  # every step of the script as a process of its own
def test_the_tiny_run_writes_every_table_with_rows_and_keeps_the_rest_of_the_file(tmp_path):
    out = tmp_path / "gpu.md"
    out.write_text("# GPU measurements\n\nEarlier text.\n")
    # shares times 20: a busy machine must not empty a table; cutting is tested on its own above
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_evidence.py"), "--device", "cpu", "--tiny",
                    "--share-factor", "20", "--out", str(out)], check=True, capture_output=True, text=True,
                   timeout=900)
    text = out.read_text()
    assert text.startswith("# GPU measurements\n\nEarlier text.\n")
    found = sections(text)
    assert list(found) == HEADINGS
    for heading, body in found.items():
        assert table_rows(body), heading
        assert "Failed" not in body and "Cut after" not in body, (heading, body)
    assert "python benchmarks/gpu_evidence.py --device cpu --tiny" in text
    assert "| simulated on a CPU | 8 x 256 | 1 | 4 |" in found["A forced out-of-memory and the back-off"]
    assert "True" in found["A forced out-of-memory and the back-off"]
    assert "quick: seconds, extrapolated" in found["The diff-paper suite at its tiny scale; quick extrapolated"]
    assert "float32 matmul rate measured in this run" in found["Prefill at 8K, 32K and 64K tokens"]
    long_context = found[HEADING["long_context"]]
    for entry, length in (("needle", 250), ("nolima", 2000), ("ruler", 1024)):  # the tiny scale's cells, both models
        for model in ("Llama", "DiffLlama"):
            assert f"| {model} | {entry} | {length} | 1 of " in long_context, (entry, length, model)
    assert "| both | ruler-essays | all | none, skipped: give --data-dir DIR holding DIR/ruler/essays |" in long_context
    # a second run replaces its section, not appends another
    gpu_evidence.write(out, "replaced")
    assert out.read_text().count(gpu_evidence.START) == 1 and "replaced" in out.read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_out_of_memory_on_cuda_backs_off_and_answers_every_row(tmp_path):
    import gpu_evidence_steps as steps

    ctx = steps.context("cuda", True, tmp_path)
    steps.build_models(ctx, [])
    ctx.tiny = False  # 8K-token rows: enough memory per row to cut the free memory to
    rows: list[dict] = []
    steps.out_of_memory(ctx, rows)
    assert rows[0]["kind"].startswith("real") and rows[0]["halvings"] >= 1
    assert rows[0]["answers equal one row's"] is True
