"""Phi-4-mini-flash (SambaY, differential attention) loaded natively: a parity certificate against a
plain-torch restatement of the published reference, the cache, and the needle and attention tasks
on a tiny random folder in the published layout."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

WINDOW = 16
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
            sliding_window=WINDOW, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, max_position_embeddings=4096)
# the published config.json's fields (microsoft/Phi-4-mini-flash-reasoning), nothing of evalsuite's own
PUBLISHED_FIELDS = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_act",
                    "max_position_embeddings", "initializer_range", "layer_norm_eps", "use_cache",
                    "tie_word_embeddings", "rope_theta", "bos_token_id", "eos_token_id", "pad_token_id",
                    "sliding_window", "mb_per_layer", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                    "mamba_dt_rank", "mamba_conv_bias", "mamba_proj_bias", "mlp_bias", "lm_head_bias"}


def random_phi4flash(vocab: int = 97, seed: int = 0):
    """A tiny model with every parameter random (biases, norms, λ vectors and A_log included)."""
    from evalsuite.modeling.phi4flash import Phi4FlashConfig, Phi4FlashForCausalLM

    torch.manual_seed(seed)
    model = Phi4FlashForCausalLM(Phi4FlashConfig(vocab_size=vocab, **TINY)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            scale = 0.3 if parameter.dim() == 1 else 0.12
            parameter.normal_(0.0, scale)
            if name.endswith("A_log"):
                parameter.copy_(torch.rand_like(parameter) * 2 - 1)
    return model


# ---- the published reference, restated in plain torch ---------------------------------------------
# Read from the model's own modeling_phi4flash.py: Wqkv -> q | k | v; split_heads takes adjacent heads
# ("(H two) D -> H two D"); four flash-attention calls (q1,k1,v1) (q1,k1,v2) (q2,k2,v1) (q2,k2,v2),
# window_size (W - 1, W - 1) with causal masking; λ_init = 0.8 - 0.6 exp(-0.3 depth), depth = layer_idx;
# subln RMSNorm over 2d, times (1 - λ_init); Mamba-1 with selective_scan; GMU swiglu(in_proj(x), memory).


def ref_attention(q, k, v, window):
    """Causal softmax attention (batch, time, heads, d) with GQA by repeating key heads, window W:
    a query sees keys i - W + 1 .. i, as flash-attention's window_size (W - 1, W - 1) with causal."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(heads // kv_heads, dim=2), v.repeat_interleave(heads // kv_heads, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    time = q.shape[1]
    i, j = torch.arange(time)[:, None], torch.arange(k.shape[1])[None, :]
    allowed = (j <= i) if window is None else (j <= i) & (i - j <= window - 1)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def ref_diff_attention(w, prefix, x, layer, heads, kv_heads, window, shared, lambda_depth, adjacent=True):
    d = x.shape[-1] // heads
    qkv = F.linear(x, w[prefix + "Wqkv.weight"], w[prefix + "Wqkv.bias"])
    q = qkv[..., : heads * d].unflatten(-1, (heads, d))
    if shared is None:
        k = qkv[..., heads * d : (heads + kv_heads) * d].unflatten(-1, (kv_heads, d))
        v = qkv[..., (heads + kv_heads) * d :].unflatten(-1, (kv_heads, d))
    else:
        k, v = shared

    def split(t):
        if adjacent:
            return t[:, :, 0::2], t[:, :, 1::2]
        return t.chunk(2, dim=2)  # the control: first half against second half (transformers' DiffLlama)

    (q1, q2), (k1, k2), (v1, v2) = split(q), split(k), split(v)
    attn1 = torch.cat([ref_attention(q1, k1, v1, window), ref_attention(q1, k1, v2, window)], dim=-1)
    attn2 = torch.cat([ref_attention(q2, k2, v1, window), ref_attention(q2, k2, v2, window)], dim=-1)
    inner = prefix + "inner_cross_attn."
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * lambda_depth)
    lam = (torch.exp((w[inner + "lambda_q1"] * w[inner + "lambda_k1"]).sum())
           - torch.exp((w[inner + "lambda_q2"] * w[inner + "lambda_k2"]).sum()) + lam_init)
    out = attn1 - lam * attn2
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * w[inner + "subln.weight"]
    out = (out * (1 - lam_init)).flatten(2)
    return F.linear(out, w[prefix + "out_proj.weight"], w[prefix + "out_proj.bias"]), (k, v)


def ref_mamba(w, prefix, x, d_state, d_conv, gives_memory):
    xz = F.linear(x, w[prefix + "in_proj.weight"])
    u, z = xz.chunk(2, dim=-1)
    time = u.shape[1]
    conv = F.conv1d(u.transpose(1, 2), w[prefix + "conv1d.weight"], w[prefix + "conv1d.bias"],
                    padding=d_conv - 1, groups=u.shape[-1])[..., :time]
    u = F.silu(conv).transpose(1, 2)
    rank = w[prefix + "dt_proj.weight"].shape[1]
    dt, B, C = F.linear(u, w[prefix + "x_proj.weight"]).split([rank, d_state, d_state], dim=-1)
    delta = F.softplus(dt @ w[prefix + "dt_proj.weight"].T + w[prefix + "dt_proj.bias"])
    A = -torch.exp(w[prefix + "A_log"])
    h = torch.zeros(x.shape[0], u.shape[-1], d_state)
    ys = []
    for t in range(time):
        h = torch.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B[:, t, None, :] * u[:, t, :, None]
        ys.append((h * C[:, t, None, :]).sum(-1) + w[prefix + "D"] * u[:, t])
    y = torch.stack(ys, dim=1)
    out = F.linear(y * F.silu(z), w[prefix + "out_proj.weight"])
    return out, (y if gives_memory else None)


def reference_logits(w, config, ids, adjacent=True, depth_offset=0):
    layers, heads, kv_heads = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    x = w["model.embed_tokens.weight"][ids]
    memory, shared = None, None
    for i in range(layers):
        p = f"model.layers.{i}."
        normed = F.layer_norm(x, x.shape[-1:], w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], 1e-5)
        if i % 2 == 0 and i >= layers // 2 + 2:  # GMU: swiglu(in_proj(x), memory) = silu(in_proj(x)) * memory
            mixed = F.linear(F.silu(F.linear(normed, w[p + "attn.in_proj.weight"])) * memory,
                             w[p + "attn.out_proj.weight"])
        elif i % 2 == 0:
            mixed, made = ref_mamba(w, p + "attn.", normed, config["mamba_d_state"], config["mamba_d_conv"],
                                    i >= layers // 2)
            memory = made if made is not None else memory
        else:
            window = config["sliding_window"] if i < layers // 2 else None
            cross = i >= layers // 2 + 2
            mixed, kv = ref_diff_attention(w, p + "attn.", normed, i, heads, kv_heads, window,
                                           shared if cross else None, i + depth_offset, adjacent)
            shared = kv if not cross else shared
        x = x + mixed
        normed = F.layer_norm(x, x.shape[-1:], w[p + "post_attention_layernorm.weight"],
                              w[p + "post_attention_layernorm.bias"], 1e-5)
        gate, up = F.linear(normed, w[p + "mlp.fc1.weight"]).chunk(2, dim=-1)
        x = x + F.linear(up * F.silu(gate), w[p + "mlp.fc2.weight"])
    x = F.layer_norm(x, x.shape[-1:], w["model.final_layernorm.weight"], w["model.final_layernorm.bias"], 1e-5)
    return x @ w["model.embed_tokens.weight"].T  # tie_word_embeddings: lm_head is the embedding


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder, its weights as saved, its config.json): a tiny random model saved with save_pretrained."""
    from safetensors.torch import load_file

    folder = tmp_path_factory.mktemp("phi4flash") / "tiny-phi4flash"
    random_phi4flash().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    # as published: the Hub's remote code named, its files absent here, so loading must not need them
    config["auto_map"] = {"AutoConfig": "configuration_phi4flash.Phi4FlashConfig",
                          "AutoModelForCausalLM": "modeling_phi4flash.Phi4FlashForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    weights = {}
    for file in folder.glob("*.safetensors"):
        weights.update(load_file(file))
    return folder, weights, json.loads((folder / "config.json").read_text())


def test_the_folder_has_the_published_key_names_and_config_fields(saved):
    _, weights, config = saved
    own = {key for key in config if key not in ("model_type", "architectures", "transformers_version", "dtype",
                                                "torch_dtype", "auto_map")}
    assert own <= PUBLISHED_FIELDS, own - PUBLISHED_FIELDS
    assert config["model_type"] == "phi4flash"
    layer_keys = {key.split(".", 3)[3] for key in weights if key.startswith("model.layers.")}
    assert {"attn.Wqkv.weight", "attn.Wqkv.bias", "attn.out_proj.bias", "attn.inner_cross_attn.lambda_q1",
            "attn.inner_cross_attn.subln.weight", "attn.A_log", "attn.D", "attn.conv1d.weight", "attn.x_proj.weight",
            "attn.dt_proj.bias", "mlp.fc1.weight", "input_layernorm.bias"} <= layer_keys
    hidden, heads, kv_heads = TINY["hidden_size"], TINY["num_attention_heads"], TINY["num_key_value_heads"]
    d = hidden // heads
    assert weights["model.layers.1.attn.Wqkv.weight"].shape == (hidden + 2 * kv_heads * d, hidden)
    assert weights["model.layers.7.attn.Wqkv.weight"].shape == (hidden, hidden)  # cross-decoder: Q only
    assert weights["model.layers.6.attn.in_proj.weight"].shape == (2 * hidden, hidden)  # GMU
    assert "model.layers.6.attn.A_log" not in weights
    assert "lm_head.weight" not in weights  # tied to the embedding, as published


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_logits_match_the_published_reference_past_the_window_and_the_yoco_split(saved, capfd, implementation):
    """The parity certificate: float32, 40 tokens (window 16, YOCO split at layer 4 of 8)."""
    from transformers import AutoModelForCausalLM

    import evalsuite  # noqa: F401  (registers phi4flash with the Auto classes)

    folder, weights, config = saved
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation
    assert "phi4flash layout:" in capfd.readouterr().err  # loading says which layout points it read
    ids = torch.randint(0, config["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(input_ids=ids, use_cache=False).logits
        expected = reference_logits(weights, config, ids)
        unpaired = reference_logits(weights, config, ids, adjacent=False)
        shifted = reference_logits(weights, config, ids, depth_offset=-1)
    parity = float((ours - expected).abs().max())
    print(f"phi4flash parity ({implementation}): max |logit diff| {parity:.2e}; first-half pairing control "
          f"{float((ours - unpaired).abs().max()):.2e}; lambda_init(layer_idx - 1) control "
          f"{float((ours - shifted).abs().max()):.2e}")
    assert parity <= 1e-5
    assert float((ours - unpaired).abs().max()) > 1e-3
    assert float((ours - shifted).abs().max()) > 1e-3


def test_slices_over_the_cache_equal_one_pass_and_the_cache_grows_as_it_should(saved):
    from transformers import AutoModelForCausalLM

    from evalsuite.modeling import compat
    from evalsuite.modeling.phi4flash_cache import KVLayer, RecurrentLayer

    model = AutoModelForCausalLM.from_pretrained(saved[0], dtype=torch.float32).eval()
    ids = torch.randint(0, 97, (1, 45), generator=torch.Generator().manual_seed(4))
    cache = compat.empty_cache(model.config)
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits
        pieces = [model(input_ids=ids[:, s : s + 7], use_cache=True, **compat.cache_argument(cache)).logits
                  for s in range(0, 45, 7)]
    assert float((torch.cat(pieces, dim=1) - whole).abs().max()) <= 1e-5
    assert not compat.is_plain_cache(cache)  # prefix reuse and continuous batching leave it alone
    sliding = [layer for layer in cache.layers if isinstance(layer, KVLayer) and layer.window]
    (full,) = [layer for layer in cache.layers if isinstance(layer, KVLayer) and not layer.window]
    assert [layer.keys.shape[2] for layer in sliding] == [WINDOW - 1] * 2
    assert full.keys.shape[2] == 45 and cache.get_seq_length() == 45
    states = [layer.state for layer in cache.layers if isinstance(layer, RecurrentLayer)]
    assert len(states) == 3 and all(s.ssm.shape == (1, 128, 8) and s.conv.shape == (1, 128, 3) for s in states)


def test_long_inputs_run_in_slices_with_the_numbers_of_one_pass(saved, monkeypatch):
    from transformers import AutoModelForCausalLM

    from evalsuite.modeling import phi4flash

    model = AutoModelForCausalLM.from_pretrained(saved[0], dtype=torch.float32).eval()
    ids = torch.randint(1, 97, (2, 41), generator=torch.Generator().manual_seed(10))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        whole = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        monkeypatch.setattr(phi4flash, "PREFILL_CHUNK", 6)
        sliced = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert float((whole - sliced).abs().max()) <= 1e-5


def test_a_left_padded_row_equals_the_row_alone(saved):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(saved[0], dtype=torch.float32).eval()
    ids = torch.randint(1, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    batch = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), ids], 1), torch.randint(1, 97, (1, 36))])
    mask = torch.ones_like(batch)
    mask[0, :6] = 0
    with torch.no_grad():
        alone = model(input_ids=ids, use_cache=False).logits
        padded = model(input_ids=batch, attention_mask=mask, use_cache=False).logits
    assert float((padded[0, 6:] - alone[0]).abs().max()) <= 1e-5


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, toy_tokenizer):
    folder = tmp_path_factory.mktemp("phi4flash-run") / "tiny-phi4flash"
    random_phi4flash(vocab=len(toy_tokenizer), seed=1).save_pretrained(folder)
    toy_tokenizer.save_pretrained(folder)
    return folder


def test_model_folder_runs_the_needle_task(capsys, tmp_path, tiny_folder):
    from conftest import invoke

    ran = invoke(capsys, "run", "--model", str(tiny_folder), "--task", "needle", "-T", "lengths=256", "-T",
                 "depths=0,1", "-T", "samples=1", "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    (run,) = tmp_path.glob("needle-tiny-phi4flash-*")
    overall = json.loads((run / "summary.json").read_text())["overall"]
    assert overall["n"] == 2 and overall["errors"] == 0  # a random model answers wrongly, but it answers
    assert json.loads((run / "config.json").read_text())["model"]["architecture"] == "Phi4FlashForCausalLM"


def test_model_folder_runs_the_attention_task_on_its_differential_maps(capsys, tmp_path, tiny_folder):
    from conftest import invoke

    ran = invoke(capsys, "run", "--model", str(tiny_folder), "--task", "attention", "-T", "lengths=256", "-T",
                 "depths=0,1", "-T", "samples=1", "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    (run,) = tmp_path.glob("attention-tiny-phi4flash-*")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and not any(r["error"] for r in records)
    output = records[0]["outputs"][0]
    assert output["map"] == "differential" and output["layers"] == [1, 3, 5, 7]  # its attention layers
    assert len(output["lambdas"]) == 4


def test_attention_logits_quantize_in_every_attention_layer(tiny_folder):
    from transformers import AutoModelForCausalLM

    from evalsuite.backends.hf import quant

    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()
    ids = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        with quant.using(model, quant.AttnQuant(16 - 1)):
            fine = model(input_ids=ids, use_cache=False).logits
        with quant.using(model, quant.AttnQuant(3)):
            coarse = model(input_ids=ids, use_cache=False).logits
    assert quant.attending_layers(model) == [1, 3, 5, 7]
    assert float((fine - plain).abs().max()) < 1e-2 < float((coarse - plain).abs().max())


def test_span_masses_honour_a_sliding_window_and_kept_keys():
    from evalsuite.backends.hf.attention_share import span_masses

    generator = torch.Generator().manual_seed(7)
    rows, keys = torch.randn(4, 3, 8, generator=generator), torch.randn(2, 30, 8, generator=generator)
    positions, spans, window = torch.tensor([12, 20, 29]), [(0, 10), (10, 25), (25, 30)], 6
    scores = torch.einsum("hrd,hkd->hrk", rows, keys.repeat_interleave(2, dim=0)) * 0.3
    k = torch.arange(30)
    seen = (k[None] <= positions[:, None]) & (positions[:, None] - k[None] < window)
    weights = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    expected = torch.stack([weights[..., s:e].sum(-1) for s, e in spans], dim=-1)
    assert torch.allclose(span_masses(rows, keys, positions, spans, 0.3, chunk_bytes=4 * 4 * 3 * 4,
                                      window=window), expected, atol=1e-6)
    kept = span_masses(rows, keys[:, 7:], positions, spans, 0.3, chunk_bytes=4 * 4 * 3 * 4, window=window,
                       first_key=7)  # a sliding-window cache: only keys 7.. are held
    assert torch.allclose(kept, expected, atol=1e-6)


def test_attention_rows_read_in_slices_over_the_cache_equal_one_pass(saved, monkeypatch):
    from transformers import AutoModelForCausalLM

    from evalsuite.backends.hf import attention_share

    model = AutoModelForCausalLM.from_pretrained(saved[0], dtype=torch.float32).eval()
    share = attention_share.AttentionShare(model, None, torch.device("cpu"), "tiny-phi4flash")
    ids = torch.randint(0, 97, (60,), generator=torch.Generator().manual_seed(8)).tolist()
    queries, spans = [40, 55, 59], [(0, 20), (20, 40), (40, 60)]
    whole = share.attention_mass(ids, queries, spans)
    monkeypatch.setattr(attention_share, "PREFILL_ROWS", 9)
    sliced = share.attention_mass(ids, queries, spans)
    assert whole.layers == sliced.layers == (1, 3, 5, 7) and whole.attention_map == "differential"
    assert abs(whole.mass - sliced.mass).max() < 1e-5  # float32 rounding of the slices, over 1 - λ
    # sliding-window layers (1, 3) see only the last 16 keys: nothing before position 40 - 15
    assert abs(whole.mass[:2, :, :, 0]).max() == 0 and abs(whole.mass[2:, :, :, 0]).max() > 1e-3


def hf_adapter(folder, batch_size: int, **options):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evalsuite.backends.hf.loading import HFOptions
    from evalsuite.backends.hf.model import HFModel

    hf_options = HFOptions(**options)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation=hf_options.attn_implementation).eval()
    source = {"label": "tiny", "spec": "tiny", "path": str(folder), "gguf_file": None}
    return HFModel(model, AutoTokenizer.from_pretrained(folder), hf_options, source, batch_size)


def test_token_nll_carries_the_mamba_state_across_slices(tiny_folder):
    ids = torch.randint(5, 50, (70,), generator=torch.Generator().manual_seed(9)).tolist()
    sliced = hf_adapter(tiny_folder, 1, attn_implementation="eager", prefill_chunk=16).token_nll([ids])[0]
    whole = hf_adapter(tiny_folder, 1).token_nll([ids])[0]
    model = hf_adapter(tiny_folder, 1).model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1].float()
    direct = (torch.logsumexp(logits, -1) - logits.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]).tolist()
    assert max(abs(a - b) for a, b in zip(sliced, direct)) < 1e-4
    assert max(abs(a - b) for a, b in zip(whole, direct)) < 1e-4


def test_generation_with_a_shared_prefix_and_batches_equals_each_prompt_alone(tiny_folder):
    """A shared prefix cannot reuse a cache with Mamba state and sliding windows: the backend encodes
    each prompt whole, and a left-padded batch answers as each row alone."""
    from evalsuite.types import GenerationRequest

    prefix = "the quick brown fox jumps over the lazy dog " * 3
    requests = [GenerationRequest(prompt=p, prefix=prefix, max_new_tokens=6)
                for p in ("a b c", "what is the number", "x")]
    batched = hf_adapter(tiny_folder, 3)
    together = batched.generate(requests)
    alone = [hf_adapter(tiny_folder, 1, prefix_cache=False).generate([r])[0] for r in requests]
    assert together == alone
    assert not batched.prefix_cache.usable  # the prefix cache found a cache it cannot crop or widen, and stood aside


def test_the_transformers_internals_it_relies_on():
    """compat's two helpers for this model: the mask format per implementation, and
    `set_attn_implementation` switching a model class of evalsuite's own."""
    from evalsuite.modeling import compat

    assert compat.boolean_masks("sdpa") and not compat.boolean_masks("eager")
    model = random_phi4flash()
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        assert compat.attention_implementation(model.config) == implementation


def test_a_fresh_process_loads_the_folder_through_the_auto_classes_after_import_evalsuite(saved):
    """No remote code and nothing of evalsuite's named: `import evalsuite`, then transformers' Auto classes."""
    import subprocess
    import sys

    code = ("import sys, evalsuite\nfrom transformers import AutoModelForCausalLM\n"
            "print(type(AutoModelForCausalLM.from_pretrained(sys.argv[1])).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(saved[0])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["Phi4FlashForCausalLM"]
    assert "phi4flash layout:" in done.stderr
