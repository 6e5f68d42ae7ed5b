"""DiffLlama with one attention call per layer against transformers' DiffLlama (two calls), on a
random small grouped-query DiffLlama: logits, padding, cached decoding, the calls per layer, the
hf backend's option; and `nll` on DIFF V2 and on the one-pass DiffLlama against a naive pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY

from evalsuite.backends.hf import HFModel, diff_attention
from evalsuite.errors import UserError
from evalsuite.modeling import wide_attention


def random_diffllama(implementation: str) -> torch.nn.Module:
    """Random float32 DiffLlama, 8 component heads over 4 key heads (two query heads per key head)."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    torch.manual_seed(0)
    config = DiffLlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                             lambda_std_dev=0.5, pad_token_id=0)
    model = DiffLlamaForCausalLM(config).eval()
    model.set_attn_implementation(implementation)
    return model


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding in the second row
    return ids, mask


def logits(model: torch.nn.Module, mode: str) -> torch.Tensor:
    diff_attention.install(model, mode)
    ids, mask = inputs()
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask).logits


def assert_same_rows(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1, 7:], want[1, 7:], rtol=0, atol=1e-5)  # past the padding


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_one_pass_logits_equal_transformers_diffllama(implementation):
    model = random_diffllama(implementation)
    want = logits(model, "transformers")
    got = logits(model, "one_pass")
    assert diff_attention.mode_of(model) == "one_pass"
    assert_same_rows(got, want)
    assert logits(model, "transformers").equal(want)  # and back


@pytest.mark.parametrize("implementation, rows", [("sdpa", "both"), ("sdpa", "first"), ("sdpa", "second"),
                                                 ("eager", "both")])
def test_the_in_place_path_gives_the_plain_operations_bits(implementation, rows):
    """Without autograd SDPA's zero-widened query and key are written in place, a single row runs
    its two halves as two rows of one call, and the DIFF combination runs in place; with autograd
    the module runs plain operations (`apply_rotary_pos_emb`, `F.pad`, `wide_value`): the logits
    are the same bits, and equal transformers' DiffLlama."""
    model = random_diffllama(implementation)
    ids, mask = inputs()
    picked = {"both": slice(None), "first": slice(0, 1), "second": slice(1, 2)}[rows]
    batch = {"input_ids": ids[picked], "attention_mask": mask[picked] if rows == "second" else None}
    diff_attention.install(model, "transformers")
    with torch.no_grad():
        want = model(**batch).logits
    diff_attention.install(model, "one_pass")
    with torch.no_grad():
        in_place = model(**batch).logits
    plain = model(**batch).logits.detach()
    assert torch.equal(in_place, plain)
    columns = slice(7, None) if rows == "second" else slice(None)  # past the padding
    torch.testing.assert_close(in_place[:, columns], want[:, columns], rtol=0, atol=1e-5)


def test_a_single_row_under_sdpa_attends_as_two_rows_reading_one_value(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, *args, **kwargs):
        calls.append((query.shape, value.shape, value.stride(0)))
        return sdpa(query, key, value, *args, **kwargs)

    model = random_diffllama("sdpa")
    diff_attention.install(model, "one_pass")
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        model(input_ids=inputs()[0][:1])
    assert calls == [((2, 4, 40, 16), (2, 2, 40, 16), 0)] * 3  # 8 heads of 8 widened to 16, 4 key heads; 3 layers


def test_rotary_written_into_a_zero_widened_buffer_is_transformers_then_pad():
    from transformers.models.diffllama.modeling_diffllama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, 8, 4, 16, generator=generator).transpose(1, 2)  # (B, H, T, d) over (B, T, H, d)
    cos, sin = (torch.randn(2, 8, 16, generator=generator) for _ in range(2))  # (B, T, d)
    wide = diff_attention.zero_widened(states)
    diff_attention.rotary(states, cos, sin, out=wide[..., :16])
    want = torch.nn.functional.pad(apply_rotary_pos_emb(states, states, cos, sin)[0], (0, 16))
    assert wide.is_contiguous() and torch.equal(wide, want)


def test_halves_as_rows_share_one_value_without_copying_it():
    query, key = torch.rand(1, 8, 6, 4), torch.rand(1, 4, 6, 4)  # two query heads per key head
    value = diff_attention.paired_value(torch.rand(1, 4, 6, 2))
    rows = diff_attention.halves_as_rows(query, key, value)
    assert [t.shape for t in rows] == [(2, 4, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4)]
    assert torch.equal(rows[0][1], query[0, 4:]) and torch.equal(rows[1][1], key[0, 2:])
    assert rows[2].stride(0) == 0 and rows[2].data_ptr() == value.data_ptr()
    one_row = torch.nn.functional.scaled_dot_product_attention(query, key, value.repeat(1, 2, 1, 1), enable_gqa=True)
    two_rows = torch.nn.functional.scaled_dot_product_attention(*rows, enable_gqa=True)
    torch.testing.assert_close(two_rows.flatten(0, 1), one_row[0], rtol=0, atol=1e-6)


def test_the_wide_value_through_torch_sdpa_equals_transformers(monkeypatch):
    """Where SDPA runs the wide value as it is (its math kernel on a CPU, which is why a CPU
    widens query and key instead)."""
    model = random_diffllama("sdpa")
    want = logits(model, "transformers")
    monkeypatch.setattr(wide_attention, "EQUAL_WIDTH_KERNELS", ())  # what scores_once reads
    monkeypatch.setattr(diff_attention, "pads_query", lambda implementation, device: False)
    assert_same_rows(logits(model, "one_pass"), want)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("row", [0, 1])  # row 1 is left-padded: a mask at every decode step
def test_cached_greedy_decoding_is_unchanged(implementation, row):
    model = random_diffllama(implementation)
    ids, mask = inputs()
    outputs = {}
    for mode in ("transformers", "one_pass"):
        diff_attention.install(model, mode)
        with torch.inference_mode():
            outputs[mode] = model.generate(ids[row:row + 1], attention_mask=mask[row:row + 1], max_new_tokens=8,
                                           do_sample=False, pad_token_id=0)
    assert outputs["one_pass"].equal(outputs["transformers"])


def counting(delegate: str, calls: list[int]):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.diffllama.modeling_diffllama import eager_attention_forward

    def attend(module, *args, **kwargs):
        calls.append(module.layer_idx)
        own = eager_attention_forward if delegate == "eager" else ALL_ATTENTION_FUNCTIONS[delegate]
        return own(module, *args, **kwargs)

    return attend


@pytest.mark.parametrize("delegate, per_layer", [("eager", 1), ("sdpa", 1)])
def test_one_attention_call_per_layer_on_the_cpu(delegate, per_layer):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    model = random_diffllama("eager")
    name = f"test_counting_{delegate}"
    calls: list[int] = []
    AttentionInterface.register(name, counting(delegate, calls))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[delegate])
    diff_attention.register_wrapper(name, delegate)
    model.set_attn_implementation(name)
    for mode, expected in (("transformers", 2), ("one_pass", per_layer)):
        calls.clear()
        logits(model, mode)
        assert calls == [layer for layer in range(3) for _ in range(expected)], mode


def test_sdpa_widens_query_and_key_on_a_cpu_and_cuda_and_fused_kernels_keep_two_calls():
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert diff_attention.pads_query("sdpa", cpu) and not diff_attention.scores_once("sdpa")
    assert diff_attention.pads_query("sdpa", cuda)
    assert not diff_attention.pads_query("sdpa", mps)  # kernels not known there: two calls
    assert not diff_attention.pads_query("eager", cpu) and diff_attention.scores_once("eager")
    for fused in ("flash_attention_2", "flex_attention"):
        for device in (cpu, cuda):
            assert not diff_attention.pads_query(fused, device) and not diff_attention.scores_once(fused)


def test_the_cuda_paths_arithmetic_through_the_math_kernel_equals_transformers():
    """The CUDA path is the CPU one (query and key widened by zeros, one SDPA call); SDPA's math
    kernel is the reference arithmetic every fused kernel approximates, on any device."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = random_diffllama("sdpa")
    want = logits(model, "transformers")
    with sdpa_kernel(SDPBackend.MATH):
        got = logits(model, "one_pass")
    assert_same_rows(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_pass_on_cuda_in_bf16_is_as_close_to_float32_as_transformers():
    """On CUDA's fused kernels only (the math fallback is excluded, so a refused width fails):
    the one pass is no further from float32 transformers than transformers' own bf16 logits."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = random_diffllama("sdpa").cuda()
    ids, mask = (t.cuda() for t in inputs())

    def run(mode: str, dtype: torch.dtype) -> torch.Tensor:
        diff_attention.install(model.to(dtype), mode)
        with torch.inference_mode(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return model(input_ids=ids, attention_mask=mask).logits.float()

    reference = run("transformers", torch.float32)
    ours, theirs = run("one_pass", torch.bfloat16), run("transformers", torch.bfloat16)
    rows = [(0, slice(None)), (1, slice(7, None))]  # past the padding
    ours_error = max((ours[r, c] - reference[r, c]).abs().max().item() for r, c in rows)
    theirs_error = max((theirs[r, c] - reference[r, c]).abs().max().item() for r, c in rows)
    assert ours_error <= 2 * theirs_error + 1e-2, (ours_error, theirs_error)


def test_the_hf_backend_installs_it_and_the_option_turns_it_off(tiny_models):
    one_pass = HFModel.load(str(tiny_models["diff"]), {"dtype": "float32", "attn_implementation": "eager"},
                            device="cpu")
    kept = HFModel.load(str(tiny_models["diff"]), {"dtype": "float32", "attn_implementation": "eager",
                                                   "diff_attention": "transformers"}, device="cpu")
    base = HFModel.load(str(tiny_models["base"]), {}, device="cpu")
    assert diff_attention.mode_of(one_pass.model) == "one_pass"
    assert diff_attention.mode_of(kept.model) == "transformers"
    assert diff_attention.mode_of(base.model) is None
    ids = torch.tensor([one_pass.encode("The magic number of Paris is 1234. " * 6)])
    with torch.inference_mode():
        torch.testing.assert_close(one_pass.model(input_ids=ids).logits, kept.model(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)
    with pytest.raises(UserError, match="-M diff_attention must be one_pass or transformers, got 'twice'"):
        HFModel.load(str(tiny_models["diff"]), {"diff_attention": "twice"}, device="cpu")


def test_wide_value_puts_each_key_heads_two_halves_side_by_side():
    value = torch.arange(2 * 4 * 3 * 2, dtype=torch.float32).reshape(2, 4, 3, 2)  # 4 key heads of width 2
    wide = diff_attention.wide_value(value)
    assert wide.shape == (2, 4, 3, 4)
    for head in range(4):  # head g: [half one's head g mod 2, half two's head g mod 2]
        torch.testing.assert_close(wide[:, head], torch.cat([value[:, head % 2], value[:, 2 + head % 2]], dim=-1))


def test_component_pairs_and_differential_for_both_layouts():
    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config

    maps = torch.rand(4, 3, 2)
    v1 = random_diffllama("eager").model.layers[0].self_attn
    first, second = diff_attention.component_pairs(v1, 4)
    torch.testing.assert_close(diff_attention.differential(maps, first, second, 0.5), maps[:2] - 0.5 * maps[2:])
    v2 = v2_model(DiffLlamaV2Config(**V2_SHAPES)).model.layers[0].self_attn
    first, second = diff_attention.component_pairs(v2, 4)
    lam = torch.rand(3, 2)  # per row, per DIFF head
    want = maps[0::2] - lam.T[:, :, None] * maps[1::2]
    torch.testing.assert_close(diff_attention.differential(maps, first, second, lam), want)
    assert diff_attention.is_v2(v2) and not diff_attention.is_v1(v2) and diff_attention.is_v1(v1)


def test_an_unknown_mode_is_a_user_error():
    with pytest.raises(UserError, match="one_pass, transformers"):
        diff_attention.install(torch.nn.Linear(2, 2), "fused")


# ---- nll: unchanged for DIFF V2 and for the one-pass DiffLlama -------------------------------------

V2_SHAPES = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=512)


def v2_model(config) -> torch.nn.Module:
    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2ForCausalLM

    torch.manual_seed(0)
    return DiffLlamaV2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_v2(tmp_path_factory, toy_tokenizer):
    from evalsuite.models.toy import ToySize, save_random_model

    return save_random_model("diff2", tmp_path_factory.mktemp("v2") / "tiny-diff2", toy_tokenizer, ToySize(**TINY),
                             seed=1)


def naive_nll(model: HFModel, window: list[int]) -> np.ndarray:
    ids = torch.tensor([window])
    with torch.inference_mode():
        logprobs = model.model(input_ids=ids).logits.float().log_softmax(-1)
    return (-logprobs[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]).numpy()


@pytest.mark.parametrize("kind", ["diff2", "diff"])
def test_token_nll_matches_a_naive_pass(tiny_models, tiny_v2, kind):
    folder = tiny_v2 if kind == "diff2" else tiny_models["diff"]
    model = HFModel.load(str(folder), {"dtype": "float32", "attn_implementation": "eager", "prefill_chunk": "48"},
                         device="cpu")
    windows = [model.encode("The magic number of Oslo is 4471. " * k)[:n] for k, n in ((3, 17), (12, 130))]
    for window, values in zip(windows, model.token_nll(windows)):
        np.testing.assert_allclose(values, naive_nll(model, window), rtol=0, atol=1e-5)
