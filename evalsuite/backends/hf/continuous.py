"""Continuous batching of one call's generation requests: rows that finish leave the running
batch, and waiting requests are prefilled and join it, so the device keeps decoding a full
batch instead of waiting on the longest answer of each batch before starting the next.

The running batch is left-padded like any batch of the decoder: every row ends at the last
column of one KV cache, with its own mask and positions. Rows that leave are cut out of
the cache (and columns no row needs any more are dropped); rows that join are padded on
the left to the running width (or the running rows are, when the newcomers are wider) and
stacked on. A row's tokens and positions are those of its whole prompt either way, so its
answer is the one a batch of its own gives (up to float rounding, as for any batch size).

A forward pass that runs out of memory puts the running rows back at the head of the queue,
halves the limits (`oom.BatchLimits.shrink`) and starts them again from their prompts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from evalsuite.modeling import compat
from evalsuite.types import GenerationRequest

from .oom import BatchLimits
from .prefix_cache import Prefix
from .prefix_share import SharePlan, Start, split_by_own

# A CPU's cores are kept busy by one prompt of a few hundred tokens: a prefill pass over several
# rows is no faster per token there, and slower once its activations outgrow the caches (8 rows
# of 1,004 tokens through SmolLM2-135M: 1.15x the CPU time of 8 one-row passes). On a CPU the
# admitted rows are prefilled in passes of at most this many padded tokens, then stacked for
# decoding, where batching pays (a decode step reads every weight once for all its rows).
CPU_PREFILL_TOKENS = 1024


class Steps(Protocol):
    """What the generator asks of the decoder (decoding.Decoder)."""

    limits: BatchLimits
    pad_id: int
    device: torch.device

    def start_for(self, batch: list[int], lengths: Sequence[int], prefix: Prefix | None, plan: SharePlan | None
                  ) -> Start | None: ...

    def forward(self, rows: list[list[int]], start: Start | None, keep: int, use_cache: bool
                ) -> tuple[Any, torch.Tensor, torch.Tensor]: ...

    def new_row(self, request: GenerationRequest) -> Any: ...

    def advance(self, row: Any, logits: torch.Tensor) -> int: ...

    def decode_step(self, token_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
                    ) -> Any: ...


@dataclass
class Running:
    """Rows being decoded together: their cache (batch x columns), mask, last positions, the
    logits each row picks its next token from, and which request each row is."""

    cache: Any
    mask: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    rows: list[Any]  # decoding.Row
    indices: list[int]

    def keep(self, which: list[int]) -> None:
        """Only the rows at `which`; then drop the leading columns that no row attends to."""
        index = torch.tensor(which, dtype=torch.long, device=self.mask.device)
        compat.set_cache_tensors(self.cache, [(k[index], v[index]) for k, v in compat.cache_tensors(self.cache)])
        self.mask, self.positions, self.logits = self.mask[index], self.positions[index], self.logits[index]
        self.rows = [self.rows[i] for i in which]
        self.indices = [self.indices[i] for i in which]
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first:
            compat.set_cache_tensors(self.cache, [(k[:, :, first:], v[:, :, first:])
                                                  for k, v in compat.cache_tensors(self.cache)])
            self.mask = self.mask[:, first:]

    def join(self, other: Running) -> None:
        """`other`'s rows stacked under these, both padded on the left to the wider."""
        joined = stacked([self, other])
        self.cache, self.mask, self.positions, self.logits = joined.cache, joined.mask, joined.positions, joined.logits
        self.rows, self.indices = joined.rows, joined.indices


def stacked(parts: Sequence[Running]) -> Running:
    """The parts' rows stacked in order, each padded on the left to the widest: one copy of each
    cache tensor, however many parts (joining them two at a time would copy the first ones again
    at every join), into buffers with room for the decode steps to come (compat.growing_cache)."""
    if len(parts) == 1:
        return parts[0]
    width = max(part.mask.shape[1] for part in parts)
    layers = zip(*(compat.cache_tensors(part.cache) for part in parts))
    buffers = [(_stack_left([k for k, _ in layer], width), _stack_left([v for _, v in layer], width))
               for layer in layers]
    cache = parts[0].cache
    compat.fill_growing_cache(cache, buffers, width)
    return Running(cache, torch.cat([_left(part.mask, width) for part in parts]),
                   torch.cat([part.positions for part in parts]), torch.cat([part.logits for part in parts]),
                   [row for part in parts for row in part.rows], [i for part in parts for i in part.indices])


def _stack_left(tensors: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """(rows, heads, width + room, d): the tensors' rows one under another, each ending at column
    `width` with zeros on its left (masked, but finite: a masked score is still computed)."""
    first = tensors[0]
    rows = sum(t.shape[0] for t in tensors)
    buffer = first.new_empty((rows, first.shape[1], width + compat.ROOM_COLUMNS, first.shape[3]))
    row = 0
    for tensor in tensors:
        below, start = row + tensor.shape[0], width - tensor.shape[2]
        buffer[row:below, :, :start].zero_()
        buffer[row:below, :, start:width].copy_(tensor)
        row = below
    return buffer


def _left(mask: torch.Tensor, width: int) -> torch.Tensor:
    """A mask padded with zeros on its left to `width` columns."""
    missing = width - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def by_tokens(run: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """`run` cut, in order, into passes of at most `budget` padded tokens (rows x the pass's widest
    row); a row wider than the budget is a pass of its own."""
    passes: list[list[int]] = []
    for i in run:
        if passes and max(lengths[i], *(lengths[j] for j in passes[-1])) * (len(passes[-1]) + 1) <= budget:
            passes[-1].append(i)
        else:
            passes.append([i])
    return passes


class ContinuousGenerator:
    """One prefix group's requests through a running batch of at most `limits.rows` rows."""

    def __init__(self, decoder: Steps, requests: Sequence[GenerationRequest], rows: Sequence[list[int]],
                 lengths: Sequence[int], state: Prefix | None, plan: SharePlan | None):
        self.decoder = decoder
        self.requests = requests
        self.rows = rows
        self.lengths = lengths
        self.state = state
        self.plan = plan
        self.answers: list[tuple[int, str]] = []
        self.attempt = (0, 0)

    def run(self, order: Sequence[int]) -> list[tuple[int, str]]:
        """(index, answer) of every request, admitted in `order`."""
        pending = deque(order)
        running: Running | None = None
        while pending or running is not None:
            self.attempt = (0, 0)  # rows x columns of the pass under way
            try:
                running = self._step(self._admit(pending, running))
                continue
            except torch.OutOfMemoryError:
                pass  # leave the except block first: its traceback holds the failed pass's tensors
            if running is not None:  # its rows start again from their prompts
                pending.extendleft(reversed(running.indices))
                running = None
            self.decoder.limits.shrink(*self.attempt)
        return self.answers

    def _admit(self, pending: deque[int], running: Running | None) -> Running | None:
        """Waiting requests prefilled and joined to the running rows, when at least half the
        slots are free (one prefill for several rows, not one per row that finishes)."""
        limits = self.decoder.limits
        active = len(running.rows) if running is not None else 0
        free = limits.rows - active
        if not pending or (running is not None and free < max(1, limits.rows // 2)):
            return running
        width = running.mask.shape[1] if running is not None else 0
        batch: list[int] = []
        for i in pending:
            wide = max(width, *(self.lengths[j] for j in batch), self.lengths[i])
            if batch or running is not None:
                if len(batch) >= free or wide * (active + len(batch) + 1) > limits.tokens:
                    break
            batch.append(i)
        if not batch:
            return running
        joining = self._prefill(batch)
        if running is None:
            running = joining
        else:
            self.attempt = (active + len(batch), max(width, joining.mask.shape[1]))
            running.join(joining)
        for _ in batch:
            pending.popleft()
        return running

    def _prefill(self, batch: list[int]) -> Running:
        """The batch prefilled in runs, then stacked: runs of rows whose own parts (past their
        shared beginnings) are alike, as one pass would run every row as wide as the widest own
        part, so sharing would save no compute on rows whose needle sits deep (split_by_own);
        on a CPU, runs of at most CPU_PREFILL_TOKENS padded tokens (by_tokens)."""
        own = [self.lengths[i] - (self.plan.shared[i] if self.plan is not None else 0) for i in range(len(self.lengths))]
        runs = split_by_own(batch, own) if self.plan is not None else [batch]
        if self.decoder.device.type == "cpu":
            runs = [part for run in runs for part in by_tokens(run, own, CPU_PREFILL_TOKENS)]
        parts = [self._prefill_run(run) for run in runs]
        self.attempt = (len(batch), max(part.mask.shape[1] for part in parts))
        return stacked(parts)

    @torch.inference_mode()
    def _prefill_run(self, batch: list[int]) -> Running:
        decoder = self.decoder
        self.attempt = (len(batch), max(self.lengths[i] for i in batch))
        try:
            start = decoder.start_for(batch, self.lengths, self.state, self.plan)
            out, mask, positions = decoder.forward([self.rows[i] for i in batch], start, keep=1, use_cache=True)
            # a cache object of our own (a single row after an explicit prefix was written into the
            # shared one, which `restore` crops back), holding the same tensors: no copy
            cache = compat.growing_cache(compat.cache_tensors(compat.returned_cache(out)))
        finally:
            if self.state is not None:
                self.state.restore()
        rows = [decoder.new_row(self.requests[i]) for i in batch]
        return Running(cache, mask, positions[:, -1:], out.logits[:, -1], rows, list(batch))

    @torch.inference_mode()
    def _step(self, running: Running | None) -> Running | None:
        """Each row's next token from its logits; finished rows leave; one decode step for the rest."""
        if running is None:
            return None
        decoder = self.decoder
        feed = [decoder.advance(row, running.logits[b]) if row.active else decoder.pad_id
                for b, row in enumerate(running.rows)]
        staying = [b for b, row in enumerate(running.rows) if row.active]
        self.answers += [(running.indices[b], row.text) for b, row in enumerate(running.rows) if not row.active]
        if not staying:
            return None
        if len(staying) < len(running.rows):
            running.keep(staying)
            feed = [feed[b] for b in staying]
        running.mask = torch.cat([running.mask, running.mask.new_ones((len(feed), 1))], dim=1)
        running.positions = running.positions + 1
        token_ids = torch.tensor(feed, dtype=torch.long, device=decoder.device)[:, None]
        self.attempt = tuple(running.mask.shape)
        out = decoder.decode_step(token_ids, running.mask, running.positions, running.cache)
        running.cache = compat.returned_cache(out)
        running.logits = out.logits[:, -1]
        return running

