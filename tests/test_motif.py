"""Motif-2.6B (DIFF V1) and Motif-2-12.7B (grouped differential attention) in their published layout:
a parity certificate per family against a plain-torch restatement of the published reference written
here, with controls that break one layout point; loading a Hub-style folder (published config fields
and key names, `auto_map` to remote code that is not there) with no remote code; the KV cache; the
quantized attention logits; and `evalsuite run --model FOLDER` with the needle and attention tasks."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB = 1024  # the toy tokenizer's vocabulary, so a folder runs through `evalsuite run`
EPS, ATTN_EPS, THETA = 1e-6, 1e-5, 10000.0
# the two published families, shrunk: 2.6B counts component heads (4 = 2 DIFF heads), 12.7B counts
# signal and noise query heads (10 = 2 groups of 4 signal + 1 noise, as 40 = 8 x (4 + 1))
FAMILIES = {
    "motif-2.6b": dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=64),
    "motif-2-12.7b": dict(num_attention_heads=10, num_key_value_heads=4, num_noise_heads=2, k_ratio=1,
                          head_dim=16, hidden_size=64),
}
LAYERS, INTERMEDIATE = 3, 96


def published_config(family: str) -> dict:
    """config.json as the Hub folders spell it (remote-code `auto_map` included)."""
    return {
        "architectures": ["MotifForCausalLM"], "model_type": "Motif",
        "auto_map": {"AutoConfig": "configuration_motif.MotifConfig",
                     "AutoModelForCausalLM": "modeling_motif.MotifForCausalLM"},
        "vocab_size": VOCAB, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "hidden_act": "poly_norm", "rms_norm_eps": EPS, "attn_rms_norm_eps": ATTN_EPS, "rope_theta": THETA,
        "max_position_embeddings": 2048, "tie_word_embeddings": False, "use_bias": False,
        "use_sliding_window": False, "torch_dtype": "float32", **FAMILIES[family],
    }


def shape_of(config: dict) -> tuple[int, int, int, int]:
    """(query heads, key heads, head width d, noise heads), as the reference derives them."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or config["hidden_size"] // heads
    return heads, kv_heads, d, config.get("num_noise_heads") or heads // 2


def published_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the published key names, every one far from its initial value."""
    heads, kv_heads, d, noise = shape_of(config)
    signal = heads - noise
    width, inner = config["hidden_size"], config["intermediate_size"]
    gen = torch.Generator().manual_seed(seed)

    def dense(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / math.sqrt(cols)

    def around_one(n: int) -> torch.Tensor:
        return 1 + 0.3 * torch.randn(n, generator=gen)

    weights = {"model.embed_tokens.weight": torch.randn(VOCAB, width, generator=gen),
               "model.norm.weight": around_one(width), "lm_head.weight": dense(VOCAB, width)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        weights |= {
            p + "input_layernorm.weight": around_one(width), p + "post_attention_layernorm.weight": around_one(width),
            p + "self_attn.q_proj.weight": dense(heads * d, width), p + "self_attn.k_proj.weight": dense(kv_heads * d, width),
            p + "self_attn.v_proj.weight": dense(kv_heads * d, width),
            p + "self_attn.o_proj.weight": dense(width, signal * 2 * d),
            p + "self_attn.subln.weight": around_one(2 * d),
            p + "mlp.gate_proj.weight": dense(inner, width), p + "mlp.up_proj.weight": dense(inner, width),
            p + "mlp.down_proj.weight": dense(width, inner),
            p + "mlp.act_fn.weight": torch.rand(3, generator=gen), p + "mlp.act_fn.bias": 0.1 * torch.randn(1, generator=gen),
        }
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            weights[p + f"self_attn.{name}"] = 0.3 * torch.randn(d, generator=gen)
    return weights


# ---- the published reference, restated in plain torch ---------------------------------------------------

def rms(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate_halves(x, time: int):
    """Rotary embedding, element j with element j + d/2 (the neox convention), over (T, heads, d)."""
    d = x.shape[-1]
    # the reference's tables are float32 (frequencies, angles, cos and sin), as in the Llama code it
    # derives from; at a few hundred positions float64 angles would move the logits by ~1e-5
    inverse = 1.0 / THETA ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    angles = torch.outer(torch.arange(time).float(), inverse)
    cos, sin = angles.cos().double()[:, None, :], angles.sin().double()[:, None, :]
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def poly_norm(x, weight, bias):
    def norm(z):
        return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)
    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias


def reference_attention(x, w, p, config, layer, pairing="adjacent", offset=1, quant_bits=None):
    """Grouped differential attention for one sequence (T, width): each signal head's map minus λ times
    its group's noise map, times the group's value (2d wide), sub-layer normed, times (1 - λ_init)."""
    heads, kv_heads, d, noise = shape_of(config)
    ratio, pairs, time = heads // noise - 1, kv_heads // 2, x.shape[0]
    q = rotate_halves((x @ w[p + "q_proj.weight"].T).view(time, heads, d), time)
    k = rotate_halves((x @ w[p + "k_proj.weight"].T).view(time, kv_heads, d), time)
    v = (x @ w[p + "v_proj.weight"].T).view(time, kv_heads, d)
    if pairing == "adjacent":  # the published order: [signal x ratio, noise] per group, (signal, noise) keys
        q_signal = q.view(time, noise, ratio + 1, d)[:, :, :ratio].reshape(time, noise * ratio, d)
        q_noise, k_signal, k_noise = q.view(time, noise, ratio + 1, d)[:, :, ratio], k[:, 0::2], k[:, 1::2]
    else:  # the control: all signal heads, then all noise heads (DiffLlama's halves for the 2.6B family)
        q_signal, q_noise = q[:, : noise * ratio], q[:, noise * ratio :]
        k_signal, k_noise = k[:, : kv_heads // 2], k[:, kv_heads // 2 :]
    values = v.view(time, pairs, 2 * d)  # value head j: v_proj's heads 2j and 2j + 1 side by side
    future = torch.ones(time, time, dtype=torch.bool).triu(1)
    scores_signal, scores_noise = [], []
    for h in range(noise * ratio):
        group = h // ratio
        key = group * pairs // noise
        scores_signal.append(q_signal[:, h] @ k_signal[:, key].T / math.sqrt(d))
        if h % ratio == 0:
            scores_noise.append(q_noise[:, group] @ k_noise[:, key].T / math.sqrt(d))
    if quant_bits:  # absmax over every unmasked logit of the layer, one scale for both kinds of map
        top = max(float(s.masked_fill(future, 0).abs().max()) for s in scores_signal + scores_noise)
        step = top / (2 ** (quant_bits - 1) - 1)
        scores_signal = [torch.round(s / step) * step for s in scores_signal]
        scores_noise = [torch.round(s / step) * step for s in scores_noise]
    lam = (torch.exp((w[p + "lambda_q1"] * w[p + "lambda_k1"]).sum())
           - torch.exp((w[p + "lambda_q2"] * w[p + "lambda_k2"]).sum()))
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (layer - offset))
    lam = lam + lambda_init
    outputs = []
    for h in range(noise * ratio):
        group = h // ratio
        signal_map = torch.softmax(scores_signal[h].masked_fill(future, -math.inf), dim=-1)
        noise_map = torch.softmax(scores_noise[group].masked_fill(future, -math.inf), dim=-1)
        out = (signal_map - lam * noise_map) @ values[:, group * pairs // noise]
        outputs.append(rms(out, w[p + "subln.weight"], ATTN_EPS) * (1 - lambda_init))
    return torch.cat(outputs, dim=-1) @ w[p + "o_proj.weight"].T


def reference_logits(w, config, ids, **control):
    """The forward pass in float64, from the tensors by their published names."""
    w = {name: tensor.double() for name, tensor in w.items()}
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = x + reference_attention(rms(x, w[p + "input_layernorm.weight"], EPS), w, p + "self_attn.", config,
                                    layer, **control)
        h = rms(x, w[p + "post_attention_layernorm.weight"], EPS)
        gate = poly_norm(h @ w[p + "mlp.gate_proj.weight"].T, w[p + "mlp.act_fn.weight"], w[p + "mlp.act_fn.bias"])
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"], EPS) @ w["lm_head.weight"].T


# ---- folders in the published layout ---------------------------------------------------------------------

def write_folder(folder, family: str, tokenizer=None, seed: int = 0):
    config = published_config(family)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    weights = published_weights(config, seed)
    safetensors_torch.save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return config, weights


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def published(request, tmp_path_factory, toy_tokenizer):
    """(family, folder, config, weights) of a Hub-style folder with random weights."""
    folder = tmp_path_factory.mktemp("motif") / f"tiny-{request.param}"
    config, weights = write_folder(folder, request.param, toy_tokenizer)
    return request.param, folder, config, weights


def load(folder, implementation="eager"):
    from transformers import AutoModelForCausalLM

    import evalsuite.modeling.motif  # noqa: F401  (registers "Motif")

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=implementation).eval()


# ---- the certificate -------------------------------------------------------------------------------------

PARITY_TOKENS = 300


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_parity_certificate_against_the_published_reference(published, implementation, capsys):
    family, folder, config, weights = published
    model = load(folder, implementation)
    assert "Motif layout:" in capsys.readouterr().err  # loading says which layout points it read
    ids = torch.randint(0, VOCAB, (PARITY_TOKENS,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = model(ids[None]).logits[0].double()
        want = reference_logits(weights, config, ids)
        adjacent_broken = reference_logits(weights, config, ids, pairing="halves")
        offset_broken = reference_logits(weights, config, ids, offset=0)
    gap = float((got - want).abs().max())
    controls = {name: float((got - other).abs().max())
                for name, other in (("pairing", adjacent_broken), ("lambda_init offset", offset_broken))}
    with capsys.disabled():
        print(f"\n{family} {implementation}: {PARITY_TOKENS} tokens, max |logit - reference| = {gap:.2e}; "
              + ", ".join(f"control {name}: {value:.2e}" for name, value in controls.items()))
    assert gap <= 1e-5
    assert all(value > 1e-3 for value in controls.values()), controls


def test_a_folder_loads_without_remote_code_and_the_config_reads_each_point(published):
    from transformers import AutoConfig

    family, folder, _, _ = published
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    assert type(config).__name__ == "MotifConfig" and config.model_type == "Motif"
    assert (config.noise_heads, config.grouped_ratio) == ((2, 1) if family == "motif-2.6b" else (2, 4))
    model = load(folder)
    assert [layer.self_attn.lambda_init for layer in model.model.layers] == pytest.approx(
        [0.8 - 0.6 * math.exp(-0.3 * (i - 1)) for i in range(LAYERS)])


def test_bad_layouts_are_refused():
    from huggingface_hub.errors import StrictDataclassClassValidationError

    from evalsuite.modeling.motif import MotifConfig

    for fields in ({"num_attention_heads": 10, "num_noise_heads": 3}, {"k_ratio": 2}, {"use_sliding_window": True},
                   {"num_key_value_heads": 3}):
        with pytest.raises((ValueError, StrictDataclassClassValidationError)):
            MotifConfig(**{**published_config("motif-2-12.7b"), **fields})


def test_a_folder_with_a_bad_layout_is_one_line_and_a_non_zero_exit(capsys, tmp_path, toy_tokenizer):
    from conftest import invoke

    folder = tmp_path / "bad-motif"
    config, _ = write_folder(folder, "motif-2-12.7b", toy_tokenizer)
    (folder / "config.json").write_text(json.dumps({**config, "num_noise_heads": 3}))
    ran = invoke(capsys, "run", "--model", str(folder), "--task", "needle", "-T", "lengths=256", "--no-progress",
                 "--out", str(tmp_path / "out"))
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        f"error: could not load {folder}: config.json: num_attention_heads (10) must be groups of signal heads "
        "and one noise head (num_noise_heads 3)"]


# ---- the cache and the quantized logits ------------------------------------------------------------------

def test_the_kv_cache_holds_the_checkpoints_own_heads_and_grows_a_row_per_token(published):
    from evalsuite.modeling import compat

    _, folder, config, _ = published
    model = load(folder, "sdpa")
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :30], use_cache=True)
        cache = compat.returned_cache(out)
        steps = []
        for t in range(30, 40):
            out = model(ids[:, t : t + 1], use_cache=True, **compat.cache_argument(cache))
            cache = compat.returned_cache(out)
            steps.append(out.logits[:, -1])
    heads, kv_heads, d, _ = shape_of(config)
    assert [tuple(k.shape) for k, _ in compat.cache_tensors(cache)] == [(2, kv_heads, 40, d)] * LAYERS
    assert [tuple(v.shape) for _, v in compat.cache_tensors(cache)] == [(2, kv_heads, 40, d)] * LAYERS
    assert torch.allclose(torch.stack(steps, dim=1), full[:, 30:], atol=1e-5)


def test_quantized_logits_cover_every_map_in_one_call_and_match_the_reference(published):
    from evalsuite.backends.hf import quant

    family, folder, config, weights = published
    model = load(folder)
    calls: list[tuple[int, int]] = []

    class Observer:
        def call(self, module):
            calls.append((module.layer_idx, -1))

        def chunk(self, logits, valid):
            calls[-1] = (calls[-1][0], logits.shape[1])

    ids = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(3))
    heads, _, _, noise = shape_of(config)
    with quant.using(model, quant.AttnQuant(6), Observer()), torch.no_grad():
        got = model(ids[None]).logits[0].double()
    # one call per layer, holding each signal head's map and, beside it, the noise map it subtracts
    assert calls == [(layer, 2 * (heads - noise)) for layer in range(LAYERS)]
    want = reference_logits(weights, config, ids, quant_bits=6)
    # a logit within float32 rounding of a level boundary may round to either level here and in the
    # float64 reference, moving the rows after it: nearly every row must agree
    rows_apart = int(((got - want).abs().amax(dim=-1) > 1e-4).sum())
    assert rows_apart <= len(ids) // 10, rows_apart
    assert float((got - reference_logits(weights, config, ids)).abs().max()) > 1e-3  # the quantizer ran


# ---- the command line ------------------------------------------------------------------------------------

def test_model_folder_runs_the_needle_task(capsys, tmp_path, published):
    from conftest import invoke

    family, folder, _, _ = published
    ran = invoke(capsys, "run", "--model", str(folder), "--task", "needle", "-T", "lengths=256", "-T", "depths=0,1",
                 "-T", "samples=1", "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Motif layout:" in ran.stderr
    (run,) = tmp_path.glob(f"needle-tiny-{family}-*")
    overall = json.loads((run / "summary.json").read_text())["overall"]
    assert overall["n"] == 2 and overall["errors"] == 0  # a random model answers wrongly, but it answers


def test_model_folder_runs_the_attention_task_on_the_differential_map(capsys, tmp_path, published):
    from conftest import invoke

    family, folder, _, _ = published
    ran = invoke(capsys, "run", "--model", str(folder), "--task", "attention", "-T", "lengths=256",
                 "-T", "depths=0.5", "-T", "samples=1", "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    (run,) = tmp_path.glob(f"attention-tiny-{family}-*")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert records and not any(r["error"] for r in records)
    output = records[0]["outputs"][0]
    assert output["map"] == "differential" and output["layers"] == list(range(LAYERS))
    assert len(output["lambdas"]) == LAYERS


# ---- the hf backend's decoding paths ---------------------------------------------------------------------

def test_batching_prefix_reuse_and_token_nll_agree_with_plain_forwards(published):
    """Continuous batching and batch size 1, a reused prefix KV cache and none, and token NLL against
    the log-softmax of one plain forward: the same numbers on a Motif folder."""
    from evalsuite.backends.hf import HFModel
    from evalsuite.types import GenerationRequest, LoglikelihoodRequest

    _, folder, _, _ = published
    words = "the city river tower magic number question answer".split()
    prompts = [" ".join(words[i:] + words[:i]) * (1 + i % 3) for i in range(6)]
    requests = [GenerationRequest(prompt=p, max_new_tokens=2 + i % 4) for i, p in enumerate(prompts)]

    def hf(**options: str) -> HFModel:
        return HFModel.load(str(folder), dict(options), device="cpu", batch_size=4)

    plain = hf(continuous_batching="false", prefix_cache="false")
    answers = plain.generate(requests)
    assert hf(continuous_batching="true").generate(requests) == answers
    block = "a shared block of context: " + " ".join(words * 4)
    asked = [LoglikelihoodRequest(context=p, continuation=" answer", prefix=block) for p in prompts[:3]]
    reused = [r.logprob for r in hf(prefix_cache="true").loglikelihood(asked)]
    assert reused == pytest.approx([r.logprob for r in plain.loglikelihood(asked)], abs=1e-4)
    ids = plain.tokens.encode(" ".join(words * 8))[:64]
    (nll,) = plain.token_nll([ids])
    with torch.no_grad():
        logits = plain.model(torch.tensor([ids])).logits[0].float()
    want = -torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert nll == pytest.approx(want.tolist(), abs=1e-4)
