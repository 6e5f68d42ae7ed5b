"""Any evalsuite model as an lm-evaluation-harness language model.

Registered in lm-eval's model registry as `evalsuite`, so lm-eval's own task
definitions run on toy models, HF folders, GGUF files and quantized variants:

    import evalsuite.integrations.lmeval  # registers the name
    lm_eval.simple_evaluate(model="evalsuite",
                            model_args="model=toy-diff,attn_quant=absmax:6",
                            tasks=["hellaswag"])

`model=` takes any evalsuite model spec (a named model, a folder, gguf:PATH,
fake); every other model argument is passed on as an evalsuite `-M` option.
An already loaded adapter can be wrapped directly: `EvalsuiteLM(adapter)`.

Requests keep lm-eval's text conventions, so scores match lm-eval's own `hf`
backend on the same model: the context's trailing whitespace moves to the
start of the continuation (lm-eval does this before tokenizing), and an empty
context scores the continuation after the tokenizer's BOS. The adapter then
tokenizes context and continuation and batches as it always does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

# lm-eval's documented way to add a model, the one use of lm-eval outside modeling/lmeval_compat.py
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from evalsuite.contracts import TOKEN_LOGLIKELIHOOD, ModelAdapter, TokenLoglikelihood, offers
from evalsuite.engine.distributed import barrier, device_for, init, world_from_env
from evalsuite.errors import UserError
from evalsuite.modeling import lmeval_compat
from evalsuite.params import option_text
from evalsuite.tasks.lmeval_requests import generation_request, loglikelihood_request

lmeval_compat.load_model_registry()  # before evalsuite's model is registered (lmeval_compat says why)


@register_model("evalsuite")
class EvalsuiteLM(LM):
    """lm-eval's `loglikelihood`, `loglikelihood_rolling` and `generate_until` on an evalsuite adapter."""

    def __init__(self, adapter: ModelAdapter | None = None, model: str | None = None, device: str | None = None,
                 batch_size: int | str | None = None, max_batch_size: int | None = None, **options: Any):
        super().__init__()
        world = world_from_env()  # under `accelerate launch`: lm-eval splits documents by rank itself
        self._rank, self._world_size = world.rank, world.size
        init(world)
        if adapter is None:
            if not model:
                raise UserError("the evalsuite lm-eval model needs model_args=model=<evalsuite model spec>")
            from evalsuite.backends import load_model

            size = int(str(batch_size)) if str(batch_size or "").isdigit() else 8  # 'auto': the adapter caps memory
            adapter = load_model(str(model), {k: option_text(v) for k, v in options.items()},
                                 device=device_for(world, device or "auto"), batch_size=size)
        self.adapter = adapter
        self._device = getattr(adapter, "device", "cpu")

    # ---- data parallel under accelerate/torchrun: lm-eval's gathering hooks --------------------

    def all_gather(self, tensor: Any) -> Any:
        if self._world_size == 1:
            return tensor
        import torch
        import torch.distributed as dist

        parts = [torch.zeros_like(tensor) for _ in range(self._world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> Any:
        if self._world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        barrier(world_from_env())

    # ---- chat templates (--apply_chat_template) ------------------------------------------------

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        tokenizer = getattr(self.adapter, "tokenizer", None)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise UserError(f"--apply_chat_template: model {self.adapter.name} has no chat template")
        return str(tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt))

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        tokenizer = getattr(self.adapter, "tokenizer", None)
        return getattr(tokenizer, "chat_template", None) or ""

    @property
    def tokenizer_name(self) -> str:
        return self.adapter.name

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        outputs = self.adapter.loglikelihood([loglikelihood_request(*r.args) for r in requests])
        results = [(out.logprob, out.is_greedy) for out in outputs]
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Whole-text log-likelihood, with lm-eval's rolling token windows when the adapter
        scores token ids (the hf backend). Otherwise a text longer than the model's context
        is cut at whitespace into pieces of at most half the context; each piece is scored
        after the text before it (the adapter keeps as much of that as fits), so every token
        is predicted once, with as much context as the window allows."""
        texts = [r.args[0] for r in requests]
        if offers(self.adapter, TOKEN_LOGLIKELIHOOD):
            totals = self._rolling_token_windows(cast(TokenLoglikelihood, self.adapter), texts)
        else:
            pieces = [self._rolling_pieces(text) for text in texts]
            flat = [loglikelihood_request(text[:start], text[start:stop]) for text, spans in zip(texts, pieces)
                    for start, stop in spans]
            scores = iter(out.logprob for out in self.adapter.loglikelihood(flat))
            totals = [sum(next(scores) for _ in spans) for spans in pieces]
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def _rolling_token_windows(self, adapter: TokenLoglikelihood, texts: Sequence[str]) -> list[float]:
        """lm-eval's own rolling windows over each text's tokens (as its hf backend makes them:
        the text encoded as a prompt, its first token conditioned on the prefix token, windows
        of the model's context that predict every token once), scored as token pairs."""
        windows = [lmeval_compat.rolling_token_windows(adapter.encode(text), adapter.prefix_token_id,
                                                       self.adapter.max_context) for text in texts]
        scores = iter(out.logprob for out in adapter.loglikelihood_tokens([w for ws in windows for w in ws]))
        return [sum(next(scores) for _ in ws) for ws in windows]

    def _rolling_pieces(self, text: str) -> list[tuple[int, int]]:
        budget = max(1, self.adapter.max_context // 2)
        tokens = self.adapter.count_tokens(text)
        if tokens <= self.adapter.max_context - 1:
            return [(0, len(text))]
        step = max(1, len(text) * budget // tokens)
        spans, start = [], 0
        while start < len(text):
            stop = min(len(text), start + step)
            while stop < len(text) and not text[stop].isspace() and stop > start + 1:
                stop -= 1  # end at whitespace, which then opens the next piece as lm-eval's words do
            while stop - start > 1 and self.adapter.count_tokens(text[start:stop]) > budget:
                stop = start + (stop - start) // 2
            spans.append((start, stop))
            start = stop
        return spans

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        outputs = self.adapter.generate([generation_request(*r.args) for r in requests])
        for request, output in zip(requests, outputs):
            self.cache_hook.add_partial("generate_until", request.args, output)
        return outputs


def run_lm_eval_cli(args: Sequence[str]) -> None:
    """lm-eval's own command line, with this module's "evalsuite" model registered (`evalsuite lm-eval`)."""
    # lm-eval's own default device is cuda:0; evalsuite's model picks the machine's device unless told
    device = [] if any(a == "--device" or a.startswith("--device=") for a in args) else ["--device", "auto"]
    argv, sys.argv = sys.argv, ["lm_eval", *args, *device]
    try:
        lmeval_compat.command_line()()
    finally:
        sys.argv = argv
