"""Loading a transformers checkpoint: the `-M` options, the device, weight quantization, and
the model and tokenizer themselves (where the checkpoint is: `backends.common.checkpoint`).

`check_checkpoint` is everything that can refuse a checkpoint before its weights are read:
the options, the files, the context length in config.json, and each tensor's shape in the
safetensors headers against the shape config.json gives it (a model built on the meta device,
which holds no memory), so a wrong `hidden_size` is named instead of transformers' "look at
the above report"."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from evalsuite.backends.common.checkpoint import locate, read_config, refuse_pickle, safetensors_shapes
from evalsuite.errors import UserError, first_line

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LOAD_IN = ("none", "8bit", "4bit")


@dataclasses.dataclass(frozen=True)
class HFOptions:
    """Backend options, set with `-M key=value`."""

    name = "hf model"
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    attn_implementation: str = "sdpa"
    chat_template: bool = False
    trust_remote_code: bool = False
    max_context: int = 0  # 0: the model config's max_position_embeddings
    max_batch_tokens: int = 32768  # padded tokens per forward pass, caps --batch-size for long prompts
    prefill_chunk: int = 1024  # padded rows are prefilled this many columns at a time (linear mask memory)
    prefix_cache: bool = True  # encode a shared prefix once and reuse its KV cache (same results)
    continuous_batching: bool = True  # finished rows leave a generation batch and waiting requests join it
    compile: bool = False  # CUDA: decode steps over a static KV cache, compiled into CUDA graphs
    attn_quant: str = "none"  # none | absmax:<bits>: quantize the pre-softmax attention logits (evalsuite.backends.hf.quant)
    attn_quant_granularity: str = "tensor"  # tensor | head | row: what one absmax scale covers
    load_in: str = "none"  # none | 8bit | 4bit: bitsandbytes weight quantization (CUDA only)
    allow_pickle: bool = False  # load pickle (.bin/.pt) weights: only for checkpoints you trust
    diff_attention: str = "one_pass"  # one_pass | transformers: DiffLlama attention (evalsuite.backends.hf.diff_attention)

    def __post_init__(self) -> None:
        from .quant import check_granularity, parse_attn_quant

        parse_attn_quant(self.attn_quant)
        check_granularity(self.attn_quant_granularity)
        if self.load_in not in _LOAD_IN:
            raise ValueError(f"-M load_in must be one of {', '.join(_LOAD_IN)}, got {self.load_in!r}")
        if self.diff_attention not in ("one_pass", "transformers"):
            raise ValueError(f"-M diff_attention must be one_pass or transformers, got {self.diff_attention!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"-M dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2", "flex_attention"):
            raise ValueError(f"-M attn_implementation {self.attn_implementation!r} is not supported")
        if self.max_context < 0 or self.max_batch_tokens <= 0 or self.prefill_chunk <= 0:
            raise ValueError("-M max_context must be >= 0, -M max_batch_tokens and -M prefill_chunk > 0")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device} requested but no CUDA device is available")
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:N") from None


def weight_quantization(load_in: str, device: torch.device) -> dict[str, Any]:
    """from_pretrained arguments for -M load_in=8bit|4bit (bitsandbytes, CUDA only)."""
    if load_in == "none":
        return {}
    from importlib.util import find_spec

    if device.type != "cuda":
        raise UserError(f"-M load_in={load_in} needs a CUDA device (bitsandbytes); this run is on {device.type}")
    if find_spec("bitsandbytes") is None:
        raise UserError(f"-M load_in={load_in} needs the bitsandbytes package: pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_8bit=True) if load_in == "8bit" else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": config, "device_map": {"": device}}


def apply_attn_quant(model: Any, options: HFOptions) -> None:
    from .quant import AttnQuant, enable, parse_attn_quant

    quant = AttnQuant(parse_attn_quant(options.attn_quant), options.attn_quant_granularity)
    if quant.active:
        enable(model, quant)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint as loaded: the transformers model and tokenizer, and where they came from."""

    model: Any
    tokenizer: Any
    source: dict[str, Any]  # label, spec, path, gguf_file


def check_checkpoint(spec: str, raw_options: Mapping[str, str], gguf: bool) -> None:
    """What `load_checkpoint` would refuse with these `-M` options, found without reading the weights."""
    from evalsuite.params import build_params

    checked(spec, build_params(HFOptions, dict(raw_options), flag="-M"), gguf)


def checked(spec: str, options: HFOptions, gguf: bool) -> tuple[str, str | None]:
    """(folder or hub id, gguf file) of a checkpoint whose files, context length and tensor shapes
    can load (a hub id's files are checked by transformers as they arrive)."""
    folder, gguf_file = locate(spec, gguf)
    if gguf_file or not Path(folder).is_dir():
        return folder, gguf_file
    refuse_pickle(folder, options.allow_pickle)
    config = read_config(Path(folder), spec)
    context = config.get("max_position_embeddings")
    valid = isinstance(context, int) and not isinstance(context, bool) and context > 0
    if context is not None and not valid and not options.max_context:
        raise UserError(f"could not load {spec}: config.json's max_position_embeddings is {context!r}, not a "
                        "context length; correct it, or give -M max_context=TOKENS")
    if "quantization_config" not in config:  # packed quantized weights have other shapes by design
        check_shapes(spec, folder, config, options)
    return folder, None


def check_shapes(spec: str, folder: str, config: Mapping[str, Any], options: HFOptions) -> None:
    """Each tensor of the safetensors files against the shape the model that config.json describes
    gives it; a mismatch is one line naming the first tensor and the config.json entries that
    would explain it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import evalsuite.modeling.diffllama_v2  # noqa: F401  (registers `diffllama_v2` with the Auto classes)
    import evalsuite.modeling.motif  # noqa: F401  (registers `Motif` with the Auto classes)
    import evalsuite.modeling.phi4flash  # noqa: F401  (registers `phi4flash` with the Auto classes)

    stored = safetensors_shapes(Path(folder), spec)
    if not stored:
        return
    try:
        model_config = AutoConfig.from_pretrained(folder, trust_remote_code=options.trust_remote_code)
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError... for a config it cannot read
        # a config class's own validation (huggingface_hub's strict dataclasses) says why on its second
        # line and keeps the validator's error as the cause: that error is the one line worth showing
        cause = exc.__cause__ if type(exc).__name__ == "StrictDataclassClassValidationError" else None
        raise UserError(f"could not load {spec}: config.json: {first_line(cause or exc)}") from None
    try:
        with torch.device("meta"):  # shapes only: no memory is allocated
            model = AutoModelForCausalLM.from_config(model_config, trust_remote_code=options.trust_remote_code)
    except Exception:  # an architecture that cannot be built on the meta device: the load itself will tell
        return
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    wrong = [name for name in stored if name in expected and stored[name] != expected[name]]
    if wrong:
        first = wrong[0]
        raise UserError(f"could not load {spec}: config.json does not match the weights: {first} is "
                        f"{list(stored[first])} in the weights but {list(expected[first])} by config.json"
                        f"{_suspects(config, stored[first], expected[first])}; {len(wrong)} of {len(stored)} "
                        "tensors differ")


def _suspects(config: Mapping[str, Any], stored: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """The config.json entries whose value is a size the config gives and the weights do not have."""
    if len(stored) != len(expected):
        return ""
    sizes = {e: s for s, e in zip(stored, expected) if s != e}
    names = [f"{key} = {value}, the weights {sizes[value]}" for key, value in config.items()
             if isinstance(value, int) and not isinstance(value, bool) and value in sizes]
    return f" (config.json says {'; '.join(names)})" if names else ""


def load_checkpoint(spec: str, options: HFOptions, device: str, gguf: bool, label: str | None) -> Loaded:
    """The model (on its device, in eval mode, attention quantization applied) and tokenizer of
    a folder, hub id or GGUF file; every load failure is one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    import evalsuite.modeling.diffllama_v2  # noqa: F401  (registers `diffllama_v2` with the Auto classes)
    import evalsuite.modeling.motif  # noqa: F401  (registers `Motif` with the Auto classes)
    import evalsuite.modeling.phi4flash  # noqa: F401  (registers `phi4flash` with the Auto classes)

    hf_logging.disable_progress_bar()  # our own progress bar is the one that matters
    folder, gguf_file = checked(spec, options, gguf)
    torch_device = resolve_device(device)
    dtype = DTYPES.get(options.dtype) or (torch.bfloat16 if torch_device.type == "cuda" else torch.float32)
    kwargs: dict[str, Any] = {"trust_remote_code": options.trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    weights = weight_quantization(options.load_in, torch_device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, attn_implementation=options.attn_implementation, **kwargs, **weights
        )
    except Exception as exc:  # safetensors, gguf, tokenizers... each has its own error types for a bad file
        why = first_line(exc)
        if "look at the above report" in why:  # transformers' words for tensors that do not fit the config
            why = "the weights' tensors do not match the model config.json describes (names or shapes)"
        raise UserError(f"could not load {spec}: {why}") from None
    if options.load_in == "none":  # bitsandbytes models are placed at load and cannot be moved
        model.to(torch_device)
    model.eval()
    from .diff_attention import install

    install(model, options.diff_attention)  # DiffLlama layers: one attention call per map
    apply_attn_quant(model, options)
    name = label or (Path(gguf_file).stem if gguf_file else Path(folder).name)
    return Loaded(model, tokenizer, {"label": name, "spec": spec, "path": folder, "gguf_file": gguf_file})
