"""The hf adapter: any transformers causal LM (Llama, DiffLlama, GGUF files...).

HFModel is the model adapter put together from parts, each an object of its own that it holds
and hands its calls to:

    tokens          TokenRules (backends.common.tokens): encoding, counting, chat turns, answer ends
    prefix_cache    PrefixCache: requests grouped by shared prefix, one prefix's KV cache
    decoder         Decoder: batching, the greedy decoding loop, log-likelihoods (with shared
                    beginnings, continuous batching, -M compile=true, out-of-memory backoff)
    instruments     Capabilities: quantized attention logits, the activation probe
    attention       AttentionShare: the attention a few query rows pay to spans of the prompt
    nll             TokenNLL: per-token NLL of long windows
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from evalsuite.backends.common.checkpoint import (
    config_content_sha256,
    sha256_json,
    vocabulary_sha256,
    weight_files,
    weights_fingerprint,
)
from evalsuite.backends.common.tokens import TokenRules, eos_ids
from evalsuite.contracts import ActivationObserver
from evalsuite.errors import UserError
from evalsuite.modeling import compat
from evalsuite.params import build_params
from evalsuite.types import AttentionMass, GenerationRequest, Loglikelihood, LoglikelihoodRequest

from .attention_share import AttentionShare
from .capabilities import Capabilities
from .decoding import Decoder
from .loading import HFOptions, load_checkpoint
from .prefix_cache import PrefixCache
from .token_nll import TokenNLL


class HFModel:
    """A transformers causal LM behind the model adapter interface. It offers every capability
but SCRIPTED_ANSWERS (contracts.PROTOCOLS): the members below implement their protocols."""

    def __init__(self, model: Any, tokenizer: Any, options: HFOptions, source: dict[str, Any], batch_size: int):
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.source = source
        self.batch_size = max(1, batch_size)
        self.device = next(model.parameters()).device
        self.chat_template = options.chat_template
        self.name = source["label"]
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise UserError(f"-M chat_template=true but {self.name} has no chat template")
        config_max = getattr(model.config, "max_position_embeddings", 0) or 0
        self.max_context = options.max_context or config_max or 2048
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        generation_config = getattr(model, "generation_config", None)
        self.eos_ids = eos_ids(tokenizer, getattr(generation_config, "eos_token_id", None))
        self.tokens = TokenRules(tokenizer, self.chat_template, self.eos_ids)
        self.prefix_cache = PrefixCache(model, self.tokens, options, self.device, self.max_context)
        self.decoder = Decoder(model, self.tokens, self.prefix_cache, options, self.device, self.batch_size,
                               self.pad_id, self.max_context, self.name)
        self.instruments = Capabilities(model, options, self.device, self.batch_size)
        self.attention = AttentionShare(model, self.tokens, self.device, self.name)
        self.nll = TokenNLL(model, options, self.device)

    @classmethod
    def load(cls, spec: str, raw_options: dict[str, str], *, device: str = "auto", batch_size: int = 8,
             gguf: bool = False, label: str | None = None) -> HFModel:
        """A folder, hub id or (with `gguf`) GGUF file, with its `-M` options."""
        options = build_params(HFOptions, raw_options, flag="-M")
        loaded = load_checkpoint(spec, options, device, gguf, label)
        return cls(loaded.model, loaded.tokenizer, options, loaded.source, batch_size)

    # ---- what was loaded -----------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        import transformers

        return {
            "backend": "hf",
            "name": self.name,
            "spec": self.source["spec"],
            "path": self.source["path"],
            "gguf_file": self.source["gguf_file"],
            "architecture": type(self.model).__name__,
            "config_sha256": sha256_json(self.model.config.to_dict()),
            "config_content_sha256": config_content_sha256(self.model.config.to_dict()),
            "tokenizer_sha256": vocabulary_sha256(self.tokenizer),
            **weights_fingerprint(weight_files(self.source["path"], self.source["gguf_file"])),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": self.device.type,
            "attn_implementation": compat.attention_implementation(self.model.config),
            "chat_template": self.chat_template,
            "max_context": self.max_context,
            "quantization": self._quantization(),
            "transformers": transformers.__version__,
        }

    def _quantization(self) -> dict[str, Any] | None:
        """What -M attn_quant / load_in changed, as loaded (a -T bits sweep is part of the task)."""
        from .quant import parse_attn_quant

        out: dict[str, Any] = {}
        if parse_attn_quant(self.options.attn_quant) < 16:
            out["attn_logits"] = self.options.attn_quant
            out["attn_granularity"] = self.options.attn_quant_granularity
        if self.options.load_in != "none":
            out["weights"] = f"bitsandbytes-{self.options.load_in}"
        return out or None

    # ---- tokens: TokenRules ----------------------------------------------------------------

    def encode(self, text: str, first: bool = True) -> list[int]:
        return self.tokens.encode(text, first)

    def count_tokens(self, text: str) -> int:
        return self.tokens.count(text)

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        return self.tokens.user_turn(user, assistant_prefix)

    @property
    def prefix_token_id(self) -> int:
        return self.tokens.prefix_token_id

    # ---- answers: Decoder ------------------------------------------------------------------

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens run through the model so far (explicit prefixes, shared beginnings and
        each row's own part; pads not counted): what prefix reuse saves shows here."""
        return self.decoder.prefilled_tokens + self.prefix_cache.prefilled_tokens

    @property
    def batch_limits(self) -> dict[str, Any]:
        """The batch size and padded-token budget in force, and each out-of-memory halving."""
        limits = self.decoder.limits
        return {"rows": limits.rows, "tokens": limits.tokens, "halvings": list(limits.halvings)}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return self.decoder.generate(requests)

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        return self.decoder.loglikelihood(requests)

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Loglikelihood]:
        return self.decoder.loglikelihood_tokens(pairs)

    def use_prefix_cache(self, on: bool) -> None:
        """As -M prefix_cache=ON would have loaded it: the decoder and the prefix cache read the option."""
        self.options = self.decoder.options = self.prefix_cache.options = replace(self.options, prefix_cache=on)

    # ---- capabilities: Capabilities, AttentionShare, TokenNLL ------------------------------

    def quantized_attention(self, bits: int | None) -> AbstractContextManager[None]:
        return self.instruments.quantized_attention(bits)

    def probe_activations(self, windows: Sequence[Sequence[int]], observe: ActivationObserver) -> None:
        self.instruments.probe_activations(windows, observe)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.attention.encode_with_offsets(text)

    def attention_layers(self) -> int:
        return self.attention.attention_layers()

    def attention_mass(self, ids: Sequence[int], queries: Sequence[int], spans: Sequence[tuple[int, int]],
                       layers: Sequence[int] | None = None, differential_norm: str = "lambda") -> AttentionMass:
        return self.attention.attention_mass(ids, queries, spans, layers, differential_norm)

    def token_nll(self, windows: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.nll.token_nll(windows)

