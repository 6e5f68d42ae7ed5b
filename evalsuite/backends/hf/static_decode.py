"""`-M compile=true`: greedy decode steps over a static KV cache, compiled with torch.compile
into CUDA graphs, so that a decode step costs one graph launch instead of a Python walk over
every layer's kernels (what keeps a GPU idle between small steps).

A batch is prefilled as usual (left padding, dynamic cache); its keys and values are then
copied into a StaticCache whose shape is fixed: `limits.rows` rows (unused rows masked) by
the batch's width plus its answer budget, rounded up to WIDTH_STEP columns, so a run compiles
a few shapes and replays them. Each step writes one column at the cache's own counter; the
mask, positions and fed tokens live in tensors updated in place. Rows stay until their batch
is done (continuous batching reshapes the batch, which a captured graph cannot follow).

Only on CUDA, and only for models transformers can compile whole (`_can_compile_fullgraph`:
Llama, DiffLlama...): anything else is refused with one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from evalsuite.errors import UserError
from evalsuite.modeling import compat
from evalsuite.types import GenerationRequest

WIDTH_STEP = 256  # cache widths are rounded up to this: fewer shapes, fewer compilations


def check_compile(model: Any, device: torch.device) -> None:
    """Refuse -M compile=true where it cannot run."""
    if device.type != "cuda":
        raise UserError(f"-M compile=true needs a CUDA device (it captures CUDA graphs); this run is on {device.type}")
    if not getattr(model, "_can_compile_fullgraph", False):
        raise UserError(f"-M compile=true: {type(model).__name__} does not support a static KV cache")


class StaticSteps:
    """Decode steps of one batch after another over reused static caches, one per shape."""

    def __init__(self, model: Any, device: torch.device, pad_id: int):
        check_compile(model, device)
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.step = torch.compile(model.__call__, mode="reduce-overhead", dynamic=False)
        self.caches: dict[tuple[int, int], Any] = {}

    @torch.inference_mode()
    def decode(self, out: Any, mask: torch.Tensor, positions: torch.Tensor, rows: Sequence[Any], slots: int,
               budget: int, advance: Callable[[Any, torch.Tensor], int]) -> None:
        """Decode `rows` (decoding.Row states) after their prefill (`out`, its mask and positions)
        until each is done, at most `budget` steps."""
        batch, width = mask.shape
        slots = max(slots, batch)
        columns = -(-(width + budget) // WIDTH_STEP) * WIDTH_STEP
        cache = self._cache(compat.returned_cache(out), slots, columns)
        full_mask = torch.zeros((slots, columns), dtype=mask.dtype, device=self.device)
        full_mask[:batch, :width] = mask
        full_mask[batch:, 0] = 1  # unused rows attend somewhere: a row with no key at all is NaN
        ids = torch.full((slots, 1), self.pad_id, dtype=torch.long, device=self.device)
        position = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        position[:batch] = positions[:, -1:]
        logits = out.logits[:, -1]
        column = width
        while True:
            feed = [advance(row, logits[b]) if row.active else self.pad_id for b, row in enumerate(rows)]
            if not any(row.active for row in rows):
                return
            ids[:batch, 0] = torch.tensor(feed, dtype=torch.long, device=self.device)
            full_mask[:batch, column] = 1
            position += 1
            step = self.step(input_ids=ids, attention_mask=full_mask, position_ids=position, use_cache=True,
                             **compat.cache_argument(cache))
            logits = step.logits[:batch, -1].clone()  # a graph's outputs are overwritten by its next replay
            column += 1

    def _cache(self, prefilled: Any, slots: int, columns: int) -> Any:
        """The static cache of this shape (made once, then reused), holding the prefill's keys
        and values in its first columns, its write counter just after them."""
        layers = compat.cache_tensors(prefilled)
        cache = self.caches.get((slots, columns))
        if cache is None:
            cache = self.caches[(slots, columns)] = compat.static_cache(self.model.config, slots, columns, layers)
        compat.fill_static_cache(cache, layers)
        return cache


def answer_budget(requests: Sequence[GenerationRequest], choice_lengths: Callable[[GenerationRequest], int]) -> int:
    """Decode steps a batch may take: its longest max_new_tokens, or its longest choice."""
    return max(choice_lengths(r) if r.choices else r.max_new_tokens for r in requests)
