"""The `server` backend: any OpenAI-compatible `/v1/completions` endpoint (vLLM, SGLang, TGI...),
or with `-M api=chat` its `/v1/chat/completions`, where the server applies the chat template.

    --model server:MODEL_NAME -M base_url=http://127.0.0.1:8000/v1 [-M tokenizer=FOLDER|NAME] [-M api=chat]

    model.py    ServerModel, the adapter: generation, log-likelihoods, token counts, fingerprint
    api.py      the two APIs: what a request carries, where a reply keeps its text, usage
    echo.py     log-likelihoods read from an echoed prompt's log-probs (pure functions)
    tokens.py   counting tokens: a local tokenizer, or the server's /tokenize

The HTTP machinery (concurrency limit, retries, timeouts, the API key) is shared with
the judges: `evalsuite.backends.common.http`. Importing this package imports neither torch nor
transformers; a local tokenizer loads transformers when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from evalsuite.backends import checked_by_loading

if TYPE_CHECKING:
    from .model import ServerModel


@checked_by_loading  # asking the server for its models is the check
def load(rest: str, options: Mapping[str, str], *, device: str = "auto", batch_size: int = 8,
         label: str | None = None) -> ServerModel:
    """The `server:MODEL_NAME` backend's loader (device and batch size are the server's business)."""
    from .model import load_server

    return load_server(rest, dict(options), label)
