"""Automatic prefix sharing: rows of one call that begin with the same tokens (needle prompts
that share an instruction or a haystack's start, a zero-shot context under each of its
choices) have that beginning prefilled once and its KV cache reused, as vLLM's automatic
prefix caching does, without the task saying what is shared.

How a call is served:
- `plan_sharing` finds, for each row, how many of its first tokens another row of the call
  also starts with (`shared`), leaving the tokens whose logits are needed unshared; shares
  shorter than `min_tokens`, or than a fifth of their row, cost more than they save and are
  dropped;
- the distinct shared beginnings that are not the beginning of a longer one are the
  `anchors`; each is prefilled once, batch 1, continuing from the anchor before it where
  the two agree (anchors in sorted order), so every shared token runs through the model once;
- `batch_start` lays one batch out as the decoder's left-padded rows: the batch's columns
  split into a cached part, filled from the anchors, and the part the model runs over, where
  each row's own tokens are left-padded (a masked gap after its cached part). Where that gap
  would widen the batch much, rows run a few of their shared tokens again instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from evalsuite.modeling import compat

# a shared beginning shorter than this is not worth a pass of its own (vLLM caches 16-token blocks)
MIN_SHARED_TOKENS = 16
# nor one under this share of its row: past a cache the row's pass needs an explicit mask, which
# takes SDPA off its causal fast path. SmolLM2-135M, 1,004 tokens, CPU: 56 shared tokens made the
# row 1.09x slower than running it whole, 128 broke even, 256 took 0.86x and 512 0.59x
MIN_SHARED_SHARE = 0.2
# columns of padding a batch may gain between rows' cached and own parts (see batch_start)
GAP_SLACK = 64
# a row whose own part is under this share of its prefill pass's widest gets a pass of its own
OWN_SPLIT = 0.75


@dataclass
class SharePlan:
    """Which rows of a call share a beginning, and the anchors' KV caches once prefilled."""

    shared: list[int]  # per row: leading tokens whose keys and values come from its anchor
    anchor_of: list[int]  # per row: index into `anchors` (-1: nothing shared)
    anchors: list[list[int]]  # token ids of each anchor, in sorted order
    caches: list[Any] = field(default_factory=list)  # per anchor: its batch-1 DynamicCache

    @property
    def any(self) -> bool:
        return any(self.shared)


def plan_sharing(rows: Sequence[Sequence[int]], unshared: Sequence[int], min_tokens: int, budget: int
                 ) -> SharePlan:
    """Shared beginnings of `rows`; row i keeps at least `unshared[i]` tokens of its own (the
    positions whose logits are asked for). The anchors hold at most `budget` tokens together:
    they stay in memory while the call runs."""
    n = len(rows)
    usable = [max(0, len(row) - keep) for row, keep in zip(rows, unshared)]
    order = sorted(range(n), key=lambda i: list(rows[i]))
    neighbour = [common_length(rows[order[k]], rows[order[k + 1]]) for k in range(n - 1)]
    shared = [0] * n
    for k, i in enumerate(order):
        shared[i] = _best_share(k, order, neighbour, usable)
    shared = [s if s >= max(min_tokens, MIN_SHARED_SHARE * len(row)) else 0 for s, row in zip(shared, rows)]
    beginnings = sorted({tuple(rows[i][: shared[i]]) for i in range(n) if shared[i]})
    anchors = [list(b) for j, b in enumerate(beginnings)
               if j + 1 == len(beginnings) or beginnings[j + 1][: len(b)] != b]
    anchors = _within_budget(anchors, budget)
    anchor_of = [-1] * n
    for i in range(n):
        anchor_of[i] = _anchor_for(rows[i][: shared[i]], anchors) if shared[i] else -1
        if anchor_of[i] < 0:
            shared[i] = 0
    return SharePlan(shared, anchor_of, anchors)


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _best_share(k: int, order: list[int], neighbour: list[int], usable: list[int]) -> int:
    """The longest beginning row order[k] shares with another row that can use it too. In
    sorted order the common length of two rows is the least of the neighbour lengths between
    them, so the walk outwards stops once that falls to the best found."""
    i, best = order[k], 0
    for step in (-1, 1):
        run = usable[i]
        j = k
        while run > best and 0 <= j + step < len(order):
            run = min(run, neighbour[min(j, j + step)])
            j += step
            best = max(best, min(run, usable[order[j]]))
    return best


def _within_budget(anchors: list[list[int]], budget: int) -> list[list[int]]:
    """The anchors, in order, while their tokens fit the budget."""
    kept, total = [], 0
    for anchor in anchors:
        total += len(anchor)
        if total > budget:
            break
        kept.append(anchor)
    return kept


def _anchor_for(beginning: Sequence[int], anchors: list[list[int]]) -> int:
    """The anchor that `beginning` is the start of (-1 if that anchor was over the budget)."""
    for j, anchor in enumerate(anchors):
        if anchor[: len(beginning)] == list(beginning):
            return j
    return -1


@torch.inference_mode()
def prefill_anchors(model: Any, plan: SharePlan, device: torch.device, step: int) -> int:
    """Each anchor's KV cache, batch 1, computed after the part it shares with the anchor
    before it (a view of that one's cache: the model's first update copies it). Returns the
    tokens run through the model."""
    prefilled = 0
    previous: list[int] = []
    for anchor in plan.anchors:
        reuse = common_length(previous, anchor)
        cache = None
        if reuse and plan.caches:
            last = plan.caches[-1]
            cache = compat.new_cache((k[:, :, :reuse], v[:, :, :reuse]) for k, v in compat.cache_tensors(last))
        for start in range(reuse, len(anchor), step):
            piece = torch.tensor([anchor[start : start + step]], dtype=torch.long, device=device)
            positions = torch.arange(start, start + piece.shape[1], device=device)[None]
            cache = compat.returned_cache(model(input_ids=piece, position_ids=positions, use_cache=True,
                                                logits_to_keep=1, **compat.cache_argument(cache)))
            prefilled += piece.shape[1]
        plan.caches.append(cache)
        previous = anchor
    return prefilled


def split_by_own(batch: Sequence[int], own: Sequence[int]) -> list[list[int]]:
    """`batch` (rows widest own part first) in runs to prefill one pass each: a row whose own
    part is under OWN_SPLIT of its run's widest, and GAP_SLACK tokens or more shorter, starts
    a new run. One pass runs every row as wide as its widest own part (padding, or shared
    tokens run again), so rows that share a long beginning and rows that share little would
    save nothing in one pass; an extra pass costs little beside the columns it spares."""
    runs: list[list[int]] = []
    for i in sorted(batch, key=lambda i: -own[i]):
        widest = own[runs[-1][0]] if runs else 0
        if runs and not (own[i] < OWN_SPLIT * widest and widest - own[i] >= GAP_SLACK):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def caches_are_plain(plan: SharePlan) -> bool:
    """Whether every anchor's cache is made of plain growing layers, which can be sliced and
    laid side by side (sliding-window or recurrent layers cannot)."""
    return all(compat.is_plain_cache(cache) for cache in plan.caches)


@dataclass
class Start:
    """Where a batch's rows begin: a KV cache of `mask.shape[1]` columns (mask 0 where a row
    has nothing cached there) and, per row, how many of its tokens the cache holds. The rows
    handed to the decoder hold those tokens too (`rows_hold_cached`, cut before they are fed)
    or start after them (an explicit prefix)."""

    cache: Any
    mask: torch.Tensor
    cached: list[int]
    rows_hold_cached: bool = True


def batch_start(plan: SharePlan, batch: Sequence[int], lengths: Sequence[int]) -> Start | None:
    """The batch's cached columns, filled from the anchors; None when no row of the batch can
    take anything from the cache. Each row takes its whole shared beginning, its own part
    left-padded after it, unless that widens the batch by more than an eighth (or GAP_SLACK
    tokens): then every row keeps the batch's longest own part to run, some of its shared
    tokens with it, and the batch is no wider than its longest row."""
    cached = [plan.shared[i] for i in batch]
    run = max(lengths[i] - c for i, c in zip(batch, cached))
    longest = max(lengths[i] for i in batch)
    if max(cached) + run > longest + max(GAP_SLACK, longest // 8):
        cached = [min(plan.shared[i], max(0, lengths[i] - run)) for i in batch]  # all rows end together instead
    width = max(cached)
    if width == 0:
        return None
    source = compat.cache_tensors(next(plan.caches[plan.anchor_of[i]] for i, c in zip(batch, cached) if c))
    layers = []
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for keys, values in source:
        shape = (len(batch), keys.shape[1], width, keys.shape[3])
        layers.append((keys.new_zeros(shape), values.new_zeros(shape)))
    for b, (i, c) in enumerate(zip(batch, cached)):
        if not c:
            continue
        mask[b, width - c :] = 1
        for (keys, values), (anchor_keys, anchor_values) in zip(layers, compat.cache_tensors(plan.caches[plan.anchor_of[i]])):
            keys[b, :, width - c :] = anchor_keys[0, :, :c]
            values[b, :, width - c :] = anchor_values[0, :, :c]
    return Start(compat.new_cache(layers), mask.to(source[0][0].device), cached)
