"""Absmax quantization of attention logits: the quantizer and the attention function
against a direct, loop-by-loop reading of the formula, on random tensors and inside
whole Llama / DiffLlama models; 16 bits exact; clear errors."""

from __future__ import annotations

import pytest
import torch

from evalsuite.backends.hf import quant
from evalsuite.errors import UserError
from evalsuite.types import LoglikelihoodRequest

BITS = (8, 6, 4, 2)


def reference_quantize(x: torch.Tensor, valid: torch.Tensor, bits: int, granularity: str) -> torch.Tensor:
    """s = max|x| / (2^(b-1) - 1), x̂ = round(x / s) · s, one slice at a time, the max over valid entries."""
    levels = 2 ** (bits - 1) - 1
    out = x.clone()
    batch, heads, rows, _ = x.shape
    valid = valid.expand_as(x)

    def fill(index: tuple) -> None:
        slice_x, slice_valid = x[index], valid[index]
        scale = slice_x[slice_valid].abs().max() / levels if slice_valid.any() else torch.tensor(0.0)
        out[index] = torch.round(slice_x / scale) * scale if scale > 0 else slice_x

    for b in range(batch):
        if granularity == "tensor":
            fill((b,))
        for h in range(heads):
            if granularity == "head":
                fill((b, h))
            for r in range(rows):
                if granularity == "row":
                    fill((b, h, r))
    return out


def reference_attention(bits: int, granularity: str):
    """Eager attention with the logits quantized by `reference_quantize`: no chunks, no shortcuts."""

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        x = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
        q_len, k_len = x.shape[-2:]
        if attention_mask is None:
            valid = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)[None, None]
        else:
            valid = attention_mask[..., :k_len]
        x = reference_quantize(x, valid, bits, granularity) if bits < 16 else x
        x = x.masked_fill(~valid, torch.finfo(torch.float32).min)
        probs = torch.softmax(x, dim=-1).to(value.dtype)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), None

    return attend


def attention_module(bits: int, granularity: str, chunk_bytes: int) -> torch.nn.Module:
    module = torch.nn.Module()
    module.is_causal = True
    quant.attach(module, quant.Hook(quant.AttnQuant(bits, granularity, chunk_bytes=chunk_bytes)))
    return module


def padded_causal_mask(batch: int, length: int, pads: list[int]) -> torch.Tensor:
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = causal[None, None].repeat(batch, 1, 1, 1)
    for b, pad in enumerate(pads):
        mask[b, :, :, :pad] = False
    return mask


@pytest.mark.parametrize("granularity", quant.GRANULARITIES)
@pytest.mark.parametrize("bits", BITS)
def test_quantizer_matches_reference_on_random_logits(bits, granularity):
    torch.manual_seed(bits)
    x = torch.randn(2, 3, 5, 7) * 4
    valid = padded_causal_mask(2, 7, [0, 3])[:, :, 2:]  # 5 query rows of a 7-key causal mask with padding
    dims = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}[granularity]
    got = quant.fake_quantize(x, quant.masked_absmax(x, valid, dims), bits)
    want = reference_quantize(x, valid, bits, granularity)
    assert torch.allclose(got.masked_fill(~valid, 0), want.masked_fill(~valid, 0), atol=1e-6)
    levels = 2 ** (bits - 1) - 1
    steps = (got / (quant.masked_absmax(x, valid, dims) / levels))[valid.expand_as(x)]
    assert torch.allclose(steps, steps.round(), atol=1e-4)  # integer multiples of s...
    assert steps.abs().max() <= levels + 1e-4 and len(set(steps.round().tolist())) <= 2 * levels + 1  # ...in range


@pytest.mark.parametrize("granularity", quant.GRANULARITIES)
@pytest.mark.parametrize("bits", (16, 8, 4))
def test_attention_function_matches_reference_with_padding_gqa_and_chunks(bits, granularity):
    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 4, 2, 9, 8
    query = torch.randn(batch, heads, length, dim) * 3
    key, value = torch.randn(batch, kv_heads, length, dim) * 3, torch.randn(batch, kv_heads, length, dim)
    mask = padded_causal_mask(batch, length, [0, 4])
    want, _ = reference_attention(bits, granularity)(None, query, key, value, mask, scaling=dim**-0.5)
    for chunk_rows in (1, 2, length):  # one query row per chunk up to all at once: same answer
        module = attention_module(bits, granularity, chunk_bytes=4 * batch * heads * length * chunk_rows)
        got, weights = quant.absmax_attention(module, query, key, value, mask, scaling=dim**-0.5)
        assert weights is None
        assert got.shape == (batch, length, heads, dim)
        assert torch.allclose(got[0], want[0], atol=1e-5)
        assert torch.allclose(got[1, 4:], want[1, 4:], atol=1e-5)  # rows past the padding


def test_no_mask_means_causal_with_the_queries_at_the_end():
    torch.manual_seed(1)
    query, key, value = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    module = attention_module(8, "row", chunk_bytes=1)
    got, _ = quant.absmax_attention(module, query, key, value, None, scaling=0.5)
    want, _ = reference_attention(8, "row")(None, query, key, value, None, scaling=0.5)
    assert torch.allclose(got, want, atol=1e-6)


def load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def model_inputs():
    ids = torch.randint(3, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding in the second row
    return ids, mask


def reference_logits(model, bits: int, granularity: str, ids, mask):
    """The model's logits with the hand-written reference as its attention function (through the
    model's own attention calls); the model is left on sdpa."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = f"test_reference_{bits}_{granularity}"
    AttentionInterface.register(name, reference_attention(bits, granularity))
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("sdpa")
    return logits


@pytest.mark.parametrize("kind", ("base", "diff"))
def test_full_model_logits_match_hand_written_reference(tiny_models, kind):
    model = load(tiny_models[kind])
    ids, mask = model_inputs()
    for bits in (8, 4):
        for granularity in quant.GRANULARITIES:
            want = reference_logits(model, bits, granularity, ids, mask)
            with quant.using(model, quant.AttnQuant(bits, granularity, chunk_bytes=4 * 2 * 4 * 24 * 5)):
                with torch.inference_mode():
                    got = model(input_ids=ids, attention_mask=mask).logits
            assert model.config._attn_implementation == "sdpa"  # restored after the block
            assert torch.allclose(got[0], want[0], atol=1e-4), (kind, bits, granularity)
            assert torch.allclose(got[1, 6:], want[1, 6:], atol=1e-4), (kind, bits, granularity)


@pytest.mark.parametrize("kind", ("base", "diff"))
def test_quantization_changes_logits_more_as_bits_drop(tiny_models, kind):
    model = load(tiny_models[kind])
    ids, mask = model_inputs()
    with torch.inference_mode():
        plain = model(input_ids=ids, attention_mask=mask).logits
        errors = []
        for bits in (8, 4, 2):
            with quant.using(model, quant.AttnQuant(bits)):
                errors.append((model(input_ids=ids, attention_mask=mask).logits - plain)[0].abs().max().item())
    assert 0 < errors[0] < errors[1] < errors[2]


@pytest.mark.parametrize("implementation", ("sdpa", "eager"))
def test_sixteen_bits_is_bit_for_bit_unquantized(tiny_models, implementation):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["diff"], dtype=torch.float32,
                                                 attn_implementation=implementation).eval()
    ids, mask = model_inputs()
    with torch.inference_mode():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with quant.using(model, quant.AttnQuant(16, "row")):
            sixteen = model(input_ids=ids, attention_mask=mask).logits
        with quant.using(model, quant.AttnQuant(8)):
            pass
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(plain, sixteen)
    assert torch.equal(plain, after)
    assert model.config._attn_implementation == implementation


def random_diff(kind: str) -> torch.nn.Module:
    """A random float32 DIFF model with grouped-query attention: DiffLlama (8 component heads, 4 key
    heads) or DIFF V2 (4 DIFF heads, so 8 query heads, over 4 key heads)."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config, DiffLlamaV2ForCausalLM

    common = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  max_position_embeddings=512, num_key_value_heads=4, pad_token_id=0)
    torch.manual_seed(3)
    if kind == "v1":
        return DiffLlamaForCausalLM(DiffLlamaConfig(**common, num_attention_heads=8, lambda_std_dev=0.5)).eval()
    return DiffLlamaV2ForCausalLM(DiffLlamaV2Config(**common, num_attention_heads=4, head_dim=16,
                                                    rope_interleaved=kind == "v2-interleaved")).eval()


@pytest.mark.parametrize("kind", ("v2", "v2-interleaved", "v1-one-pass"))
def test_every_map_of_a_diff_model_is_quantized_as_the_reference_says(kind):
    """DIFF V2 (both heads of each pair in one call) and the one-pass DiffLlama (both maps in one
    call, each once) against the hand-written reference run through the model's own attention
    calls (transformers' two calls for DiffLlama); `tensor` puts both maps under one scale."""
    from evalsuite.backends.hf import diff_attention

    model = random_diff(kind.removesuffix("-one-pass"))
    ids, mask = model_inputs()
    for bits, granularity in ((8, "tensor"), (4, "head"), (4, "row")):
        want = reference_logits(model, bits, granularity, ids, mask)
        diff_attention.install(model, "one_pass")  # DiffLlama only; V2 has one call of its own
        with quant.using(model, quant.AttnQuant(bits, granularity, chunk_bytes=4 * 2 * 8 * 24 * 5)):
            with torch.inference_mode():
                got = model(input_ids=ids, attention_mask=mask).logits
        diff_attention.install(model, "transformers")
        assert torch.allclose(got[0], want[0], atol=1e-4), (kind, bits, granularity)
        assert torch.allclose(got[1, 6:], want[1, 6:], atol=1e-4), (kind, bits, granularity)
        with torch.inference_mode():
            plain = model(input_ids=ids, attention_mask=mask).logits
        assert (got - plain)[0].abs().max() > 1e-4  # the quantizer ran


def test_a_quantized_call_of_a_diff_model_sees_both_maps():
    """One call per layer of the one-pass DiffLlama and of DIFF V2 holds every component head."""
    from evalsuite.backends.hf import diff_attention

    heads: list[tuple[int, int]] = []

    class Observer:
        def call(self, module):
            heads.append((module.layer_idx, -1))

        def chunk(self, logits, valid):
            heads[-1] = (heads[-1][0], logits.shape[1])

    for kind, component_heads in (("v1", 8), ("v2", 8)):
        model = random_diff(kind)
        diff_attention.install(model, "one_pass")
        heads.clear()
        with quant.using(model, quant.AttnQuant(8), Observer()), torch.inference_mode():
            model(input_ids=model_inputs()[0])
        assert heads == [(0, component_heads), (1, component_heads)], kind


def test_hf_backend_applies_and_fingerprints_attn_quant(tiny_models):
    from evalsuite.backends.hf import HFModel

    plain = HFModel.load(str(tiny_models["base"]), {}, device="cpu")
    assert plain.fingerprint()["quantization"] is None
    model = HFModel.load(str(tiny_models["base"]), {"attn_quant": "absmax:4", "attn_quant_granularity": "head"},
                         device="cpu")
    assert model.fingerprint()["quantization"] == {"attn_logits": "absmax:4", "attn_granularity": "head"}
    assert quant.current(model.model) == quant.AttnQuant(4, "head")
    ids, mask = model_inputs()
    with torch.inference_mode():
        got = model.model(input_ids=ids, attention_mask=mask).logits
        with quant.using(plain.model, quant.AttnQuant(4, "head")):
            want = plain.model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("text", ("absmax:1", "absmax:17", "absmax:x", "int8", "absmax"))
def test_bad_bit_widths_are_clear_errors(text):
    with pytest.raises(ValueError, match="attn_quant|bits"):
        quant.parse_attn_quant(text)
    with pytest.raises(ValueError, match="granularity"):
        quant.AttnQuant(8, "column")
    assert quant.parse_attn_quant("none") == 16 and quant.parse_attn_quant("absmax:6") == 6


def test_bad_backend_options_are_user_errors():
    from evalsuite.backends.hf.loading import HFOptions
    from evalsuite.params import build_params

    bad = {"attn_quant": ("absmax:1", "between 2 and 16"), "attn_quant_granularity": ("col", "granularity"),
           "load_in": ("3bit", "load_in")}
    for option, (value, expected) in bad.items():
        with pytest.raises(UserError, match=expected):
            build_params(HFOptions, {option: value}, flag="-M")


def test_weight_quantization_says_when_unavailable(tiny_models):
    from evalsuite.backends.hf import HFModel

    with pytest.raises(UserError, match="load_in=8bit needs a CUDA device|bitsandbytes"):
        HFModel.load(str(tiny_models["base"]), {"load_in": "8bit"}, device="cpu")


def test_model_without_attention_interface_is_refused():
    from transformers import MambaConfig, MambaForCausalLM

    model = MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=1)).eval()
    with pytest.raises(UserError, match="AttentionInterface"):
        quant.enable(model, quant.AttnQuant(8))
    assert model.config._attn_implementation != quant.NAME  # left as it was


@pytest.mark.gpu
def test_bitsandbytes_8bit_loads_on_cuda(tiny_models):
    pytest.importorskip("bitsandbytes")
    from evalsuite.backends.hf import HFModel

    model = HFModel.load(str(tiny_models["base"]), {"load_in": "8bit", "attn_quant": "absmax:8"}, device="cuda")
    assert model.fingerprint()["quantization"]["weights"] == "bitsandbytes-8bit"
    assert model.loglikelihood([LoglikelihoodRequest("A", " b")])[0].tokens >= 1
