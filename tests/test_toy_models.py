"""The shipped toy pair retrieves; a random model of the same shape does not.

Both go through the real command line and the real hf backend, on the same
needle samples, so a miswired harness (wrong prompt, wrong tokens, wrong
scoring) fails here rather than reporting plausible numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.models import HERE as MODELS_DIR

# two samples per (length, depth) cell: 20 prompts per model, seconds on a CPU
NEEDLE_ARGS = ("--task", "needle", "-T", "lengths=512,1024", "-T", "samples=2", "--device", "cpu", "--no-progress")


def _needle_run(capsys, model: str, out: Path) -> dict:
    code, _, err = invoke(capsys, "run", "--model", model, *NEEDLE_ARGS, "--out", str(out))
    assert code == 0, err[-2000:]
    [summary_path] = out.glob("*/summary.json")
    return json.loads(summary_path.read_text())


def _accuracy_by_length(summary: dict) -> dict[int, float]:
    by_length: dict[int, list[float]] = {}
    for cell in summary["cells"]:
        by_length.setdefault(cell["context_length"], []).append(cell["correct_all"] * cell["n"])
    counts = {length: sum(c["n"] for c in summary["cells"] if c["context_length"] == length) for length in by_length}
    return {length: sum(hits) / counts[length] for length, hits in by_length.items()}


@pytest.mark.parametrize("name, architecture", [("toy-diff", "DiffLlamaForCausalLM"), ("toy-base", "LlamaForCausalLM"),
                                                ("toy-diff2", "DiffLlamaV2ForCausalLM")])
def test_toy_model_retrieves_at_512_and_1024(name, architecture, tmp_path, capsys):
    summary = _needle_run(capsys, name, tmp_path)
    config = json.loads(next(tmp_path.glob("*/config.json")).read_text())
    assert config["model"]["architecture"] == architecture
    assert config["model"]["backend"] == "hf"
    assert summary["n"] == 2 * 5 * 2  # lengths x depths x samples
    accuracy = _accuracy_by_length(summary)
    assert set(accuracy) == {512, 1024}
    assert all(rate >= 0.9 for rate in accuracy.values()), accuracy
    assert {cell["depth"] for cell in summary["cells"]} == {0.0, 0.25, 0.5, 0.75, 1.0}


@pytest.mark.parametrize("kind", ["diff", "base", "diff2"])
def test_random_model_of_the_same_shape_fails(kind, tmp_path, capsys):
    """The control: same shape, same tokenizer, same samples, untrained weights."""
    from transformers import AutoConfig, AutoTokenizer

    from evalsuite.models.toy import random_model

    shipped = MODELS_DIR / f"toy-{kind}"
    tokenizer = AutoTokenizer.from_pretrained(shipped)
    model = random_model(kind, len(tokenizer), seed=123)
    shipped_config = AutoConfig.from_pretrained(shipped)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert getattr(model.config, key) == getattr(shipped_config, key), key
    folder = tmp_path / f"random-{kind}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    summary = _needle_run(capsys, str(folder), tmp_path / "runs")
    assert summary["n"] == 20
    assert summary["overall"]["correct_all"] <= 0.1


def test_shipped_pair_is_matched_and_small():
    from transformers import AutoConfig

    configs = {kind: AutoConfig.from_pretrained(MODELS_DIR / f"toy-{kind}") for kind in ("diff", "base")}
    assert configs["diff"].model_type == "diffllama" and configs["base"].model_type == "llama"
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert getattr(configs["diff"], key) == getattr(configs["base"], key), key
    size = sum(f.stat().st_size for kind in ("diff", "base") for f in (MODELS_DIR / f"toy-{kind}").iterdir())
    assert size <= 10 * 1024 * 1024
    records = {kind: json.loads((MODELS_DIR / f"toy-{kind}" / "training.json").read_text()) for kind in configs}
    assert records["diff"]["config"] == records["base"]["config"]  # identical data, steps and schedule
    assert records["diff"]["config"]["seq_len"] >= 1024
    diff_params, base_params = records["diff"]["parameters"], records["base"]["parameters"]
    assert abs(diff_params - base_params) / base_params < 0.01


def test_training_data_follows_the_needle_prompt_format(toy_tokenizer):
    """Every packed episode is a needle-task prompt whose answers are its own needles."""
    from evalsuite.models.train_toy import TrainConfig, training_sequence
    from evalsuite.tasks.needle.task import INSTRUCTION

    cfg = TrainConfig()
    for step in (0, cfg.steps - 1):  # the start and the end of the curriculum
        ids, weights, positions, digits = training_sequence(cfg, toy_tokenizer, step, row=0)
        assert len(ids) == len(weights) == len(positions) == len(digits) == cfg.seq_len
        starts = [i for i, p in enumerate(positions) if p == 0]
        assert all(ids[i] == toy_tokenizer.bos_token_id for i in starts)
        complete = [toy_tokenizer.decode(ids[a:b], skip_special_tokens=True) for a, b in zip(starts, starts[1:])]
        assert complete, "at least one whole episode per sequence"
        for text in complete:
            assert text.startswith(INSTRUCTION + "\n\n")
            facts = dict(re.findall(r"The magic number of (\w+) is (\d{7})\.", text.split("\n\nQuestion:")[0]))
            answers = re.findall(r"The magic number of (\w+) is (\d{7})\.", text.split("\n\nQuestion:")[1])
            assert answers and all(facts[city] == number for city, number in answers)
            assert len(answers) == len(facts)  # dense supervision: every needle is asked about
        assert sum(digits) >= 7 * len(complete)
        assert all(w == 1.0 for w, d in zip(weights, digits) if d)


@pytest.mark.slow
def test_training_is_reproducible(toy_tokenizer):
    """The same seed gives bit-identical weights; another seed does not (a few steps)."""
    import dataclasses

    import torch

    from evalsuite.models.toy import ToySize
    from evalsuite.models.train_toy import TrainConfig, train

    cfg = TrainConfig(steps=3, batch=2, warmup=1, threads=1,
                      size=ToySize(hidden=64, layers=2, heads=4, intermediate=128))
    first, _ = train("diff", cfg, toy_tokenizer, log_every=100)
    second, _ = train("diff", cfg, toy_tokenizer, log_every=100)
    other, _ = train("diff", dataclasses.replace(cfg, seed=1), toy_tokenizer, log_every=100)
    a, b, c = first.state_dict(), second.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("kind", ["diff", "base"])
def test_packed_episodes_do_not_attend_to_each_other(kind, toy_tokenizer):
    """Training packs episodes with restarting position ids; an episode's logits must be
    the same as when it is alone, or the model would learn from text it never sees at evaluation."""
    import torch

    from evalsuite.models.toy import ToySize, random_model

    model = random_model(kind, len(toy_tokenizer), ToySize(hidden=64, layers=2, heads=4, intermediate=128), seed=3)
    model.config._attn_implementation = "sdpa"  # as in training
    first = toy_tokenizer("The magic number of Paris is 1234567. Some filler text.")["input_ids"]
    second = toy_tokenizer("Question: what is the magic number of Paris?")["input_ids"]
    ids = torch.tensor([first + second])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, len(first):]
        alone = model(input_ids=torch.tensor([second]), use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)


def test_toy_diff2_is_matched_to_the_baseline_as_the_v2_authors_match():
    """The baseline's heads as output heads (2h query heads of its width), its KV heads, so
    both heads of a pair fall in one GQA group, and its o_proj (h*d inputs)."""
    from transformers import AutoConfig

    import evalsuite  # noqa: F401  (AutoConfig knows diffllama_v2 after the package import)

    v2, base = (AutoConfig.from_pretrained(MODELS_DIR / name) for name in ("toy-diff2", "toy-base"))
    assert v2.model_type == "diffllama_v2" and not v2.rope_interleaved
    assert (v2.num_attention_heads, v2.head_dim) == (base.num_attention_heads, base.head_dim)
    assert v2.num_key_value_heads == base.num_key_value_heads
    group = 2 * v2.num_attention_heads // v2.num_key_value_heads  # query heads per KV head
    assert group % 2 == 0, "a GQA group must hold whole pairs, so a pair shares key and value"
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"):
        assert getattr(v2, key) == getattr(base, key), key
    training = [json.loads((MODELS_DIR / name / "training.json").read_text()) for name in ("toy-diff2", "toy-base")]
    assert training[0]["config"] == training[1]["config"] | {"threads": training[0]["config"]["threads"]}
