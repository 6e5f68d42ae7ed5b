"""A plain state dict (safetensors, or a trusted torch pickle) -> a loadable transformers folder.

`convert` renames the tensors with a key map (regular expressions, from a small TOML file or
built in), builds the config of a DiffLlama (DIFF V1), DiffLlamaV2 or Llama model, checks every
tensor against the shape that config gives it (the model built on the meta device, which holds
no memory), and only then writes config.json, model.safetensors and, if given, the tokenizer.
Every refusal is one line naming the tensor or field at fault, and leaves nothing behind.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, did_you_mean, first_line, unknown

from .convert_archscale import KEY_MAP as ARCHSCALE_KEY_MAP
from .convert_archscale import TRANSFORMS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ARCHITECTURES = ("diffllama_v2", "diffllama", "llama")

# `diff-v2`: a standalone DIFF V2 model. Only the attention's names (q_proj, k_proj, v_proj, o_proj,
# lambda_proj) are the public DIFF V2 module's, which is attention only; the names beyond it
# (embeddings, norms, MLP, output, rotary) are evalsuite's choice (docs/diff-v2.md lists the layout;
# another layout gives its own TOML map). `archscale-diff`: DIFF V1 from lit-gpt/ArchScale state
# dicts, renamed here and then reshaped by its transform (convert_archscale.py). Rules are tried in
# order; the first whose pattern matches a whole name renames it; "" drops the tensor.
BUILTIN_KEY_MAPS = {
    "archscale-diff": ARCHSCALE_KEY_MAP,
    "diff-v2": r"""
[rename]
'tok_embeddings\.weight' = 'model.embed_tokens.weight'
'layers\.(\d+)\.attn_norm\.weight' = 'model.layers.\1.input_layernorm.weight'
'layers\.(\d+)\.attn\.(q|k|v|o|lambda)_proj\.(weight|bias)' = 'model.layers.\1.self_attn.\2_proj.\3'
'layers\.(\d+)\.ffn_norm\.weight' = 'model.layers.\1.post_attention_layernorm.weight'
'layers\.(\d+)\.ffn\.(gate|up|down)_proj\.weight' = 'model.layers.\1.mlp.\2_proj.weight'
'norm\.weight' = 'model.norm.weight'
'output\.weight' = 'lm_head.weight'
'(.+\.)?rotary\.inv_freq' = ''

[config]
rope_interleaved = true  # the public module rotates adjacent pairs (GPT-J style)
""",
}


@dataclass(frozen=True)
class KeyMap:
    """Ordered (pattern, replacement) rules and the config fields the source layout implies."""

    rules: tuple[tuple[re.Pattern[str], str], ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    name: str = "no key map"
    transform: Callable[..., tuple[dict[str, Any], dict[str, str]]] | None = None  # reshapes after renaming

    def target(self, key: str) -> str:
        """The transformers name of source tensor `key` ("" when a rule drops it); a name no
        rule matches is kept, so a map lists only the names that differ."""
        for pattern, replacement in self.rules:
            match = pattern.fullmatch(key)
            if match:
                try:
                    return match.expand(replacement)
                except (re.error, IndexError) as exc:
                    raise UserError(f"key map {self.name}: replacement {replacement!r} for {key!r}: {exc}") from None
        return key


def load_key_map(spec: str | None) -> KeyMap:
    """`builtin:NAME`, a TOML file with a [rename] table (and an optional [config] table), or None."""
    if spec is None:
        return KeyMap()
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_KEY_MAPS:
            raise unknown("built-in key map", name, BUILTIN_KEY_MAPS)
        return replace(parse_key_map(BUILTIN_KEY_MAPS[name], spec), transform=TRANSFORMS.get(name))
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"--key-map {spec}: no such file (or give builtin:{', builtin:'.join(BUILTIN_KEY_MAPS)})")
    return parse_key_map(path.read_text(encoding="utf-8"), spec)


def parse_key_map(text: str, name: str) -> KeyMap:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"key map {name} is not valid TOML: {exc}") from None
    extra = sorted(set(raw) - {"rename", "config"})
    rename, config = raw.get("rename", {}), raw.get("config", {})
    if extra or not isinstance(rename, dict) or not isinstance(config, dict):
        raise UserError(f"key map {name} holds a [rename] table (regex = replacement) and an optional [config] "
                        f"table, got {', '.join(extra) or 'a [rename] or [config] that is not a table'}")
    rules = []
    for pattern, replacement in rename.items():
        if not isinstance(replacement, str):
            raise UserError(f"key map {name}: the replacement for {pattern!r} must be a string, got {replacement!r}")
        try:
            rules.append((re.compile(pattern), replacement))
        except re.error as exc:
            raise UserError(f"key map {name}: {pattern!r} is not a regular expression: {exc}") from None
    return KeyMap(tuple(rules), config, name)


def parse_config_value(text: str) -> Any:
    """-C values as JSON where they read as JSON (numbers, true/false, null, lists), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read_source_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--config {path}: {first_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"--config {path} must hold a JSON object of config fields")
    return raw


def architecture(arch: str | None, fields: Mapping[str, Any]) -> str:
    """The model_type: --arch, or config.json's; the two must agree when both are given."""
    given = fields.get("model_type")
    if arch and given and arch != given:
        raise UserError(f"--arch {arch} contradicts --config's model_type {given!r}")
    chosen = arch or given
    if not chosen:
        raise UserError(f"give --arch ({'|'.join(ARCHITECTURES)}) or a --config whose model_type names one")
    if chosen not in ARCHITECTURES:
        raise unknown("architecture", str(chosen), ARCHITECTURES)
    return str(chosen)


def build_config(arch: str, file_fields: Mapping[str, Any], cli_fields: Mapping[str, Any], key_map: KeyMap) -> Any:
    """The transformers config: the key map's [config] fields, then config.json's, then -C's. A
    field named by -C or the key map that the config does not know is refused (transformers would
    keep a misspelt field as a stray attribute); config.json may carry metadata of its own."""
    from transformers import AutoConfig

    import evalsuite.modeling.diffllama_v2  # noqa: F401  (registers `diffllama_v2` with the Auto classes)

    metadata = ("model_type", "architectures")
    merged = {**key_map.config, **{k: v for k, v in file_fields.items() if k not in metadata}, **cli_fields}
    try:
        config = AutoConfig.for_model(arch, **merged)
    except Exception as exc:  # transformers and huggingface_hub raise several types for a bad field value
        raise UserError(f"the {arch} config is not valid: {_reason(exc)}") from None
    known = set(AutoConfig.for_model(arch).to_dict())  # a field the config absorbs (rope_theta) adds no key
    for name in config.to_dict():
        if name not in known and (name in cli_fields or name in key_map.config):
            if name in cli_fields:
                raise UserError(f"-C sets {name!r}, which a {arch} config does not have{did_you_mean(name, known)}")
            raise UserError(f"key map {key_map.name} sets {name!r}, which a {arch} config does not have: "
                            "the map is meant for another architecture")
    return config


def _reason(exc: Exception) -> str:
    """The line that says what is wrong: a validator's error opens with a header line ending in ':'."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if len(lines) > 1 and lines[0].endswith(":") else first_line(exc)


def read_state_dict(path: Path, allow_pickle: bool) -> dict[str, Any]:
    """Tensors by name from a safetensors file, or (with allow_pickle) a torch file holding a
    state dict, directly or under a 'model', 'state_dict' or 'module' entry."""
    if not path.is_file():
        raise UserError(f"state dict {path}: no such file")
    if path.suffix == ".safetensors" or is_safetensors(path):  # by name too: a damaged file is named as such
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path)))
        except Exception as exc:  # safetensors raises its own error types for a damaged file
            raise UserError(f"could not read {path}: {first_line(exc)}") from None
    if not allow_pickle:
        raise UserError(f"{path} is not a safetensors file; a torch (pickle) file can run code when loaded: "
                        "pass --allow-pickle for a file you trust")
    return tensors_of(load_torch_file(path), path)


def is_safetensors(path: Path) -> bool:
    """A safetensors file begins with an 8-byte header length, then the JSON header's '{'."""
    with path.open("rb") as handle:
        head = handle.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size


def load_torch_file(path: Path) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and torch's own errors for a file that is no checkpoint
        raise UserError(f"could not read {path} as a torch file: {first_line(exc)}") from None


def tensors_of(loaded: Any, path: Path) -> dict[str, Any]:
    import torch

    def all_tensors(value: Any) -> bool:
        return isinstance(value, dict) and bool(value) and all(isinstance(t, torch.Tensor) for t in value.values())

    if all_tensors(loaded):
        return dict(loaded)
    for entry in ("model", "state_dict", "module"):
        if isinstance(loaded, dict) and all_tensors(loaded.get(entry)):
            return dict(loaded[entry])
    what = f"a dict of {', '.join(sorted(map(str, loaded))[:5])}" if isinstance(loaded, dict) else type(loaded).__name__
    raise UserError(f"{path} holds {what}, not a state dict of tensors")


def rename(tensors: Mapping[str, Any], key_map: KeyMap) -> tuple[dict[str, Any], dict[str, str]]:
    """(tensors under their new names, new name -> source name); two sources onto one name refused."""
    renamed: dict[str, Any] = {}
    source_of: dict[str, str] = {}
    for key, tensor in tensors.items():
        target = key_map.target(key)
        if not target:
            continue
        if target in renamed:
            raise UserError(f"key map {key_map.name} maps both {source_of[target]!r} and {key!r} to {target!r}")
        renamed[target], source_of[target] = tensor, key
    return renamed, source_of


@dataclass(frozen=True)
class Blueprint:
    """What the model a config describes holds, read from it built on the meta device."""

    shapes: dict[str, tuple[int, ...]]  # each tensor's shape, by name
    tied: dict[str, str]  # tied name -> the name whose tensor it shares
    architecture: str  # the model class, as config.json's `architectures` names it


def blueprint(config: Any) -> Blueprint:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):  # shapes only: no memory is allocated
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # a field combination the model cannot be built from
        raise UserError(f"cannot build a {config.model_type} model from this config: {first_line(exc)}") from None
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    tied = getattr(model, "all_tied_weights_keys", None)
    if tied is None:  # older transformers: only the output embedding is tied, to the input embedding
        tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}
    return Blueprint(shapes, dict(tied), type(model).__name__)


def check_layer_count(config: Any, tensors: Mapping[str, Any]) -> None:
    """The config's num_hidden_layers against the layers the (renamed) state dict holds: a declared
    size that the weights cannot fill is refused at once, not after building it layer by layer."""
    found = {int(m.group(1)) for name in tensors if (m := re.match(r"model\.layers\.(\d+)\.", name))}
    declared = config.num_hidden_layers
    if declared != len(found):
        held = f"{len(found)} (model.layers.0 to {max(found)})" if found else "none (no model.layers.N tensor)"
        raise UserError(f"the config gives num_hidden_layers={declared}, but the state dict's layers are {held}; "
                        "fix --config or -C num_hidden_layers, or the key map")


def check_tensors(tensors: dict[str, Any], source_of: Mapping[str, str], model: Blueprint, arch: str) -> dict[str, Any]:
    """The tensors to write, each with the shape the config gives it: one line for the first
    missing, unexpected or misshapen tensor. A tied tensor (the output embedding of a model with
    tie_word_embeddings) is dropped when it equals the tensor it is tied to."""
    shapes, tied = model.shapes, model.tied
    for name, shared in tied.items():
        if name in tensors and shared in tensors:
            if tensors[name].shape != tensors[shared].shape or not bool((tensors[name] == tensors[shared]).all()):
                raise UserError(f"{_named(name, source_of)} differs from {_named(shared, source_of)}, but the config "
                                "ties them (tie_word_embeddings): set -C tie_word_embeddings=false")
            tensors = {k: v for k, v in tensors.items() if k != name}
    wanted = {name: shape for name, shape in shapes.items() if name not in tied}
    missing = [name for name in wanted if name not in tensors]
    extra = [name for name in tensors if name not in shapes]
    problems = []
    if missing:
        problems.append(f"missing tensor {missing[0]}: no tensor of the state dict maps to it "
                        f"({len(missing)} of {len(wanted)} missing)")
    if extra:
        problems.append(f"unexpected tensor {_named(extra[0], source_of)}: a {arch} model has no such "
                        f"parameter ({len(extra)} unexpected; rename it with --key-map, or map it to '' to drop it)")
    if problems:
        raise UserError("; ".join(problems))
    for name, shape in wanted.items():
        if tuple(tensors[name].shape) != shape:
            raise UserError(f"tensor {_named(name, source_of)} is {list(tensors[name].shape)}, but the config gives "
                            f"{name} the shape {list(shape)}")
    return tensors


def _named(name: str, source_of: Mapping[str, str]) -> str:
    source = source_of.get(name, name)
    return name if source == name else f"{source} (as {name})"


@dataclass(frozen=True)
class Converted:
    folder: Path
    model_type: str
    tensors: int
    parameters: int


def convert(state_dict: Path, out: Path, *, key_map: str | None = None, config_file: Path | None = None,
            arch: str | None = None, fields: Mapping[str, str] | None = None, tokenizer: Path | None = None,
            allow_pickle: bool = False) -> Converted:
    """Write a loadable transformers folder at `out` from a state dict, a key map and a config
    (`fields` are -C key=value texts, over config.json's); nothing is written unless every tensor fits."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; choose another")
    mapping = load_key_map(key_map)
    from_file = read_source_config(config_file)
    from_cli = {key: parse_config_value(value) for key, value in (fields or {}).items()}
    config = build_config(architecture(arch, {**from_file, **from_cli}), from_file, from_cli, mapping)
    tensors, source_of = rename(read_state_dict(state_dict, allow_pickle), mapping)
    if mapping.transform is not None:  # a layout that renaming alone cannot express (convert_archscale.py)
        tensors, source_of = mapping.transform(tensors, source_of, config)
    check_layer_count(config, tensors)  # before the blueprint, which builds every layer the config declares
    model = blueprint(config)
    tensors = check_tensors(tensors, source_of, model, config.model_type)
    config.architectures = [model.architecture]
    tok = load_tokenizer(tokenizer, config.vocab_size) if tokenizer else None
    if tok is not None:
        take_special_tokens(config, tok, given={**from_file, **from_cli})
    write_folder(out, config, tensors, tok)
    return Converted(out, config.model_type, len(tensors), sum(t.numel() for t in tensors.values()))


def load_tokenizer(folder: Path, vocab_size: int) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # tokenizers and transformers raise many types for a folder without a tokenizer
        raise UserError(f"--tokenizer {folder}: {first_line(exc)}") from None
    if len(tok) > vocab_size:
        raise UserError(f"--tokenizer {folder} has {len(tok)} tokens, more than the config's vocab_size {vocab_size}")
    return tok


def take_special_tokens(config: Any, tokenizer: Any, given: Mapping[str, Any]) -> None:
    """The tokenizer's bos, eos and pad ids into the config (generation stops at its eos), unless
    --config or -C set them."""
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token_id = getattr(tokenizer, name, None)
        if name not in given and token_id is not None:
            setattr(config, name, token_id)


def write_folder(out: Path, config: Any, tensors: Mapping[str, Any], tokenizer: Any) -> None:
    """Everything goes to a temporary folder beside `out`, renamed into place when complete, so an
    interrupted write leaves no half folder."""
    from safetensors.torch import save_file

    floating = [t.dtype for t in tensors.values() if t.is_floating_point()]
    if floating:
        config.dtype = floating[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        config.save_pretrained(staging)
        # contiguous copies: safetensors refuses views and tensors that share memory
        save_file({name: t.contiguous().clone() for name, t in tensors.items()}, str(staging / "model.safetensors"),
                  metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
