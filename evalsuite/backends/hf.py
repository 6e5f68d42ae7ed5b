"""The `hf` backend: any transformers causal LM (Llama, DiffLlama, GGUF files...).

Generation is our own greedy loop rather than `model.generate`: prefill asks
for the last position's logits only, requests are batched longest first with
left padding, and each row stops at its own stop string, so a batch costs as
many decode steps as its longest answer, not `max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..adapter import GenerationRequest, Loglikelihood, LoglikelihoodRequest
from ..errors import UserError
from ..params import build_params

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HASH_LIMIT = 512 * 1024 * 1024  # weights larger than this are fingerprinted by size and mtime
_LOAD_IN = ("none", "8bit", "4bit")


@dataclass(frozen=True)
class HFOptions:
    """Backend options, set with `-M key=value`."""

    name = "hf model"
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    attn_implementation: str = "sdpa"
    chat_template: bool = False
    trust_remote_code: bool = False
    max_context: int = 0  # 0: the model config's max_position_embeddings
    max_batch_tokens: int = 32768  # padded tokens per forward pass, caps --batch-size for long prompts
    attn_quant: str = "none"  # none | absmax:<bits>: quantize the pre-softmax attention logits (evalsuite.quant)
    attn_quant_granularity: str = "tensor"  # tensor | head | row: what one absmax scale covers
    load_in: str = "none"  # none | 8bit | 4bit: bitsandbytes weight quantization (CUDA only)

    def __post_init__(self) -> None:
        from ..quant import check_granularity, parse_attn_quant

        parse_attn_quant(self.attn_quant)
        check_granularity(self.attn_quant_granularity)
        if self.load_in not in _LOAD_IN:
            raise ValueError(f"-M load_in must be one of {', '.join(_LOAD_IN)}, got {self.load_in!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"-M dtype must be auto or one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2", "flex_attention"):
            raise ValueError(f"-M attn_implementation {self.attn_implementation!r} is not supported")
        if self.max_context < 0 or self.max_batch_tokens <= 0:
            raise ValueError("-M max_context must be >= 0 and -M max_batch_tokens > 0")


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device} requested but no CUDA device is available")
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:N") from None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _weights_fingerprint(files: list[Path]) -> dict[str, Any]:
    total = sum(f.stat().st_size for f in files)
    if total <= _HASH_LIMIT:
        digest = hashlib.sha256()
        for f in sorted(files):
            digest.update(_sha256_file(f).encode())
        return {"weights_sha256": digest.hexdigest(), "weights_bytes": total}
    return {"weights_bytes": total, "weights_mtime": max(int(f.stat().st_mtime) for f in files)}


def _weight_quantization(load_in: str, device: torch.device) -> dict[str, Any]:
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


def _apply_attn_quant(model: Any, options: HFOptions) -> None:
    from ..quant import AttnQuant, enable, parse_attn_quant

    quant = AttnQuant(parse_attn_quant(options.attn_quant), options.attn_quant_granularity)
    if quant.active:
        enable(model, quant)


def _locate(spec: str, gguf: bool) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name) for a spec; clear errors for missing paths."""
    path = Path(spec).expanduser()
    if gguf:
        if not path.is_file():
            raise UserError(f"GGUF file not found: {spec}")
        return str(path.resolve().parent), path.name
    if path.exists():
        if not path.is_dir():
            raise UserError(f"checkpoint {spec} is not a folder")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UserError(f"checkpoint folder {spec} is not readable")
        if not (path / "config.json").is_file():
            raise UserError(f"checkpoint folder {spec} has no config.json")
        return str(path.resolve()), None
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise UserError(f"checkpoint folder not found: {spec}")
    return spec, None


class HFModel:
    """A transformers causal LM behind the model adapter interface."""

    def __init__(self, model: Any, tokenizer: Any, options: HFOptions, source: dict[str, Any], batch_size: int):
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.source = source
        self.batch_size = max(1, batch_size)
        self.device = next(model.parameters()).device
        self.chat_template = options.chat_template
        self.name = source["label"]
        config_max = getattr(model.config, "max_position_embeddings", 0) or 0
        self.max_context = options.max_context or config_max or 2048
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.eos_ids = self._eos_ids()
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise UserError(f"-M chat_template=true but {self.name} has no chat template")

    # ---- loading -------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        spec: str,
        raw_options: dict[str, str],
        *,
        device: str = "auto",
        batch_size: int = 8,
        gguf: bool = False,
        label: str | None = None,
    ) -> HFModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own progress bar is the one that matters
        options = build_params(HFOptions, raw_options, flag="-M")
        folder, gguf_file = _locate(spec, gguf)
        torch_device = _resolve_device(device)
        dtype = _DTYPES.get(options.dtype) or (torch.bfloat16 if torch_device.type == "cuda" else torch.float32)
        kwargs: dict[str, Any] = {"trust_remote_code": options.trust_remote_code}
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
        weights = _weight_quantization(options.load_in, torch_device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation=options.attn_implementation, **kwargs, **weights
            )
        except Exception as exc:  # safetensors, gguf, tokenizers... each has its own error types for a bad file
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"could not load {spec}: {first_line}") from None
        if options.load_in == "none":  # bitsandbytes models are placed at load and cannot be moved
            model.to(torch_device)
        model.eval()
        _apply_attn_quant(model, options)
        name = label or (Path(gguf_file).stem if gguf_file else Path(folder).name)
        source = {"label": name, "spec": spec, "path": folder, "gguf_file": gguf_file}
        return cls(model, tokenizer, options, source, batch_size)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return ids

    def fingerprint(self) -> dict[str, Any]:
        import transformers

        config_json = json.dumps(self.model.config.to_dict(), sort_keys=True, default=str)
        folder = Path(self.source["path"])
        if self.source["gguf_file"]:
            weights = [folder / self.source["gguf_file"]]
        else:
            weights = [p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin", ".pt")] if folder.is_dir() else []
        vocab = json.dumps(self.tokenizer.get_vocab(), sort_keys=True)
        return {
            "backend": "hf",
            "name": self.name,
            "spec": self.source["spec"],
            "path": self.source["path"],
            "gguf_file": self.source["gguf_file"],
            "architecture": type(self.model).__name__,
            "config_sha256": hashlib.sha256(config_json.encode()).hexdigest(),
            "tokenizer_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
            **_weights_fingerprint(weights),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": self.device.type,
            "attn_implementation": self.model.config._attn_implementation,
            "chat_template": self.chat_template,
            "max_context": self.max_context,
            "quantization": self._quantization(),
            "transformers": transformers.__version__,
        }

    def _quantization(self) -> dict[str, Any] | None:
        """What -M attn_quant / load_in changed, as loaded (a -T bits sweep is part of the task)."""
        from ..quant import parse_attn_quant

        out: dict[str, Any] = {}
        if parse_attn_quant(self.options.attn_quant) < 16:
            out["attn_logits"] = self.options.attn_quant
            out["attn_granularity"] = self.options.attn_quant_granularity
        if self.options.load_in != "none":
            out["weights"] = f"bitsandbytes-{self.options.load_in}"
        return out or None

    # ---- tokens --------------------------------------------------------------------------

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids; the tokenizer's special tokens (BOS) only on the first piece of a
        plain prompt. Chat-templated text already carries its own special tokens."""
        specials = first and not self.chat_template
        return self.tokenizer(text, add_special_tokens=specials)["input_ids"]

    def encode_pair(self, prefix: str, text: str) -> list[int]:
        """prefix + text, each piece encoded on its own so that the prefix's ids (and
        its KV cache) are the same for every request that shares it."""
        if not prefix:
            return self.encode(text)
        return self.encode(prefix) + self.encode(text, first=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        if not self.chat_template:
            return user + assistant_prefix
        messages = [{"role": "user", "content": user}]
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return rendered + assistant_prefix

    # ---- batching ------------------------------------------------------------------------

    def _batches(self, lengths: Sequence[int]) -> Iterator[list[int]]:
        """Indices grouped into batches, longest first, under the padded-token budget."""
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        batch: list[int] = []
        for i in order:
            width = lengths[batch[0]] if batch else lengths[i]
            if batch and (len(batch) >= self.batch_size or width * (len(batch) + 1) > self.options.max_batch_tokens):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    # ---- generation ----------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        encoded = [self.encode_pair(r.prefix, r.prompt) for r in requests]
        outputs: list[str] = [""] * len(requests)
        for batch in self._batches([len(e) for e in encoded]):
            texts = self._generate_batch([encoded[i] for i in batch], [requests[i] for i in batch])
            for i, text in zip(batch, texts):
                outputs[i] = text
        return outputs

    @torch.inference_mode()
    def _generate_batch(self, rows: list[list[int]], requests: list[GenerationRequest]) -> list[str]:
        ids, mask = self._left_pad(rows)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        generated: list[list[int]] = [[] for _ in rows]
        texts = [""] * len(rows)
        active = [True] * len(rows)
        max_steps = max(r.max_new_tokens for r in requests)
        next_ids = out.logits[:, -1].argmax(-1)
        for step in range(max_steps):
            for i, token in enumerate(next_ids.tolist()):
                if not active[i]:
                    continue
                generated[i].append(token)
                texts[i], active[i] = self._continue(generated[i], requests[i], token)
            if not any(active) or step == max_steps - 1:
                break
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=next_ids[:, None], attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True,
            )
            cache = out.past_key_values
            next_ids = out.logits[:, -1].argmax(-1)
        return texts

    def _continue(self, tokens: list[int], request: GenerationRequest, last: int) -> tuple[str, bool]:
        """Decoded text so far, cut at the first stop string, and whether to go on."""
        if last in self.eos_ids:
            tokens = tokens[:-1]
            return self.tokenizer.decode(tokens, skip_special_tokens=True), False
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cuts = [text.find(s) for s in request.stop if s and s in text]
        if cuts:
            return text[: min(cuts)], False
        return text, len(tokens) < request.max_new_tokens

    # ---- log-likelihood ------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        pairs = []
        for r in requests:
            context = self.encode_pair(r.prefix, r.context)
            continuation = self.encode(r.continuation, first=False)
            if not continuation:
                raise UserError(f"empty continuation after tokenization: {r.continuation!r}")
            pairs.append((context, continuation))
        results: list[Loglikelihood | None] = [None] * len(requests)
        for batch in self._batches([len(c) + len(k) for c, k in pairs]):
            for i, result in zip(batch, self._loglikelihood_batch([pairs[i] for i in batch])):
                results[i] = result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _loglikelihood_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[Loglikelihood]:
        # Left padding puts every continuation at the end of its row, so the logits we
        # need are the last (longest continuation + 1) positions only.
        ids, mask = self._left_pad([(c + k)[-self.max_context :] for c, k in pairs])
        keep = max(len(k) for _, k in pairs) + 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
        results = []
        for row, (_, cont) in enumerate(pairs):
            n = len(cont)
            row_logits = logits[row, -n - 1 : -1].float().log_softmax(-1)
            target = torch.tensor(cont, device=row_logits.device)
            logprob = row_logits.gather(-1, target[:, None]).sum().item()
            greedy = bool((row_logits.argmax(-1) == target).all())
            results.append(Loglikelihood(logprob=logprob, is_greedy=greedy, tokens=n))
        return results


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(HFOptions)]
