"""`builtin:archscale-diff`: DIFF V1 trained with lit-gpt style code (microsoft/ArchScale) -> DiffLlama.

ArchScale's differential attention (`lit_gpt/diff_attn.py`) is DIFF V1 written for
flash attention, with its own layout of the same equations:

- striped heads: query head pairs are adjacent heads (2i, 2i + 1), and so are key and
  value heads; the first of a pair attends with the even key heads, the second with the
  odd ones, and each reads the values of KV heads 2g and 2g + 1 side by side (width 2d);
- lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init(layer),
  with one set of four vectors of width d per layer (the paper's re-parameterisation);
- the difference goes through an RMSNorm of width 2d *with* a learned weight (`subln`),
  then is scaled by (1 - lambda_init); pair i's 2d outputs sit side by side before `proj`.

transformers' DiffLlama computes the same thing with the pairs in halves (query head i
pairs with head i + H/2, KV head g's values with those of KV head g + H_kv/2) and an RMSNorm
without a weight. So the conversion reorders the query, key and value heads of every
layer from striped (evens, odds interleaved) to halves (evens first, then odds), folds the
`subln` weight into the columns of `o_proj` (the norm's output is only scaled, then
projected, so diag(w) moves into the projection exactly) and splits the fused SwiGLU input
`w1` into `gate_proj` and `up_proj` (ArchScale's `w1(x).chunk(2)`: gate first). A fused
`attn.attn` projection (`separate_qkv = false`: per KV group, its query heads, then one key
and one value head) is split too. The lambda vectors keep their names, and DiffLlama's
lambda_init(layer) is the same function of the layer index; a model trained with
`da_const_lamb` (a constant lambda_init) or partial rotary cannot be represented.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from evalsuite.errors import UserError

# the source names (lit-gpt's GPT: transformer.wte / h.{i} / ln_f, lm_head) to DiffLlama's; names
# under `pending.` are intermediate and finished by `transform` below
KEY_MAP = r"""
[rename]
'transformer\.wte\.weight' = 'model.embed_tokens.weight'
'transformer\.h\.(\d+)\.norm_1\.weight' = 'model.layers.\1.input_layernorm.weight'
'transformer\.h\.(\d+)\.attn\.(q|k|v)_proj\.weight' = 'pending.\1.\2_proj'
'transformer\.h\.(\d+)\.attn\.attn\.weight' = 'pending.\1.qkv'
'transformer\.h\.(\d+)\.attn\.proj\.weight' = 'pending.\1.o_proj'
'transformer\.h\.(\d+)\.attn\.da\.subln\.weight' = 'pending.\1.subln'
'transformer\.h\.(\d+)\.attn\.da\.lambda_(q1|k1|q2|k2)' = 'model.layers.\1.self_attn.lambda_\2'
'transformer\.h\.(\d+)\.norm_2\.weight' = 'model.layers.\1.post_attention_layernorm.weight'
'transformer\.h\.(\d+)\.mlp\.w1\.weight' = 'pending.\1.w1'
'transformer\.h\.(\d+)\.mlp\.w3\.weight' = 'model.layers.\1.mlp.down_proj.weight'
'transformer\.ln_f\.weight' = 'model.norm.weight'
'lm_head\.weight' = 'lm_head.weight'

[config]
rms_norm_eps = 1e-5  # ArchScale's norm_eps and its subln's eps (DiffLlama uses one eps for both)
"""

Tensors = dict[str, Any]
Sources = dict[str, str]


def _size(config: Any, name: str) -> int:
    """The config's field `name`, which must be a positive whole number (a bool is not one)."""
    value = getattr(config, name, None)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"archscale-diff: the config's {name} is {value!r}; a positive whole number is needed")
    return value


@dataclass(frozen=True)
class Layout:
    """The sizes the config gives every ArchScale layer, each a positive whole number. They are
    checked, and every tensor against them, before anything is reshaped: a reshape to sizes the
    weights cannot fill is a torch error, and a huge head count would make `repeat` allocate for it."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, config: Any) -> Layout:
        heads, kv_heads = _size(config, "num_attention_heads"), _size(config, "num_key_value_heads")
        hidden, intermediate = _size(config, "hidden_size"), _size(config, "intermediate_size")
        for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
            if count % 2:
                raise UserError(f"archscale-diff: {name}={count} cannot form head pairs (an even number is needed)")
        if heads % kv_heads:
            raise UserError(f"archscale-diff: num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={kv_heads}")
        head_dim = _size(config, "head_dim") if getattr(config, "head_dim", None) is not None else hidden // heads
        if head_dim <= 0:
            raise UserError(f"archscale-diff: hidden_size={hidden} leaves no head_dim for {heads} heads; "
                            "set -C head_dim")
        return cls(heads, kv_heads, head_dim, hidden, intermediate)

    def source_shape(self, part: str) -> tuple[tuple[int, ...], str]:
        """The shape ArchScale gives a layer's pending tensor `part`, and the config fields it comes from."""
        heads, kv, d, hidden = self.heads, self.kv_heads, self.head_dim, self.hidden
        return {"q_proj": ((heads * d, hidden), "num_attention_heads x head_dim, hidden_size"),
                "k_proj": ((kv * d, hidden), "num_key_value_heads x head_dim, hidden_size"),
                "v_proj": ((kv * d, hidden), "num_key_value_heads x head_dim, hidden_size"),
                "qkv": (((heads + 2 * kv) * d, hidden),
                        "(num_attention_heads + 2 x num_key_value_heads) x head_dim, hidden_size"),
                "o_proj": ((hidden, heads * d), "hidden_size, num_attention_heads x head_dim"),
                "subln": ((2 * d,), "2 x head_dim"),
                "w1": ((2 * self.intermediate, hidden), "2 x intermediate_size, hidden_size")}[part]


def striped_to_halves(weight: Any, heads: int, head_dim: int) -> Any:
    """Rows of a projection for `heads` heads of width `head_dim`: heads (0, 1, 2, 3, ...) become
    (0, 2, 4, ..., 1, 3, 5, ...), so pair (2i, 2i + 1) becomes (i, i + heads / 2)."""
    blocks = weight.reshape(heads, head_dim, *weight.shape[1:])
    return blocks[list(range(0, heads, 2)) + list(range(1, heads, 2))].reshape(weight.shape)


def _split_qkv(fused: Any, layout: Layout) -> tuple[Any, Any, Any]:
    """ArchScale's fused projection: per KV group, its query heads, then one key and one value head."""
    heads, kv_heads, head_dim = layout.heads, layout.kv_heads, layout.head_dim
    per_group = heads // kv_heads
    grouped = fused.reshape(kv_heads, per_group + 2, head_dim, fused.shape[-1])
    q = grouped[:, :per_group].reshape(heads * head_dim, -1)
    return q, grouped[:, per_group].reshape(kv_heads * head_dim, -1), grouped[:, per_group + 1].reshape(
        kv_heads * head_dim, -1)


def check_parts(layer: str, parts: Mapping[str, Any]) -> None:
    """One line when `layer` lacks a pending tensor or holds both the fused and the separate projections."""
    separate = [f"{x}_proj" for x in "qkv" if f"{x}_proj" in parts]
    if "qkv" in parts and separate:
        raise UserError(f"archscale-diff: layer {layer} has both the fused attn.attn and {separate[0]}; keep one")
    missing = [name for name in ("o_proj", "subln", "w1") if name not in parts]
    if "qkv" not in parts and len(separate) < 3:
        missing.append("q_proj/k_proj/v_proj (or the fused attn.attn)")
    if missing:
        raise UserError(f"archscale-diff: layer {layer} has no {missing[0]} tensor")


def check_shapes(parts: Mapping[str, Any], sources: Mapping[str, str], layout: Layout) -> None:
    """One line for the first pending tensor whose shape is not the one the config gives it."""
    for part, tensor in parts.items():
        shape, basis = layout.source_shape(part)
        if tuple(tensor.shape) != shape:
            raise UserError(f"archscale-diff: {sources[part]} is {list(tensor.shape)}, but the config gives it "
                            f"{list(shape)} ({basis})")


def _layer(layer: str, parts: Mapping[str, Any], layout: Layout) -> Tensors:
    """One layer's pending tensors (already checked) in DiffLlama's names and layout."""
    heads, kv_heads, head_dim = layout.heads, layout.kv_heads, layout.head_dim
    if "qkv" in parts:
        q, k, v = _split_qkv(parts["qkv"], layout)
    else:
        q, k, v = parts["q_proj"], parts["k_proj"], parts["v_proj"]
    prefix = f"model.layers.{layer}"
    gate, up = parts["w1"].chunk(2, dim=0)
    subln = parts["subln"]
    # o_proj(w * norm(x)) = (o_proj * w) norm(x): the same 2d weight for every pair, along the columns
    o_proj = parts["o_proj"] * subln.to(parts["o_proj"].dtype).repeat(heads // 2)[None, :]
    return {f"{prefix}.self_attn.q_proj.weight": striped_to_halves(q, heads, head_dim),
            f"{prefix}.self_attn.k_proj.weight": striped_to_halves(k, kv_heads, head_dim),
            f"{prefix}.self_attn.v_proj.weight": striped_to_halves(v, kv_heads, head_dim),
            f"{prefix}.self_attn.o_proj.weight": o_proj.contiguous(),
            f"{prefix}.mlp.gate_proj.weight": gate.contiguous(), f"{prefix}.mlp.up_proj.weight": up.contiguous()}


def transform(tensors: Tensors, source_of: Sources, config: Any) -> tuple[Tensors, Sources]:
    """The renamed state dict with every `pending.` tensor turned into DiffLlama's."""
    if config.model_type != "diffllama":
        raise UserError(f"key map builtin:archscale-diff converts to --arch diffllama, not {config.model_type}")
    kept = {name: t for name, t in tensors.items() if not name.startswith("pending.")}
    sources = {name: source_of[name] for name in kept}
    by_layer: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        if name.startswith("pending."):
            _, layer, part = name.split(".", 2)
            by_layer.setdefault(layer, {})[part] = tensor
    for layer, parts in by_layer.items():  # every layer is checked before any is reshaped
        check_parts(layer, parts)
    layout = Layout.of(config)
    for layer, parts in by_layer.items():
        check_shapes(parts, {part: source_of[f"pending.{layer}.{part}"] for part in parts}, layout)
    for layer, parts in by_layer.items():
        for name, tensor in _layer(layer, parts, layout).items():
            kept[name] = tensor
            sources[name] = source_of[f"pending.{layer}.{_source_part(name, parts)}"]
    return kept, sources


def _source_part(name: str, parts: Mapping[str, Any]) -> str:
    """The pending tensor a converted one came from, for error messages."""
    for suffix, part in (("q_proj.weight", "q_proj"), ("k_proj.weight", "k_proj"), ("v_proj.weight", "v_proj")):
        if name.endswith(suffix):
            return part if part in parts else "qkv"
    return "o_proj" if name.endswith("o_proj.weight") else "w1"


TRANSFORMS: dict[str, Callable[[Tensors, Sources, Any], tuple[Tensors, Sources]]] = {"archscale-diff": transform}
