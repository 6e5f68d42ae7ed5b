"""lm-eval's requests as evalsuite requests, by lm-eval's own text conventions.

The zeroshot task scores lm-eval's task definitions with them, and the lm-eval bridge
(`integrations/lmeval.py`) answers lm-eval's requests with them, so both score a model exactly as
lm-eval's own `hf` backend would: the context's trailing whitespace moves to the start of the
continuation (lm-eval does this before tokenizing), and generation is greedy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalsuite.errors import UserError
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for generate_until


def loglikelihood_request(context: str, continuation: str) -> LoglikelihoodRequest:
    """An lm-eval (context, continuation) pair as an evalsuite request, whitespace moved as lm-eval does."""
    stripped = context.rstrip()
    return LoglikelihoodRequest(context=stripped, continuation=context[len(stripped):] + continuation)


def generation_request(context: str, gen_kwargs: Mapping[str, Any]) -> GenerationRequest:
    """lm-eval's generation arguments as a greedy evalsuite request; sampling is refused."""
    if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature", 0.0) or 0.0) > 0.0:
        raise UserError("evalsuite models decode greedily; this task asks for sampling (do_sample/temperature)")
    until = gen_kwargs.get("until") or ()
    stop = (until,) if isinstance(until, str) else tuple(until)
    max_new = int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    return GenerationRequest(prompt=context, max_new_tokens=max_new, stop=stop)
