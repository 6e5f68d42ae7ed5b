"""Attention allocation: the row-reading capability against brute force (eager attention's full
maps, the differential map built from them for DiffLlama and DIFF V2), on tiny random Llama,
DiffLlama (transformers' module and the one-pass one) and DIFF V2 models with grouped-query
attention; the needle prompt's regions; the CLI end to end; bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import invoke

from evalsuite.backends import load_model
from evalsuite.backends.hf import attention_share, diff_attention
from evalsuite.backends.hf.loading import HFOptions
from evalsuite.backends.hf.model import HFModel
from evalsuite.engine.runner import make_task
from evalsuite.errors import UserError
from evalsuite.tasks.needle.task import Needle

LENGTH = 150
QUERIES = [0, 31, 32, 95, 120, 149]  # the first row, rows either side of a prefill boundary, the last row
SPANS = [(0, 1), (1, 2), (5, 20), (10, 60), (33, 33), (99, 100), (100, 150), (0, 150)]  # overlapping, empty


def tiny_model(kind: str, implementation: str) -> torch.nn.Module:
    """Random weights; grouped-query attention (two query heads per key head), float32. `diff2`
    and `diff2-interleaved`: DIFF V2 with Llama's and GPT-J's rotary convention."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config, DiffLlamaV2ForCausalLM

    common = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    if kind in ("diff", "diff-one-pass"):  # component heads: 4 DIFF heads of two maps each, over 4 key heads
        config = DiffLlamaConfig(**common, num_attention_heads=8, num_key_value_heads=4, lambda_std_dev=0.5)
        model = DiffLlamaForCausalLM(config)
        diff_attention.install(model, "one_pass" if kind == "diff-one-pass" else "transformers")
    elif kind.startswith("diff2"):  # 4 DIFF heads: 8 query heads of width 16 over 4 key heads
        config = DiffLlamaV2Config(**common, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                   rope_interleaved=kind.endswith("interleaved"))
        model = DiffLlamaV2ForCausalLM(config)
        for layer in model.model.layers:  # λ spread over (0.2, 0.8), away from 1, where 1 / (1 - λ) magnifies
            torch.nn.init.normal_(layer.self_attn.lambda_proj.weight, std=0.1)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2))
    model.set_attn_implementation(implementation)
    return model.eval()


def adapter(model: torch.nn.Module, tokenizer) -> HFModel:
    source = {"label": "tiny", "spec": "tiny", "path": "tiny", "gguf_file": None}
    return HFModel(model, tokenizer, HFOptions(attn_implementation=model.config._attn_implementation), source, 1)


def brute_force(model: torch.nn.Module, ids: list[int], norm: str = "lambda") -> list[np.ndarray]:
    """Per layer, span sums from the full eager maps: (heads, queries, spans), float64."""
    own = model.config._attn_implementation
    model.set_attn_implementation("eager")
    inputs: dict[int, torch.Tensor] = {}  # each layer's attention input: DIFF V2's λ reads it
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda module, args, kwargs, i=i: inputs.__setitem__(i, kwargs["hidden_states"][0].double()), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)]
    with torch.inference_mode():
        maps = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    for hook in hooks:
        hook.remove()
    model.set_attn_implementation(own)
    member = torch.zeros(len(ids), len(SPANS), dtype=torch.float64)
    for column, (start, end) in enumerate(SPANS):
        member[start:end, column] = 1.0
    out = []
    for layer, weights in enumerate(maps):
        weights = weights[0].double()
        attention = model.model.layers[layer].self_attn
        if hasattr(attention, "lambda_init"):  # DiffLlama: head i = map i - λ·map i + H/2
            with torch.no_grad():
                lam = (torch.exp((attention.lambda_q1 * attention.lambda_k1).sum())
                       - torch.exp((attention.lambda_q2 * attention.lambda_k2).sum())).item() + attention.lambda_init
            half = weights.shape[0] // 2
            divisor = {"lambda_init": 1 - attention.lambda_init, "lambda": 1 - lam, "none": 1.0}[norm]
            weights = (weights[:half] - lam * weights[half:]) / divisor
        elif hasattr(attention, "lambda_proj"):  # DIFF V2: head i = map 2i - λ_t,i·map 2i+1, λ per row t
            lam = torch.sigmoid(inputs[layer] @ attention.lambda_proj.weight.detach().double().T).T[:, :, None]
            weights = (weights[0::2] - lam * weights[1::2]) / ((1 - lam) if norm == "lambda" else 1.0)
        out.append((weights[:, QUERIES, :] @ member).numpy())
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    """Prefill slices and key chunks small enough that rows and spans cross several of them."""
    monkeypatch.setattr(attention_share, "PREFILL_ROWS", 32)
    monkeypatch.setattr(attention_share, "KEY_CHUNK_BYTES", 4 * 8 * len(QUERIES) * 17)  # 17 or 34 keys a chunk


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["base", "diff", "diff-one-pass", "diff2", "diff2-interleaved"])
def test_rows_match_brute_force(kind, implementation, toy_tokenizer, small_chunks):
    model = tiny_model(kind, implementation)
    ids = torch.randint(3, 1000, (LENGTH,), generator=torch.Generator().manual_seed(1)).tolist()
    found = adapter(model, toy_tokenizer).attention_mass(ids, QUERIES, SPANS)
    expected = brute_force(model, ids)
    assert found.layers == (0, 1, 2)
    assert found.attention_map == ("differential" if kind.startswith("diff") else "softmax")
    assert found.mass.shape == (3, 4, len(QUERIES), len(SPANS))  # 4 heads: DIFF heads for DiffLlama
    for layer in range(3):
        np.testing.assert_allclose(found.mass[layer], expected[layer], atol=1e-5, rtol=0)
    assert np.abs(found.mass).max() > 0.01  # not all zeros
    assert model.config._attn_implementation == implementation  # restored


@pytest.mark.parametrize("norm", ["lambda", "lambda_init", "none"])
def test_differential_normalisations_and_lambdas(norm, toy_tokenizer, small_chunks):
    model = tiny_model("diff", "sdpa")
    ids = torch.randint(3, 1000, (LENGTH,), generator=torch.Generator().manual_seed(2)).tolist()
    found = adapter(model, toy_tokenizer).attention_mass(ids, QUERIES, SPANS, differential_norm=norm)
    expected = brute_force(model, ids, norm)
    for layer in range(3):
        np.testing.assert_allclose(found.mass[layer], expected[layer], atol=1e-5, rtol=0)
    whole = found.mass[..., SPANS.index((0, 150))]
    if norm == "lambda":  # rows of (w1 - λ·w2) / (1 - λ) sum to one: the whole-prompt span says so
        np.testing.assert_allclose(whole, 1.0, atol=1e-5)
    else:  # the other normalisations leave (1 - λ) / divisor, which differs from one layer to the next
        assert np.abs(whole - 1.0).max() > 0.01
    assert found.normalisation == {"lambda": "1 - lambda", "lambda_init": "1 - lambda_init", "none": "1"}[norm]
    assert len(found.lambdas) == 3 and len(set(found.lambdas)) == 3


@pytest.mark.parametrize("norm", ["lambda", "none"])
def test_diff_v2_rows_and_their_lambdas(norm, toy_tokenizer, small_chunks):
    model = tiny_model("diff2", "sdpa")
    ids = torch.randint(3, 1000, (LENGTH,), generator=torch.Generator().manual_seed(2)).tolist()
    found = adapter(model, toy_tokenizer).attention_mass(ids, QUERIES, SPANS, differential_norm=norm)
    expected = brute_force(model, ids, norm)
    for layer in range(3):
        np.testing.assert_allclose(found.mass[layer], expected[layer], atol=1e-5, rtol=0)
    whole = found.mass[..., SPANS.index((0, 150))]
    if norm == "lambda":  # each row divided by its own 1 - λ_t,i sums to one
        np.testing.assert_allclose(whole, 1.0, atol=1e-5)
    else:  # rows sum to 1 - λ_t,i, which differs by row and head
        assert whole.std() > 0.01 and (whole > 0).all() and (whole < 1).all()
    assert len(found.lambdas) == 3 and all(0 < lam < 1 for lam in found.lambdas)  # mean λ of the rows read


def test_diff_v2_has_no_lambda_init(toy_tokenizer):
    model = tiny_model("diff2", "sdpa")
    with pytest.raises(UserError, match="DIFF V2 model, which has no λ_init"):
        adapter(model, toy_tokenizer).attention_mass(list(range(3, 40)), [5], [(0, 5)], differential_norm="lambda_init")


def test_a_layer_with_lambda_one_has_no_share():
    masses = torch.rand(4, 2, 3)
    with pytest.raises(UserError, match="1 - λ = 0: its rows sum to about 0"):
        attention_share.differential_heads(masses, 1.0, 0.2, "lambda")
    torch.testing.assert_close(attention_share.differential_heads(masses, 1.0, 0.2, "none"), masses[:2] - masses[2:])


def test_selected_layers_stop_early_and_leave_the_model_as_it_was(toy_tokenizer, small_chunks):
    model = tiny_model("diff", "sdpa")
    ids = torch.randint(3, 1000, (LENGTH,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        before = model(input_ids=torch.tensor([ids])).logits
    hf = adapter(model, toy_tokenizer)
    whole = hf.attention_mass(ids, QUERIES, SPANS)
    first = hf.attention_mass(ids, QUERIES, SPANS, layers=[0])  # stops every pass after layer 0
    last = hf.attention_mass(ids, QUERIES, SPANS, layers=[-1])
    assert first.layers == (0,) and last.layers == (2,)
    np.testing.assert_allclose(first.mass[0], whole.mass[0], atol=1e-6)
    np.testing.assert_allclose(last.mass[0], whole.mass[2], atol=1e-6)
    with torch.inference_mode():
        after = model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_span_masses_is_the_softmax_summed_over_spans():
    generator = torch.Generator().manual_seed(4)
    rows, keys = torch.randn(6, 3, 16, generator=generator), torch.randn(2, 40, 16, generator=generator) * 3
    positions = torch.tensor([0, 17, 39])
    spans = [(0, 1), (3, 30), (17, 18), (0, 40)]
    got = attention_share.span_masses(rows, keys, positions, spans, 0.25, chunk_bytes=7 * 4 * 6 * 3)
    scores = torch.einsum("hrd,hkd->hrk", rows, keys.repeat_interleave(3, dim=0)) * 0.25
    scores = scores.masked_fill(torch.arange(40)[None, None] > positions[None, :, None], -torch.inf)
    weights = scores.softmax(-1)
    want = torch.stack([weights[..., s:e].sum(-1) for s, e in spans], dim=-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


# ---- the task on the built-in toy models -------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_base():
    return load_model("toy-base", {}, device="cpu", batch_size=1)


def probe_for(model, **params: str):
    task = make_task("attention", {"lengths": "256", "depths": "0.5", "samples": "1", **params})
    state = task.prepare(model)
    sample = next(iter(task.plan(state)))
    (probe,), info = task.requests(sample, model, state)
    return task, sample, probe, info


def test_prompt_is_the_needle_prompt_and_regions_cover_it(toy_base):
    task, sample, probe, info = probe_for(toy_base, needles="3", queries="2")
    needle = Needle(lengths=(256,), depths=(0.5,), samples=1, needles=(3,), queries=(2,))
    state = needle.prepare(toy_base)
    assert [s.id for s in needle.plan(state)] == [sample.id]
    cities, numbers = sample.data["cities"], sample.data["numbers"]
    # the needle prompt, then the first query's true answer (teacher forcing: the default rows)
    assert probe.prompt == needle.requests(sample, toy_base, state)[0][0].prompt + f" {numbers[0]}"
    decode = lambda span: toy_base.tokenizer.decode(list(probe.ids[span[0]:span[1]])).strip()  # noqa: E731
    named = list(zip(probe.regions, probe.spans))
    assert named[0] == ("bos", (0, 1))
    assert decode(named[1][1]) == f"The magic number of {cities[0]} is {numbers[0]}."
    assert [decode(span) for region, span in named if region == "distractor"] == \
        [f"The magic number of {c} is {x}." for c, x in zip(cities[1:], numbers[1:])]
    assert decode(named[-1][1]).startswith("Question:") and named[-1][1][1] == len(probe.ids)
    covered = sorted(span for region, span in named if region in ("bos", "answer", "noise", "query"))
    assert [start for start, _ in covered] == [0, *[end for _, end in covered[:-1]]]  # a partition of the prompt
    assert info["query_rows"] == list(probe.queries) and info["measured_tokens"] == len(probe.ids)


def test_default_rows_are_the_rows_that_emit_the_answer(toy_base):
    """Row i's logits predict token i + 1: the rows are the prompt's last token and every answer
    token but the last, one row per answer token, and the model itself emits the answer there."""
    task, sample, probe, _ = probe_for(toy_base)
    assert (task.query_positions, task.diff_norm) == ("answer", "lambda")
    number = sample.data["numbers"][0]
    prompt_ids, _ = toy_base.encode_with_offsets(probe.prompt.removesuffix(f" {number}"))
    answer = list(probe.ids[len(prompt_ids):])
    assert list(probe.ids[:len(prompt_ids)]) == prompt_ids  # appending the answer leaves the prompt's tokens
    assert toy_base.tokenizer.decode(answer).strip() == number and len(answer) == len(number) + 1  # " " + digits
    assert list(probe.queries) == list(range(len(prompt_ids) - 1, len(probe.ids) - 1))
    assert [probe.ids[q + 1] for q in probe.queries] == answer
    with torch.inference_mode():  # the toy model retrieves at 256 tokens: its prediction on each row is the answer
        logits = toy_base.model(input_ids=torch.tensor([list(probe.ids)])).logits[0]
    assert logits[list(probe.queries)].argmax(-1).tolist() == answer


def test_answer_rows_refuse_a_token_across_the_prompt_and_the_answer():
    task = make_task("attention", {"lengths": "256"})
    prompt, text = "ab is", "ab is 12"
    assert task._queries(None, prompt, text, [(0, 2), (3, 5), (5, 6), (6, 7), (7, 8)]) == [1, 2, 3]
    with pytest.raises(UserError, match="merges the prompt's end with the answer"):
        task._queries(None, prompt, text, [(0, 2), (3, 6), (6, 8)])  # "is " is one token


@pytest.mark.parametrize(("mode", "rows"), [("last", "is"), ("3", "of {city} is"), ("answer", "is {number}"),
                                            ("answer_prefix", "The magic number of {city} is")])
def test_query_position_modes(toy_base, mode, rows):
    _, sample, probe, _ = probe_for(toy_base, query_positions=mode)
    city, number = sample.data["cities"][0], sample.data["numbers"][0]
    decoded = toy_base.tokenizer.decode([probe.ids[q] for q in probe.queries]).strip()
    expected = rows.format(city=city, number=number)
    if mode == "answer":  # every row that emits an answer token: all but the last digit
        assert probe.prompt.endswith(f" is {number}") and decoded == expected[:-1]
    else:
        assert decoded == expected and probe.queries[-1] == len(probe.ids) - 1


def test_generated_rows_are_those_of_the_models_own_answer(toy_base):
    """The authors' reading: the model answers the needle prompt greedily and the rows that produced
    its tokens are read; the answer is kept in the output."""
    task, sample, probe, info = probe_for(toy_base, query_positions="generated", needles="2", queries="1")
    needle_prompt = probe.prompt
    assert probe.queries == () and "query_rows" not in info and probe.generation.prompt == needle_prompt
    output = probe.measure(toy_base)
    answer, rows = output["generated"], output["query_rows"]
    assert answer == toy_base.generate([probe.generation])[0] and answer.startswith(f" {sample.data['numbers'][0]}")
    ids, _ = toy_base.encode_with_offsets(needle_prompt + answer)
    assert rows == list(range(len(probe.ids) - 1, len(ids) - 1))  # the prompt's last row, then each answer token's
    assert toy_base.tokenizer.decode([ids[q + 1] for q in rows]) == answer
    assert task.score(sample, [output])["answer_share"] > 0


def test_a_generated_answer_equal_to_the_true_one_reads_the_teacher_forced_rows(toy_base):
    """Cut to the true answer's tokens, the model's answer is the forced one, and so are the shares."""
    _, sample, forced, _ = probe_for(toy_base, query_positions="answer")
    _, _, probe, _ = probe_for(toy_base, query_positions="generated")
    number = sample.data["numbers"][0]
    cut = replace(probe, generation=replace(probe.generation, max_new_tokens=len(number) + 1))  # " " + digits
    output, expected = cut.measure(toy_base), forced.measure(toy_base)
    assert output["generated"] == f" {number}" and output["query_rows"] == list(forced.queries)
    assert output["per_layer"] == expected["per_layer"]


def test_softmax_regions_sum_to_one_and_distractors_are_noise(toy_base):
    task, sample, probe, _ = probe_for(toy_base, needles="3", queries="1", layers="0,-1")
    output = probe.measure(toy_base)
    assert output["layers"] == [0, 3] and output["map"] == "softmax"
    per_layer = output["per_layer"]
    for index in range(2):
        total = sum(per_layer[region][index] for region in ("bos", "answer", "noise", "query"))
        assert total == pytest.approx(1.0, abs=1e-5)
        assert 0 < per_layer["distractor"][index] < per_layer["noise"][index]
    scores = task.score(sample, [output])
    assert scores["answer_share"] == pytest.approx(np.mean(per_layer["answer"]))


# ---- the command line ----------------------------------------------------------------------------------


def test_cli_two_models_write_records_tables_heatmaps_and_their_difference(tmp_path, capsys):
    code, out, err = invoke(capsys, "run", "--model", "toy-diff", "--model", "toy-base", "--task", "attention",
                            "-T", "lengths=512,1024", "-T", "depths=0,0.5,1", "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    runs = {name: next(tmp_path.glob(f"attention-{name}-*")) for name in ("toy-diff", "toy-base")}
    for name, run in runs.items():
        records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert len(records) == 2 * 3 * 4 and not any(r["error"] for r in records)
        output = records[0]["outputs"][0]
        assert output["layers"] == [0, 1, 2, 3] and len(output["per_layer"]["answer"]) == 4
        assert output["map"] == ("differential" if name == "toy-diff" else "softmax")
        summary = json.loads((run / "summary.json").read_text())
        assert [row["depth"] for row in summary["by_depth"]] == [0.0, 0.5, 1.0]
        assert all(row["n"] == 8 and row["answer_share_low"] < row["answer_share"] < row["answer_share_high"]
                   for row in summary["by_depth"])
        assert [row["layer"] for row in summary["by_layer"]] == [0, 1, 2, 3]
        for plot in ("heatmap_answer_share.png", "heatmap_noise_share.png"):
            assert (run / "plots" / plot).stat().st_size > 1000, plot
        assert "| depth | answer share (95% CI) | noise share (95% CI) | n |" in (run / "plots" / "attention_tables.md"
                                                                           ).read_text()
    for run in runs.values():  # a softmax row, and a differential row over its 1 - λ, is spent on these four regions
        for line in (run / "samples.jsonl").read_text().splitlines():
            scores = json.loads(line)["scores"]
            total = scores["answer_share"] + scores["noise_share"] + scores["bos_share"] + scores["query_share"]
            assert total == pytest.approx(1.0, abs=1e-5)
    diff_depths = json.loads((runs["toy-diff"] / "summary.json").read_text())["by_depth"]
    assert all(row["answer_share_low"] > row["noise_share_high"] for row in diff_depths)  # DIFF: answer above noise
    folder = Path(out.split("comparison: ")[1].split()[0])
    for name in ("heatmap_pair_answer_share.png", "heatmap_diff_answer_share.png", "heatmap_pair_noise_share.png",
                 "heatmap_diff_noise_share.png", "difference_answer_share.png", "attention_by_depth_pair.md",
                 "cells.csv"):
        assert (folder / name).stat().st_size > 500, name
    pair = (folder / "attention_by_depth_pair.md").read_text()
    assert "| depth | share | toy-diff | toy-base | difference [95% CI] | p | n |" in pair
    assert pair.count("| answer |") == 3 and pair.count("| noise |") == 3
    overall = {row["metric"]: row for row in json.loads((folder / "comparison.json").read_text())["overall"]}
    assert overall["answer_share"]["n"] == 24 and not math.isnan(overall["noise_share"]["diff"])


def test_a_generated_rows_run_keeps_each_answer_and_the_paper_report_says_whose_rows(tmp_path, capsys):
    from evalsuite.paper.retrieval import _answer_rows
    from evalsuite.runs.records import RunFolder

    code, _, err = invoke(capsys, "run", "--model", "toy-diff", "--model", "toy-base", "--task", "attention",
                          "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=1", "-T", "query_positions=generated",
                          "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    found = [(name, RunFolder(next(tmp_path.glob(f"attention-{name}-*")))) for name in ("toy-diff", "toy-base")]
    for _, run in found:
        records = run.read_records()
        assert len(records) == 2 and all(r.outputs[0]["generated"] and r.outputs[0]["query_rows"] for r in records)
    assert "generated (-T query_positions=generated), as the paper reads them" in _answer_rows(found)
    code, _, err = invoke(capsys, "run", "--model", "toy-base", "--task", "attention", "-T", "lengths=256",
                          "-T", "depths=0", "-T", "samples=1", "--out", str(tmp_path / "forced"), "--no-progress")
    assert code == 0, err
    forced = [("toy-base", RunFolder(next((tmp_path / "forced").glob("attention-toy-base-*"))))]
    assert "teacher-forced" in _answer_rows(forced) and "query_positions=answer, generated" in _answer_rows(
        forced + found[1:])


@pytest.mark.parametrize(("option", "message"), [
    ("query_positions=middle", "-T query_positions must be one of answer, generated, answer_prefix, last, question"),
    ("diff_norm=lambda2", "-T diff_norm must be one of lambda, lambda_init, none"),
    ("layers=4", "-T layers=4: toy-base has layers 0..3"),
    ("layers=1,1", "-T layers lists a layer twice"),
])
def test_bad_parameters_are_one_line_errors(tmp_path, capsys, option, message):
    code, out, err = invoke(capsys, "run", "--model", "toy-base", "--task", "attention", "-T", "lengths=256",
                            "-T", option, "--out", str(tmp_path), "--no-progress")
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_backend_without_the_capability_is_refused(tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "fake", "--task", "attention", "--out", str(tmp_path))
    assert code == 2 and "needs attention_allocation" in err and len(err.strip().splitlines()) == 1
