"""Every use of a transformers internal, in one module, adapted across the releases evalsuite supports.

evalsuite reaches below transformers' public API in a few places: for speed (a prefix's KV cache
laid side by side for a batch, a static cache filled from a prefill), for measurement (attention
functions registered to read or quantize logits) and for modeling (DiffLlama's attention replaced,
DIFF V2 built from Llama's pieces). Each of those is a function here; the rest of the package calls
them and names no transformers internal, so an upstream change breaks one file, and
tests/test_compat.py (one check per internal) says which.

`TESTED` holds the oldest and newest releases CI has passed (pyproject's `[tool.evalsuite.tested]`
says the same; a test keeps the two equal). A release outside it gets one warning at run start and
is recorded in the run's config.

Differences adapted here:
- 5.24 renamed the `past_key_values` keyword of models, decoder layers and attention modules to
  `cache` (the old name a deprecated alias until 5.40, with a warning), hands the attention's keyword
  arguments on to `Cache.update`, and returns the cache as `output.cache`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any

# oldest and newest release of each library whose internals evalsuite touches, as CI last passed them
TESTED: dict[str, tuple[str, str]] = {
    "transformers": ("5.18.0", "5.24.0"),
    "lm-eval": ("0.4.12", "0.4.13"),
}


# ---- versions ----------------------------------------------------------------------------------------


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """(5, 24, 0) from '5.24.0', '5.24.0.dev0' or '5.24.0rc1': the release numbers only."""
    from packaging.version import Version

    return Version(version).release


def untested(versions: dict[str, str | None] | None = None) -> dict[str, str]:
    """Installed libraries outside their tested range: name -> a short description."""
    found = versions if versions is not None else {name: installed_version(name) for name in TESTED}
    out = {}
    for name, version in found.items():
        if version is None or name not in TESTED:
            continue
        low, high = TESTED[name]
        if _release(version) < _release(low):
            out[name] = f"{name} {version} is older than the oldest tested ({low})"
        elif _release(version) > _release(high):
            out[name] = f"{name} {version} is newer than the newest tested ({high})"
    return out


# ---- the cache keyword and the cache's layout ----------------------------------------------------------


@cache
def cache_keyword() -> str:
    """The keyword models and attention modules take their KV cache by: `cache` from 5.24 on."""
    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def cache_argument(kv_cache: Any) -> dict[str, Any]:
    """`{keyword: kv_cache}` for a model call: `model(input_ids=..., **cache_argument(c))`."""
    return {cache_keyword(): kv_cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a model call returned (read without the deprecated alias)."""
    return getattr(output, cache_keyword())


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a decoder layer handed to an attention module, taken out of `kwargs` (by either name)."""
    found = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)
    return found if found is not None else legacy


def update_cache(kv_cache: Any, key: Any, value: Any, layer: int, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Append one layer's keys and values to the cache as the installed release's attention does."""
    if cache_keyword() == "cache":
        return kv_cache.update(key, value, layer, kwargs=kwargs)
    return kv_cache.update(key, value, layer)


def new_cache(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """A dynamic cache holding these (keys, values) per layer, each (batch, heads, time, d)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(keys, values) for keys, values in pairs])


# columns of room a growing cache's buffers keep past their filled part (see growing_cache)
ROOM_COLUMNS = 32


def growing_cache(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """A dynamic cache holding these (keys, values) per layer, as they are (no copy), whose
    updates write into room kept past the filled columns instead of concatenating: a plain
    dynamic cache copies every layer's whole cache at every decode step (for 8 rows of 1K tokens
    through SmolLM2-135M, 380 MB a step, a fifth of the step's time on a CPU). The values, and so
    every score computed from them, are the same."""
    from transformers import DynamicCache

    made = DynamicCache()
    layer_class = _growing_layer()
    made.layers = [layer_class.holding(keys, values) for keys, values in pairs]
    return made


def fill_growing_cache(kv_cache: Any, buffers: Sequence[tuple[Any, Any]], filled: int) -> None:
    """Each layer's keys and values: the first `filled` columns of these (keys, values) buffers,
    whose later columns its next updates write into (a cache from `growing_cache`)."""
    for layer, pair in zip(kv_cache.layers, buffers, strict=True):
        layer.adopt(pair, filled)


@cache
def _growing_layer() -> Any:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A dynamic layer whose keys and values are the filled part of buffers with room past
        it. Keys set from outside (rows cut out, rows stacked on) move into new buffers at the
        next update: one copy, as a concatenation makes."""

        buffers: tuple[Any, Any] | None = None

        @classmethod
        def holding(cls, keys: Any, values: Any) -> Any:
            layer = cls()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            return layer

        def adopt(self, buffers: tuple[Any, Any], filled: int) -> None:
            self.buffers = buffers
            self.keys, self.values = (buffer[:, :, :filled] for buffer in buffers)

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized or self.keys.dim() != 4:
                return super().update(key_states, value_states, *args, **kwargs)
            filled, added = self.keys.shape[2], key_states.shape[2]
            if not self._fits(filled + added):
                self.adopt(tuple(_with_room(t, filled + added + ROOM_COLUMNS) for t in (self.keys, self.values)),
                           filled)
            assert self.buffers is not None
            for buffer, new in zip(self.buffers, (key_states, value_states)):
                buffer[:, :, filled : filled + added].copy_(new)
            self.keys, self.values = (buffer[:, :, : filled + added] for buffer in self.buffers)
            return self.keys, self.values

        def _fits(self, columns: int) -> bool:
            """Whether the keys and values are still the start of the buffers, with room for `columns`."""
            if self.buffers is None:
                return False
            return all(t.data_ptr() == b.data_ptr() and t.shape[:2] == b.shape[:2] and t.stride() == b.stride()
                       and columns <= b.shape[2] for t, b in zip((self.keys, self.values), self.buffers))

    return GrowingLayer


def _with_room(tensor: Any, columns: int) -> Any:
    """A (batch, heads, `columns`, d) buffer whose first columns hold `tensor`."""
    buffer = tensor.new_empty((tensor.shape[0], tensor.shape[1], columns, tensor.shape[3]))
    buffer[:, :, : tensor.shape[2]].copy_(tensor)
    return buffer


def empty_cache(config: Any) -> Any:
    """An empty dynamic cache with the layer kinds the model's config declares; for a model whose
    layers a dynamic cache cannot hold (recurrent state, keys shared across layers), the cache its
    config makes (`config.new_cache()`, evalsuite's phi4flash)."""
    from transformers import DynamicCache

    own = getattr(config, "new_cache", None)
    if callable(own):
        return own()
    return DynamicCache(config=config)


def cache_tensors(kv_cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) of every layer of a cache, in layer order."""
    return [(layer.keys, layer.values) for layer in kv_cache.layers]


def set_cache_tensors(kv_cache: Any, pairs: Sequence[tuple[Any, Any]]) -> None:
    """Replace every layer's keys and values (views allowed: the next update copies them)."""
    for layer, (keys, values) in zip(kv_cache.layers, pairs, strict=True):
        layer.keys, layer.values = keys, values


def is_plain_cache(kv_cache: Any) -> bool:
    """Whether every layer simply grows (no sliding window, no recurrent state), so the cache can
    be sliced, cropped and laid side by side."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) in (DynamicLayer, _growing_layer()) for layer in kv_cache.layers)


def static_cache(config: Any, slots: int, columns: int, like: Sequence[tuple[Any, Any]]) -> Any:
    """A static cache of `slots` rows and `columns` positions, its tensors shaped and typed like `like`'s."""
    from transformers import StaticCache

    made = StaticCache(config=config, max_cache_len=columns)
    layers: list[Any] = made.layers
    for layer, (keys, values) in zip(layers, like):
        layer.lazy_initialization(keys.new_empty((slots, keys.shape[1], 0, keys.shape[3])),
                                  values.new_empty((slots, values.shape[1], 0, values.shape[3])))
    return made


def fill_static_cache(static: Any, pairs: Sequence[tuple[Any, Any]]) -> None:
    """Copy a prefill's (keys, values) into the first columns of a static cache and set its write
    position just after them."""
    width = pairs[0][0].shape[2]
    for layer, (keys, values) in zip(static.layers, pairs):
        layer.keys[: keys.shape[0], :, :width].copy_(keys)
        layer.values[: values.shape[0], :, :width].copy_(values)
        layer.cumulative_length.fill_(width)


# ---- attention functions ---------------------------------------------------------------------------------


def attention_implementation(config: Any) -> str:
    """The attention implementation a model's config runs (`eager`, `sdpa`, a registered name...)."""
    return str(config._attn_implementation)


def set_attention_implementation(config: Any, implementation: str) -> None:
    """Make a config (and so a model built from it) run `implementation`, without the checks of
    `set_attn_implementation` (training builds its model before any attention has run)."""
    config._attn_implementation = implementation


def attention_function(implementation: str, default: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The registered attention function of `implementation` (`default` for eager)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if default is None:
        return ALL_ATTENTION_FUNCTIONS[implementation]
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, default)


def follows_attention_interface(model_class: type) -> None:
    """Let `set_attn_implementation` switch a model class of evalsuite's own whose attention goes through
    `attention_function`: transformers decides whether a class may switch by searching its module's
    source for the interface's lookup, which evalsuite's modeling files make here instead."""
    model_class._can_set_attn_implementation_cached_value = True  # type: ignore[attr-defined]


def has_mask_function(implementation: str) -> bool:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return implementation in ALL_MASK_ATTENTION_FUNCTIONS


def boolean_masks(implementation: str) -> bool:
    """Whether `implementation` takes boolean masks (SDPA's format), not additive ones (eager's)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    return implementation in ALL_MASK_ATTENTION_FUNCTIONS and ALL_MASK_ATTENTION_FUNCTIONS[implementation] is sdpa_mask


def register_attention(name: str, function: Callable[..., Any], masks_like: str) -> None:
    """Register `function` as attention implementation `name`, given the mask format of
    implementation `masks_like` (`sdpa`: boolean masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[masks_like])


# ---- modeling files evalsuite builds on -----------------------------------------------------------------


def diffllama_modeling() -> ModuleType:
    """transformers' DiffLlama modeling file: its attention class, rotary and eager functions."""
    from transformers.models.diffllama import modeling_diffllama

    return modeling_diffllama


def llama_modeling() -> Any:  # Any: its classes are subclassed, which a ModuleType's attributes cannot be for mypy
    """transformers' Llama modeling file, whose blocks DIFF V2 reuses."""
    from transformers.models.llama import modeling_llama

    return modeling_llama
