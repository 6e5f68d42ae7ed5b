"""`evalsuite convert`: a standalone DIFF V2 model (written here in plain torch: its attention with
the public module's names, q_proj, k_proj, v_proj, o_proj and lambda_proj, and interleaved
rotary; the names beyond the attention, embeddings, norms, MLP, output and rotary, are
evalsuite's choice, as `builtin:diff-v2` names them) converted by the built-in key map loads through
AutoModelForCausalLM with the same logits; HF-named Llama and DiffLlama state dicts convert by
their config; every bad input is one line, exit 2, and nothing written."""

from __future__ import annotations

import json
import math

import pytest
from conftest import invoke

torch = pytest.importorskip("torch")
nn = torch.nn

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, LAYERS, VOCAB = 4, 2, 8, 32, 40, 2, 61
THETA, EPS = 500.0, 1e-5
FIELDS = [f"hidden_size={HIDDEN}", f"intermediate_size={FFN}", f"num_hidden_layers={LAYERS}",
          f"num_attention_heads={HEADS}", f"num_key_value_heads={KV_HEADS}", f"head_dim={HEAD_DIM}",
          f"vocab_size={VOCAB}", f"rope_theta={THETA}", f"rms_norm_eps={EPS}", "tie_word_embeddings=false"]


# ---- a standalone DIFF V2 model: the public attention module's names, evalsuite's around it -------

class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class Rotary(nn.Module):
    """GPT-J rotation: dims 2j, 2j+1 as one complex number turned by position x theta^(-2j/d)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", THETA ** (-torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))

    def forward(self, x):  # (batch, time, heads, d)
        angles = torch.arange(x.shape[1]).float()[:, None] * self.inv_freq[None, :]
        turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
        return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * turn).flatten(-2)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, 2 * HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.lambda_proj = nn.Linear(HIDDEN, HEADS, bias=False)
        self.rotary = Rotary()

    def forward(self, x):
        batch, time, _ = x.shape
        q = self.rotary(self.q_proj(x).view(batch, time, 2 * HEADS, HEAD_DIM))
        k = self.rotary(self.k_proj(x).view(batch, time, KV_HEADS, HEAD_DIM))
        v = self.v_proj(x).view(batch, time, KV_HEADS, HEAD_DIM)
        group = 2 * HEADS // KV_HEADS
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(torch.ones(time, time, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(batch, time, HEADS, 2, HEAD_DIM)
        lam = torch.sigmoid(self.lambda_proj(x))[..., None]
        return self.o_proj((out[..., 0, :] - lam * out[..., 1, :]).flatten(-2))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.attn, self.ffn_norm, self.ffn = RMSNorm(HIDDEN), Attention(), RMSNorm(HIDDEN), FeedForward()

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class StandaloneDiffV2(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def standalone(seed: int = 0) -> StandaloneDiffV2:
    torch.manual_seed(seed)
    module = StandaloneDiffV2().eval()
    with torch.no_grad():
        for name, tensor in module.named_parameters():
            scale = 0.3 if name.endswith("norm.weight") else 1 / math.sqrt(tensor.shape[-1])
            tensor.copy_((1 if name.endswith("norm.weight") else 0) + scale * torch.randn_like(tensor))
    return module


def save_safetensors(tensors: dict, path):
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path))
    return path


def ids(batch: int = 2, time: int = 12):
    return torch.randint(0, VOCAB, (batch, time), generator=torch.Generator().manual_seed(5))


def load_folder(folder):
    from transformers import AutoModelForCausalLM

    import evalsuite.modeling.diffllama_v2  # noqa: F401  (this process loads the folder without the hf backend)

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ---- conversions that work -----------------------------------------------------------------------

def test_the_builtin_map_converts_the_standalone_module(capsys, tmp_path):
    module = standalone()
    source = save_safetensors(module.state_dict(), tmp_path / "diff_v2.safetensors")
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[arg for field in FIELDS for arg in ("-C", field)])
    assert ran.code == 0, ran.err
    assert "diffllama_v2" in ran.out and str(out) in ran.out
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "diffllama_v2" and config["rope_interleaved"] is True  # from the map
    assert config["architectures"] == ["DiffLlamaV2ForCausalLM"]
    model = load_folder(out)
    with torch.no_grad():
        expected, got = module(ids()), model(ids()).logits
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_a_toml_key_map_and_a_config_file(capsys, tmp_path):
    """A user's own layout: the map renames what differs; the config comes from a config.json."""
    module = standalone(seed=1)
    renamed = {name.replace("tok_embeddings", "embed").replace("output", "head"): t
               for name, t in module.state_dict().items()}
    source = save_safetensors(renamed, tmp_path / "mine.safetensors")
    key_map = tmp_path / "map.toml"
    key_map.write_text(
        "[rename]\n'embed\\.weight' = 'model.embed_tokens.weight'\n'head\\.weight' = 'lm_head.weight'\n"
        "'layers\\.(\\d+)\\.attn_norm\\.(.*)' = 'model.layers.\\1.input_layernorm.\\2'\n"
        "'layers\\.(\\d+)\\.attn\\.rotary\\..*' = ''\n"
        "'layers\\.(\\d+)\\.attn\\.(.*)' = 'model.layers.\\1.self_attn.\\2'\n"
        "'layers\\.(\\d+)\\.ffn_norm\\.(.*)' = 'model.layers.\\1.post_attention_layernorm.\\2'\n"
        "'layers\\.(\\d+)\\.ffn\\.(.*)' = 'model.layers.\\1.mlp.\\2'\n'norm\\.weight' = 'model.norm.weight'\n"
        "[config]\nrope_interleaved = true\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "diffllama_v2", **{f.split("=")[0]: json.loads(f.split("=")[1])
                                                                   for f in FIELDS}}))
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", str(key_map), "--config", str(config))
    assert ran.code == 0, ran.err
    with torch.no_grad():
        assert torch.allclose(load_folder(out)(ids()).logits, module(ids()), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["base", "diff"])
def test_hf_named_pickles_convert_by_their_config(capsys, tmp_path, kind):
    """Llama and DiffLlama (V1) state dicts under transformers' own names, in a torch file, with
    tied embeddings: the output embedding equals the input one and is dropped."""
    from evalsuite.models.toy import ToySize, random_model

    model = random_model(kind, VOCAB, ToySize(hidden=32, layers=2, heads=4, intermediate=40, max_context=256), seed=2)
    model.eval()
    model.config.save_pretrained(tmp_path / "reference")
    source = tmp_path / "weights.pt"
    torch.save({"model": model.state_dict(), "step": 10}, source)
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--allow-pickle",
                 "--config", str(tmp_path / "reference" / "config.json"))
    assert ran.code == 0, ran.err
    with torch.no_grad():
        assert torch.equal(load_folder(out)(ids()).logits, model(ids()).logits)


def test_the_tokenizer_is_copied(capsys, tmp_path, toy_tokenizer):
    from transformers import AutoTokenizer

    module = standalone()
    state = module.state_dict()
    state["tok_embeddings.weight"] = torch.randn(len(toy_tokenizer), HIDDEN)
    state["output.weight"] = torch.randn(len(toy_tokenizer), HIDDEN)
    toy_tokenizer.save_pretrained(tmp_path / "tok")
    source = save_safetensors(state, tmp_path / "w.safetensors")
    fields = [*FIELDS[:-4], f"vocab_size={len(toy_tokenizer)}", *FIELDS[-3:]]
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", "builtin:diff-v2", "--arch",
                 "diffllama_v2", "--tokenizer", str(tmp_path / "tok"), *[a for f in fields for a in ("-C", f)])
    assert ran.code == 0, ran.err
    text = "The magic number of Paris is 1234567."
    assert AutoTokenizer.from_pretrained(out)(text)["input_ids"] == toy_tokenizer(text)["input_ids"]
    config = json.loads((out / "config.json").read_text())  # generation stops at the tokenizer's eos
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        toy_tokenizer.bos_token_id, toy_tokenizer.eos_token_id, toy_tokenizer.pad_token_id)


# ---- bad input: one line, exit 2, nothing written ------------------------------------------------

def test_a_tokenizer_larger_than_the_vocabulary_is_refused(capsys, tmp_path, toy_tokenizer):
    toy_tokenizer.save_pretrained(tmp_path / "tok")
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", "--tokenizer", str(tmp_path / "tok"), *[a for f in FIELDS for a in ("-C", f)])
    assert ran.code == 2 and f"more than the config's vocab_size {VOCAB}" in ran.err, ran.err
    assert not (tmp_path / "o").exists()


def test_a_damaged_safetensors_file_is_one_line(capsys, tmp_path):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    source.write_bytes(source.read_bytes()[:200])
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in FIELDS for a in ("-C", f)])
    assert ran.code == 2 and "could not read" in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err
    assert not (tmp_path / "o").exists()


def broken(state: dict, how: str) -> dict:
    state = dict(state)
    if how == "missing":
        del state["layers.1.attn.lambda_proj.weight"]
    elif how == "extra":
        state["layers.0.attn.gate.weight"] = torch.zeros(4)
    elif how == "misshapen":
        state["layers.0.attn.lambda_proj.weight"] = torch.zeros(HEADS + 1, HIDDEN)
    return state


@pytest.mark.parametrize("how, words", [
    ("missing", "missing tensor model.layers.1.self_attn.lambda_proj.weight"),
    ("extra", "unexpected tensor layers.0.attn.gate.weight"),
    ("misshapen", "tensor layers.0.attn.lambda_proj.weight (as model.layers.0.self_attn.lambda_proj.weight) is [5, 32]"),
])
def test_a_wrong_tensor_is_named_and_nothing_is_written(capsys, tmp_path, how, words):
    source = save_safetensors(broken(standalone().state_dict(), how), tmp_path / "w.safetensors")
    out = tmp_path / "converted"
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in FIELDS for a in ("-C", f)])
    assert ran.code == 2 and words in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_a_config_that_disagrees_with_the_weights_names_the_tensor(capsys, tmp_path):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    fields = [f for f in FIELDS if not f.startswith("num_key_value_heads")] + ["num_key_value_heads=4"]
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in fields for a in ("-C", f)])
    assert ran.code == 2 and "layers.0.attn.k_proj.weight" in ran.err and "[32, 32]" in ran.err, ran.err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("layers", ["100000000", "3"])
def test_a_declared_layer_count_the_weights_cannot_fill_is_refused_at_once(capsys, tmp_path, layers):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    fields = [f for f in FIELDS if not f.startswith("num_hidden_layers")] + [f"num_hidden_layers={layers}"]
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in fields for a in ("-C", f)])
    assert ran.code == 2 and len(ran.err.strip().splitlines()) == 1, ran.err
    assert f"num_hidden_layers={layers}, but the state dict's layers are {LAYERS} (model.layers.0 to 1)" in ran.err
    assert not (tmp_path / "o").exists()


def test_a_pickle_needs_allow_pickle(capsys, tmp_path):
    source = tmp_path / "w.pt"
    torch.save(standalone().state_dict(), source)
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in FIELDS for a in ("-C", f)])
    assert ran.code == 2 and "--allow-pickle" in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, words", [
    (["--arch", "diffllama_v2", "-C", "hidden_sise=32"], "'hidden_sise'"),
    (["--arch", "llama", "--key-map", "builtin:diff-v2"], "rope_interleaved"),
    (["--arch", "diffllama_v2", "--key-map", "builtin:diff-v3"], "unknown built-in key map 'diff-v3'"),
    (["-C", "hidden_size=32"], "give --arch"),
    (["--arch", "diffllama_v2", "-C", "num_attention_heads=3", "-C", "num_key_value_heads=4"], "num_key_value_heads"),
])
def test_a_bad_config_or_map_is_one_line(capsys, tmp_path, args, words):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), *args)
    assert ran.code == 2 and words in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err
    assert not (tmp_path / "o").exists()


def test_an_invalid_key_map_is_one_line(capsys, tmp_path):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    key_map = tmp_path / "map.toml"
    key_map.write_text("[rename]\n'layers\\.(\\d+' = 'x'\n")
    ran = invoke(capsys, "convert", str(source), "--out", str(tmp_path / "o"), "--key-map", str(key_map),
                 "--arch", "diffllama_v2")
    assert ran.code == 2 and "is not a regular expression" in ran.err and len(ran.err.strip().splitlines()) == 1


def test_an_existing_folder_is_not_overwritten(capsys, tmp_path):
    source = save_safetensors(standalone().state_dict(), tmp_path / "w.safetensors")
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    ran = invoke(capsys, "convert", str(source), "--out", str(out), "--key-map", "builtin:diff-v2",
                 "--arch", "diffllama_v2", *[a for f in FIELDS for a in ("-C", f)])
    assert ran.code == 2 and "not an empty folder" in ran.err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
