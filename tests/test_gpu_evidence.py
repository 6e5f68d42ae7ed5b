"""benchmarks/gpu_evidence.py: its --device cpu --tiny mode writes every table the GPU run writes,
each with rows, so the script cannot rot before a GPU comes; a step over its share is cut with a
line and the next one runs; on a GPU, the forced out-of-memory is a real one and recovers."""

from __future__ import annotations

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


def sections(text: str) -> dict[str, str]:
    """### heading -> the text under it, within the script's markers."""
    inside = text[text.index(gpu_evidence.START): text.index(gpu_evidence.END)]
    parts = re.split(r"^### (.+)$", inside, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def table_rows(body: str) -> list[str]:
    lines = [line for line in body.splitlines() if line.startswith("|")]
    return lines[2:]  # past the header and the rule


@pytest.mark.slow  # every step of the script as a process of its own
def test_the_tiny_run_writes_every_table_with_rows_and_keeps_the_rest_of_the_file(tmp_path):
    out = tmp_path / "gpu.md"
    out.write_text("# GPU measurements\n\nEarlier text.\n")
    # shares times 20: a busy machine must not empty a table; cutting is tested on its own below
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_evidence.py"), "--device", "cpu", "--tiny",
                    "--share-factor", "20", "--out", str(out)], check=True, capture_output=True, text=True,
                   timeout=900)
    text = out.read_text()
    assert text.startswith("# GPU measurements\n\nEarlier text.\n")
    found = sections(text)
    assert list(found) == [gpu_evidence.BUILD, *(heading for heading, *_ in gpu_evidence.SHARES)]
    for heading, body in found.items():
        assert table_rows(body), heading
        assert "Failed" not in body and "Cut after" not in body, (heading, body)
    assert "python benchmarks/gpu_evidence.py --device cpu --tiny" in text
    assert "| simulated on a CPU | 8 x 256 | 1 | 4 |" in found["A forced out-of-memory and the back-off"]
    assert "True" in found["A forced out-of-memory and the back-off"]
    assert "quick: seconds, extrapolated" in found["The diff-paper suite at its tiny scale; quick extrapolated"]
    # a second run replaces its section, not appends another
    gpu_evidence.write(out, "replaced")
    assert out.read_text().count(gpu_evidence.START) == 1 and "replaced" in out.read_text()


def test_a_step_over_its_share_is_cut_with_a_line_and_keeps_its_rows():
    def slow(ctx, rows):
        rows.append({"done": 1})
        time.sleep(5)
        rows.append({"done": 2})

    rows, line = gpu_evidence.run_step(None, slow, 0.3)
    assert rows == [{"done": 1}] and line.startswith("**Cut after")

    def broken(ctx, rows):
        raise ValueError("no such model")

    assert "Failed after" in gpu_evidence.run_step(None, broken, 5)[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_out_of_memory_on_cuda_backs_off_and_answers_every_row(tmp_path):
    import gpu_evidence_steps as steps

    ctx = steps.Context(device="cuda", tiny=True, work=tmp_path)
    steps.build_models(ctx, [])
    ctx.tiny = False  # 8K-token rows: enough memory per row to cut the free memory to
    rows: list[dict] = []
    steps.out_of_memory(ctx, rows)
    assert rows[0]["kind"].startswith("real") and rows[0]["halvings"] >= 1
    assert rows[0]["answers equal one row's"] is True
