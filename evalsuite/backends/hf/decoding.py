"""Batching, our own greedy decoding loop and log-likelihoods.

Generation is our own greedy loop rather than `model.generate`: prefill asks
for the last position's logits only, requests are batched longest first with
left padding, and each row stops at its own stop string, so a batch costs as
many decode steps as its longest answer, not `max_new_tokens`.

Rows of one call that begin alike are prefilled from a shared KV cache (an explicit
`prefix`: `prefix_cache.py`; any common beginning: `prefix_share.py`), and a batch that
runs out of memory is halved and run again (`oom.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from evalsuite.backends.common.choices import END, ChoiceTrie
from evalsuite.backends.common.tokens import TokenRules
from evalsuite.modeling import compat
from evalsuite.types import GenerationRequest, Loglikelihood, LoglikelihoodRequest

from .continuous import ContinuousGenerator
from .loading import HFOptions
from .oom import BatchLimits
from .prefix_cache import Prefix, PrefixCache
from .prefix_share import MIN_SHARED_TOKENS, SharePlan, Start, batch_start, caches_are_plain, plan_sharing, prefill_anchors
from .static_decode import StaticSteps, answer_budget

T = TypeVar("T")


class Decoder:
    """Part of HFModel: generate and loglikelihood over batches of token rows, through the
    prefix cache where requests share a prefix."""

    def __init__(self, model: Any, tokens: TokenRules, prefixes: PrefixCache, options: HFOptions,
                 device: torch.device, batch_size: int, pad_id: int, max_context: int, name: str = "model"):
        self.model = model
        self.tokens = tokens
        self.prefixes = prefixes
        self.options = options
        self.limits = BatchLimits(batch_size, options.max_batch_tokens, name)
        self.device = device
        self.pad_id = pad_id
        self.max_context = max_context
        self.prefilled_tokens = 0  # tokens run through the model before decoding (pads not counted)
        self.static = StaticSteps(model, device, pad_id) if options.compile else None

    @property
    def batch_size(self) -> int:
        return self.limits.rows

    # ---- batching ------------------------------------------------------------------------

    def in_batches(self, lengths: Sequence[int], work: Callable[[list[int]], None],
                   unshared: Sequence[int] | None = None) -> None:
        """`work` on batches of indices: longest unshared part first, then longest row, each
        batch under the padded-token budget, halved when it runs out of memory."""
        self.limits.run(self.order(lengths, unshared), lengths, work)

    @staticmethod
    def order(lengths: Sequence[int], unshared: Sequence[int] | None) -> list[int]:
        """Indices longest unshared part first, then longest row (today's batches, when nothing is shared)."""
        rest = unshared if unshared is not None else lengths
        return sorted(range(len(lengths)), key=lambda i: (-rest[i], -lengths[i], i))

    def left_pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask) of the rows padded on the left to the longest, on the device."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def forward(self, rows: list[list[int]], start: Start | None, keep: int, use_cache: bool
                ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Left-padded rows through the model, after the cached tokens `start` gives, when it
        gives any (start.cached[b] tokens of row b, not fed again).
        Positions continue from the cached part, so each row sees exactly the tokens (and
        positions) it would see as one whole prompt."""
        if start is not None and start.rows_hold_cached:
            rows = [row[c:] for row, c in zip(rows, start.cached)]
        ids, mask = self.left_pad(rows)
        self.prefilled_tokens += int(mask.sum())
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if start is not None:
            cache = start.cache
            positions = positions + torch.tensor(start.cached, device=self.device)[:, None]
            mask = torch.cat([start.mask, mask], dim=1)
            use_cache = True
        if bool((mask == 0).any()) and ids.shape[1] > self.options.prefill_chunk:
            return self.chunked_forward(ids, mask, positions, cache, keep), mask, positions
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=use_cache,
                         logits_to_keep=keep, **compat.cache_argument(cache))
        return out, mask, positions

    def chunked_forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any,
                        keep: int) -> Any:
        """Padded rows through the model a slice of columns at a time, over a KV cache.

        With padding the attention implementation needs an explicit mask, and for a whole
        prompt that mask is rows x width x width: quadratic memory (gigabytes per row at
        16K tokens). A slice's mask is rows x slice x seen, so peak memory grows linearly
        with the prompt. The last slice holds the `keep` positions whose logits are asked for."""
        width, seen_before = ids.shape[1], mask.shape[1] - ids.shape[1]  # columns of a cached prefix
        tail_start = max(0, width - keep)
        starts = list(range(0, tail_start, self.options.prefill_chunk)) + [tail_start]
        out = None
        for start, end in zip(starts, starts[1:] + [width]):
            if start == end:
                continue
            out = self.model(input_ids=ids[:, start:end], attention_mask=mask[:, : seen_before + end],
                             position_ids=positions[:, start:end], use_cache=True,
                             logits_to_keep=keep if end == width else 1, **compat.cache_argument(cache))
            cache = compat.returned_cache(out)
        return out

    def each_batch(self, lengths: Sequence[int], state: Prefix | None, plan: SharePlan | None,
                   call: Callable[[list[int], Start | None], Sequence[T]]) -> list[tuple[int, T]]:
        """(index, value) of every row: `call(batch, start)` on each batch (`in_batches`), its rows
        starting after the prefix `state` or their shared beginnings; the prefix's cache is put
        back after every batch."""
        done: list[tuple[int, T]] = []

        def work(batch: list[int]) -> None:
            try:
                values = call(batch, self.start_for(batch, lengths, state, plan))
            finally:
                if state is not None:
                    state.restore()
            done.extend(zip(batch, values))

        self.in_batches(lengths, work, self.unshared(lengths, plan))
        return done

    # ---- shared beginnings ---------------------------------------------------------------

    def share(self, rows: Sequence[Sequence[int]], unshared: Sequence[int]) -> SharePlan | None:
        """The shared beginnings of a call's whole rows, prefilled; None when nothing is shared
        or a cache cannot be shared here (see PrefixCache.attention_state)."""
        if not self.options.prefix_cache or not self.prefixes.usable or len(rows) < 2:
            return None
        if self.prefixes.attention_state() is None:
            return None
        plan = plan_sharing(rows, unshared, MIN_SHARED_TOKENS, self.options.max_batch_tokens)
        if not plan.any:
            return None
        try:
            self.prefilled_tokens += prefill_anchors(self.model, plan, self.device, self.options.max_batch_tokens)
        except torch.OutOfMemoryError:
            return None  # the call runs unshared, each row whole, batches backing off as they need
        if not caches_are_plain(plan):
            self.prefixes.usable = False  # sliding-window or recurrent layers: cannot slice or widen safely
            return None
        return plan

    def start_for(self, batch: list[int], lengths: Sequence[int], prefix: Prefix | None, plan: SharePlan | None
                  ) -> Start | None:
        """Where the batch's rows begin: after an explicit prefix, after shared beginnings, or at 0."""
        if prefix is not None:
            mask = torch.ones((len(batch), prefix.length), dtype=torch.long, device=self.device)
            return Start(prefix.for_batch(len(batch)), mask, [prefix.length] * len(batch), rows_hold_cached=False)
        if plan is not None:
            return batch_start(plan, batch, lengths)
        return None

    @staticmethod
    def unshared(lengths: Sequence[int], plan: SharePlan | None) -> list[int] | None:
        """Per row, the tokens not taken from shared beginnings (None: nothing shared)."""
        return [n - s for n, s in zip(lengths, plan.shared)] if plan else None

    # ---- generation ----------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """Greedy answers, a prefix group at a time, each group in batches longest first."""
        outputs: list[str] = [""] * len(requests)
        for prefix, indices in self.prefixes.groups(requests):
            group = [requests[i] for i in indices]
            state, rows = self.prefixes.rows_for(prefix, group, [r.prompt for r in group])
            for i, text in self.generate_group(group, rows, state):
                outputs[indices[i]] = text
        return outputs

    def generate_group(self, group: list[GenerationRequest], rows: list[list[int]], state: Prefix | None
                       ) -> list[tuple[int, str]]:
        """(index in group, answer) of one prefix group's requests."""
        plan = self.share(rows, [1] * len(rows)) if state is None else None
        lengths = [len(r) + (state.length if state else 0) for r in rows]
        if self.options.continuous_batching and self.static is None and full_attention_only(self.model):
            generator = ContinuousGenerator(self, group, rows, lengths, state, plan)
            return generator.run(self.order(lengths, self.unshared(lengths, plan)))
        return self.each_batch(lengths, state, plan, lambda batch, start: self.generate_batch(
            [rows[i] for i in batch], [group[i] for i in batch], start))

    def longest_choice(self, request: GenerationRequest) -> int:
        """Tokens of the request's longest choice: the most steps a constrained answer takes."""
        return max(len(self.tokens.choice_ids(request, choice)) for choice in request.choices or ("",))

    def new_row(self, request: GenerationRequest) -> Row:
        """A request's decoding state, before its first token."""
        return Row(request, self.choice_trie(request) if request.choices else None)

    def decode_step(self, token_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
        """One token per row through the model, after its cache."""
        return self.model(input_ids=token_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          **compat.cache_argument(cache))

    @torch.inference_mode()
    def generate_batch(self, rows: list[list[int]], requests: list[GenerationRequest], start: Start | None
                       ) -> list[str]:
        """The answers of one batch (-M continuous_batching=false or compile=true): a prefill, then
        one decode step per token until every row is done."""
        out, mask, positions = self.forward(rows, start, keep=1, use_cache=True)
        cache = compat.returned_cache(out)
        states = [self.new_row(r) for r in requests]
        if self.static is not None:
            budget = answer_budget(requests, self.longest_choice)
            self.static.decode(out, mask, positions, states, self.limits.rows, budget, self.advance)
            return [s.text for s in states]
        logits = out.logits[:, -1]
        while True:
            feed = [self.advance(s, logits[i]) if s.active else self.pad_id for i, s in enumerate(states)]
            if not any(s.active for s in states):
                break
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            positions = positions[:, -1:] + 1
            token_ids = torch.tensor(feed, dtype=torch.long, device=self.device)[:, None]
            out = self.decode_step(token_ids, mask, positions, cache)
            cache = compat.returned_cache(out)
            logits = out.logits[:, -1]
        return [s.text for s in states]

    def choice_trie(self, request: GenerationRequest) -> ChoiceTrie:
        """The request's choices as token ids after its prompt (split as lm-eval splits)."""
        return ChoiceTrie(request.choices or (), lambda choice: self.tokens.choice_ids(request, choice))

    def advance(self, row: Row, logits: torch.Tensor) -> int:
        """One greedy step for `row`: the token to feed next; marks the row done when its
        answer is complete (a stop string, EOS, max_new_tokens, or a whole choice)."""
        if row.trie is None:
            greedy = int(logits.argmax())
            row.tokens.append(greedy)
            row.text, row.active = self.tokens.answer_so_far(row.tokens, row.request, greedy)
            return greedy
        token, child = row.trie.pick(row.node, logits)
        if token is None:
            return row.finish(row.node[END])
        settled = ChoiceTrie.settled(child)
        if settled is not None:  # one choice left: its remaining tokens are forced, no need to run them
            return row.finish(settled)
        row.node = child
        return token

    # ---- log-likelihood ------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        """log p(continuation | prefix + context) of each request, batched as `generate` batches."""
        results: list[Loglikelihood | None] = [None] * len(requests)
        for prefix, indices in self.prefixes.groups(requests):
            group = [requests[i] for i in indices]
            split = [self.tokens.split_continuation(r) for r in group]
            continuations = [ids for _, ids in split]
            state, contexts = self.prefixes.rows_for(prefix, group, [context for context, _ in split],
                                                     extra=[len(c) for c in continuations])
            for i, result in self.score_pairs(list(zip(contexts, continuations)), state):
                results[indices[i]] = result
        return results  # type: ignore[return-value]

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Loglikelihood]:
        """Log-likelihoods of (context ids, continuation ids) pairs (lm-eval's rolling windows)."""
        results: list[Loglikelihood | None] = [None] * len(pairs)
        for i, result in self.score_pairs([(list(c), list(k)) for c, k in pairs], None):
            results[i] = result
        return results  # type: ignore[return-value]

    def score_pairs(self, pairs: list[tuple[list[int], list[int]]], state: Prefix | None
                    ) -> list[tuple[int, Loglikelihood]]:
        """(index, log-likelihood) of every (context, continuation) pair."""
        rows = [self.scored_row(c, k, state is not None) for c, k in pairs]
        plan = self.share(rows, [len(k) for _, k in pairs]) if state is None else None
        lengths = [len(r) + (state.length if state else 0) for r in rows]
        return self.each_batch(lengths, state, plan, lambda batch, start: self.loglikelihood_batch(
            [rows[i] for i in batch], [pairs[i][1] for i in batch], start))

    def scored_row(self, context: list[int], continuation: list[int], after_prefix: bool) -> list[int]:
        # The last continuation token is predicted, never fed: the input is (context +
        # continuation)[:-1], cut from the left to the model's context as lm-eval cuts it.
        whole = context + continuation
        return whole[:-1] if after_prefix else whole[-(self.max_context + 1) :][:-1]

    @torch.inference_mode()
    def loglikelihood_batch(self, rows: list[list[int]], continuations: list[list[int]], start: Start | None
                            ) -> list[Loglikelihood]:
        # Left padding puts every continuation's predictions at the end of its row.
        keep = max(len(k) for k in continuations)
        logits = self.forward(rows, start, keep=keep, use_cache=False)[0].logits
        results = []
        for row, cont in enumerate(continuations):
            n = len(cont)
            row_logits = logits[row, -n:].float().log_softmax(-1)
            target = torch.tensor(cont, device=row_logits.device)
            logprob = row_logits.gather(-1, target[:, None]).sum().item()
            greedy = bool((row_logits.argmax(-1) == target).all())
            results.append(Loglikelihood(logprob=logprob, is_greedy=greedy, tokens=n))
        return results


class Row:
    """The decoding state of one request in a batch."""

    def __init__(self, request: GenerationRequest, trie: ChoiceTrie | None):
        self.request = request
        self.trie = trie
        self.tokens: list[int] = []
        self.text = ""
        self.active = trie is not None or request.max_new_tokens > 0
        self.node = trie.root if trie else {}
        settled = ChoiceTrie.settled(trie.root) if trie is not None else None
        if settled is not None:
            self.finish(settled)

    def finish(self, index: int) -> int:
        assert self.trie is not None
        self.text, self.active = self.trie.choices[index], False
        return 0  # the token fed for a finished row is never looked at


def full_attention_only(model: Any) -> bool:
    """Whether every layer attends to the whole past (no sliding window, no recurrent layers):
    then a batch's cache is plain tensors that rows can be cut from and stacked onto."""
    config = model.config.get_text_config()
    kinds = getattr(config, "layer_types", None) or ["full_attention"]
    return all(kind == "full_attention" for kind in kinds) and not getattr(config, "sliding_window", None)
