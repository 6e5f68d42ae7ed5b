"""`evalsuite convert --key-map builtin:archscale-diff`: DIFF V1 as microsoft/ArchScale's
`lit_gpt/diff_attn.py` computes it (striped head pairs, lambda re-parameterised, a per-head
RMSNorm of width 2d with a learned weight, the (1 - lambda_init) scale), written out here in
plain torch with lit-gpt's parameter names, converts to transformers' DiffLlama with the same
logits, and the converted folder runs the needle task."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import invoke

torch = pytest.importorskip("torch")
F = torch.nn.functional

HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS, THETA, EPS = 64, 4, 16, 96, 3, 10000.0, 1e-5
TOY = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-diff"


def vocab() -> int:
    return int(json.loads((TOY / "config.json").read_text())["vocab_size"])


def lambda_init(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def rms(x, weight=None):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return y if weight is None else y * weight


def rotate(x):
    """Rotary embedding over halves (flash-attn's apply_rotary_emb with interleaved=False); x (B, T, H, d)."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    angles = torch.arange(x.shape[1]).float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    first, second = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def attend(q, k, v):
    """Causal softmax attention as flash attention computes it; GQA: query head j reads KV head j // group."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
    time = q.shape[1]
    scores = scores.masked_fill(torch.ones(time, time, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def diff_attention(p: dict, layer: int, x, kv_heads: int, fused: bool):
    """ArchScale's CausalSelfAttention with FlashDiffAttention, restated."""
    pre = f"transformer.h.{layer}.attn."
    batch, time, _ = x.shape
    if fused:  # per KV group: its query heads, one key head, one value head
        per = HEADS // kv_heads
        qkv = (x @ p[pre + "attn.weight"].T).view(batch, time, kv_heads, per + 2, HEAD_DIM)
        q, k, v = qkv[..., :per, :], qkv[..., per, :], qkv[..., per + 1, :]
        q = q.reshape(batch, time, HEADS, HEAD_DIM)
    else:
        q = (x @ p[pre + "q_proj.weight"].T).view(batch, time, HEADS, HEAD_DIM)
        k = (x @ p[pre + "k_proj.weight"].T).view(batch, time, kv_heads, HEAD_DIM)
        v = (x @ p[pre + "v_proj.weight"].T).view(batch, time, kv_heads, HEAD_DIM)
    q, k = rotate(q), rotate(k)
    (q1, q2), (k1, k2), (v1, v2) = ((t[:, :, 0::2], t[:, :, 1::2]) for t in (q, k, v))  # the striped pairs
    attn1 = torch.cat([attend(q1, k1, v1), attend(q1, k1, v2)], dim=-1)
    attn2 = torch.cat([attend(q2, k2, v1), attend(q2, k2, v2)], dim=-1)
    da = pre + "da."
    lam = (torch.exp((p[da + "lambda_q1"] * p[da + "lambda_k1"]).sum()) - torch.exp(
        (p[da + "lambda_q2"] * p[da + "lambda_k2"]).sum()) + lambda_init(layer))
    out = rms(attn1 - lam * attn2, p[da + "subln.weight"]) * (1 - lambda_init(layer))
    return out.reshape(batch, time, -1) @ p[pre + "proj.weight"].T


def archscale_logits(p: dict, ids, kv_heads: int, fused: bool):
    x = p["transformer.wte.weight"][ids]
    for layer in range(LAYERS):
        h = f"transformer.h.{layer}."
        x = x + diff_attention(p, layer, rms(x, p[h + "norm_1.weight"]), kv_heads, fused)
        gate, up = (rms(x, p[h + "norm_2.weight"]) @ p[h + "mlp.w1.weight"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ p[h + "mlp.w3.weight"].T
    return rms(x, p["transformer.ln_f.weight"]) @ p["lm_head.weight"].T


def archscale_state_dict(kv_heads: int, fused: bool, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, scale=None, around=0.0):
        scale = 1 / math.sqrt(shape[-1]) if scale is None else scale
        return around + scale * torch.randn(*shape, generator=generator)

    p = {"transformer.wte.weight": normal(vocab(), HIDDEN, scale=1.0), "transformer.ln_f.weight": normal(
        HIDDEN, scale=0.3, around=1.0), "lm_head.weight": normal(vocab(), HIDDEN)}
    for layer in range(LAYERS):
        h = f"transformer.h.{layer}."
        if fused:
            p[h + "attn.attn.weight"] = normal((HEADS + 2 * kv_heads) * HEAD_DIM, HIDDEN)
        else:
            p[h + "attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
            p[h + "attn.k_proj.weight"] = normal(kv_heads * HEAD_DIM, HIDDEN)
            p[h + "attn.v_proj.weight"] = normal(kv_heads * HEAD_DIM, HIDDEN)
        p[h + "attn.proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            p[h + "attn.da." + name] = normal(HEAD_DIM, scale=0.1)
        p[h + "attn.da.subln.weight"] = normal(2 * HEAD_DIM, scale=0.3, around=1.0)
        p[h + "norm_1.weight"] = normal(HIDDEN, scale=0.3, around=1.0)
        p[h + "norm_2.weight"] = normal(HIDDEN, scale=0.3, around=1.0)
        p[h + "mlp.w1.weight"] = normal(2 * FFN, HIDDEN)
        p[h + "mlp.w3.weight"] = normal(HIDDEN, FFN)
    return p


def convert(capsys, tmp_path: Path, p: dict, kv_heads: int, *extra: str) -> Path:
    from safetensors.torch import save_file

    source = tmp_path / "archscale.safetensors"
    save_file({k: v.contiguous() for k, v in p.items()}, str(source))
    fields = [f"hidden_size={HIDDEN}", f"intermediate_size={FFN}", f"num_hidden_layers={LAYERS}",
              f"num_attention_heads={HEADS}", f"num_key_value_heads={kv_heads}", f"head_dim={HEAD_DIM}",
              f"vocab_size={vocab()}", f"rope_theta={THETA}", "tie_word_embeddings=false",
              "max_position_embeddings=4096"]
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", "builtin:archscale-diff",
                 "--arch", "diffllama", *[a for f in fields for a in ("-C", f)], *extra)
    assert ran.code == 0, ran.err
    return out


@pytest.mark.parametrize("kv_heads, fused", [(2, False), (4, False), (2, True)])
def test_converted_logits_equal_archscales_equations(capsys, tmp_path, kv_heads, fused):
    from transformers import AutoModelForCausalLM

    p = archscale_state_dict(kv_heads, fused)
    folder = convert(capsys, tmp_path, p, kv_heads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.randint(0, vocab(), (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = archscale_logits(p, ids, kv_heads, fused)
        got = model(ids).logits
    assert type(model).__name__ == "DiffLlamaForCausalLM"
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_the_head_reordering_matters(capsys, tmp_path):
    """Converted without the striped-to-halves reordering, the logits differ: the test tells layouts apart."""
    from evalsuite.modeling import convert_archscale

    p = archscale_state_dict(2, False)
    original = convert_archscale.striped_to_halves
    try:
        convert_archscale.striped_to_halves = lambda weight, heads, head_dim: weight
        folder = convert(capsys, tmp_path, p, 2)
    finally:
        convert_archscale.striped_to_halves = original
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, vocab(), (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (model(ids).logits - archscale_logits(p, ids, 2, False)).abs().max() > 1e-3


def test_a_converted_archscale_model_runs_the_needle_task(capsys, tmp_path):
    folder = convert(capsys, tmp_path, archscale_state_dict(2, False), 2, "--tokenizer", str(TOY))
    ran = invoke(capsys, "run", "--model", str(folder), "--task", "needle", "-T", "lengths=256", "-T", "depths=0,1",
                 "-T", "samples=1", "--no-progress", "--out", str(tmp_path / "runs"))
    assert ran.code == 0, ran.err[-3000:]
    (run,) = (tmp_path / "runs").glob("needle-converted-*")
    overall = json.loads((run / "summary.json").read_text())["overall"]
    assert overall["n"] == 2 and overall["errors"] == 0  # random weights answer wrongly, but they answer


def test_a_missing_subln_or_another_architecture_is_one_line(capsys, tmp_path):
    from safetensors.torch import save_file

    p = archscale_state_dict(2, False)
    del p["transformer.h.1.attn.da.subln.weight"]
    source = tmp_path / "w.safetensors"
    save_file(p, str(source))
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:archscale-diff",
                 "--arch", "diffllama", "-C", f"num_attention_heads={HEADS}", "-C", "num_key_value_heads=2",
                 "-C", f"hidden_size={HIDDEN}", "-C", f"num_hidden_layers={LAYERS}")
    assert ran.code == 2 and "layer 1 has no subln tensor" in ran.err and len(ran.err.strip().splitlines()) == 1
    shutil.rmtree(tmp_path / "o", ignore_errors=True)
    other = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:archscale-diff",
                   "--arch", "llama")
    assert other.code == 2 and "converts to --arch diffllama" in other.err
    assert not (tmp_path / "o").exists()


LAYER = "transformer.h.1.attn."
DAMAGED_TENSORS = {  # name: (source tensor replaced, its damaged value's shape, what the line says)
    "q_proj of the wrong rows": (LAYER + "q_proj.weight", (3 * HEAD_DIM, HIDDEN),
                                 "is [48, 64], but the config gives it [64, 64]"),
    "q_proj 1-D": (LAYER + "q_proj.weight", (HIDDEN,), "q_proj.weight is [64]"),
    "q_proj empty": (LAYER + "q_proj.weight", (0,), "q_proj.weight is [0]"),
    "k_proj of the wrong rows": (LAYER + "k_proj.weight", (HEAD_DIM, HIDDEN), "num_key_value_heads x head_dim"),
    "subln of the wrong width": (LAYER + "da.subln.weight", (5,), "subln.weight is [5], but the config gives it [32]"),
    "subln 2-D": (LAYER + "da.subln.weight", (2, 2 * HEAD_DIM), "subln.weight is [2, 32]"),
    "proj of the wrong columns": (LAYER + "proj.weight", (HIDDEN, 3 * HEAD_DIM), "proj.weight is [64, 48]"),
    "w1 of odd rows": ("transformer.h.1.mlp.w1.weight", (3, HIDDEN), "2 x intermediate_size"),
}


def refused(capsys, tmp_path: Path, p: dict, *fields: str):
    """`convert` of state dict `p` with the test's config, `fields` over it: it must refuse in one line."""
    from safetensors.torch import save_file

    source = tmp_path / "damaged.safetensors"
    save_file({k: v.contiguous() for k, v in p.items()}, str(source))
    given = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                 num_key_value_heads=2, head_dim=HEAD_DIM, vocab_size=vocab(), tie_word_embeddings="false")
    given.update(field.split("=", 1) for field in fields)
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:archscale-diff",
                 "--arch", "diffllama", *[a for k, v in given.items() for a in ("-C", f"{k}={v}")])
    assert ran.code == 2 and len(ran.err.strip().splitlines()) == 1, ran.err[-2000:]
    assert not (tmp_path / "o").exists()
    return ran.err


@pytest.mark.parametrize("case", sorted(DAMAGED_TENSORS))
def test_a_misshapen_source_tensor_is_one_line_before_any_reshape(capsys, tmp_path, case):
    name, shape, says = DAMAGED_TENSORS[case]
    p = archscale_state_dict(2, False)
    p[name] = torch.zeros(shape)
    err = refused(capsys, tmp_path, p)
    assert name in err and says in err


def test_a_fused_projection_of_the_wrong_size_or_beside_the_separate_ones_is_one_line(capsys, tmp_path):
    p = archscale_state_dict(2, True)
    p[LAYER + "attn.weight"] = torch.zeros(7 * HEAD_DIM + 3, HIDDEN)
    assert "attn.attn.weight is [115, 64], but the config gives it [128, 64]" in refused(capsys, tmp_path, p)
    both = archscale_state_dict(2, True)
    both[LAYER + "q_proj.weight"] = torch.zeros(HEADS * HEAD_DIM, HIDDEN)
    assert "layer 1 has both the fused attn.attn and q_proj" in refused(capsys, tmp_path, both)


@pytest.mark.parametrize("field, says", [
    ("num_attention_heads=0", "num_attention_heads is 0; a positive whole number"),
    ("num_attention_heads=3", "num_attention_heads=3 cannot form head pairs"),
    ("num_key_value_heads=0", "num_key_value_heads is 0; a positive whole number"),
    ("num_key_value_heads=3", "num_key_value_heads=3 cannot form head pairs"),
    ("head_dim=-16", "head_dim is -16; a positive whole number"),
    ("num_attention_heads=1e9", "num_attention_heads"),  # a float: refused by the config or by the check
    # a whole number that fits no tensor: refused by the shape check, not by a 64 GB `repeat`
    ("num_attention_heads=1000000000", "gives it [64, 16000000000]"),
])
def test_a_config_the_weights_cannot_fill_is_one_line_before_any_reshape(capsys, tmp_path, field, says):
    assert says in refused(capsys, tmp_path, archscale_state_dict(2, False), field)
