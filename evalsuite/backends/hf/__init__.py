"""The `hf` backend: any transformers causal LM (Llama, DiffLlama, GGUF files...).

    loading.py        options, device, weight quantization, the model and tokenizer
    model.py          HFModel, the adapter, put together from the parts below
    prefix_cache.py   PrefixCache: a shared prefix's KV cache, computed once and reused
    decoding.py       Decoder: batching, the greedy decoding loop, log-likelihoods
    prefix_share.py   beginnings that rows of one call share, found, prefilled once and reused
    continuous.py     continuous batching: finished rows leave, waiting requests join
    static_decode.py  -M compile=true: decode steps over a static KV cache as CUDA graphs
    oom.py            BatchLimits: batches halved on out-of-memory, the size that fits kept
    capabilities.py   Capabilities: quantized attention and the activation probe
    attention_share.py  AttentionShare: the attention a few query rows pay to spans of the prompt
    token_nll.py      TokenNLL: per-token NLL of long windows, without a sequence x vocabulary tensor
    quant.py          attention-logit quantization inside transformers' attention

What it shares with the other backends by name (token rules, the choice trie, checkpoint
location and fingerprint hashes, chat turns) is in `evalsuite.backends.common`.

Importing this package imports neither torch nor transformers: the loaders do,
when a model spec picks this backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evalsuite.backends import checked_by

if TYPE_CHECKING:
    from .model import HFModel


def check_folder(rest: str, options: Mapping[str, str]) -> None:
    """The `-M` options and the checkpoint's files, without reading weights (backends.check_model)."""
    from .loading import check_checkpoint

    check_checkpoint(rest, options, gguf=False)


def check_gguf(rest: str, options: Mapping[str, str]) -> None:
    from .loading import check_checkpoint

    check_checkpoint(rest, options, gguf=True)


@checked_by(check_folder)
def load(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
         label: str | None = None) -> HFModel:
    """The `hf` backend's loader: a transformers folder or hub id."""
    from .model import HFModel

    return HFModel.load(rest, dict(options), device=device, batch_size=batch_size, label=label)


@checked_by(check_gguf)
def load_gguf(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
              label: str | None = None) -> HFModel:
    """The `gguf` backend's loader: a GGUF file, dequantized by transformers."""
    from .model import HFModel

    return HFModel.load(rest, dict(options), device=device, batch_size=batch_size, gguf=True, label=label)


def __getattr__(name: str) -> Any:
    if name == "HFModel":
        from .model import HFModel

        return HFModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
