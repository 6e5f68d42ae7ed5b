"""Counting tokens for a served model: with a local tokenizer, or through the server.

Tasks size their prompts in the model's tokens (haystacks to an exact budget), so
counts must be the served model's. `-M tokenizer=FOLDER|HUB_ID|NAMED_MODEL` loads that
tokenizer here (no weights); without it, counts come from the server's `/tokenize`
(vLLM and SGLang offer it beside `/v1`), cached because haystack fitting asks often; with
`-M counts=usage`, from the `usage.prompt_tokens` of a one-token request (any OpenAI-compatible
API, hosted ones included: one request per text counted).

With `-M api=chat` the server wraps every prompt in the model's chat template, so a count is of
the prompt as the model reads it, template included: the local tokenizer renders its own chat
template around the text, `/tokenize` gets the text as a user message, and usage is the chat
request's own.

A server's counts are checked before they are used: a prompt builder that fits
a haystack by its counts would search forever on counts that do not grow with
the text, and no tokenizer makes more tokens of a text than it has bytes (a
few special tokens, and a chat template's, aside).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsuite.backends import resolve_spec
from evalsuite.backends.common.chat import user_turn
from evalsuite.backends.common.http import HttpClient, json_body, malformed
from evalsuite.backends.common.tokens import TokenRules
from evalsuite.errors import UserError, first_line

from .api import prompt_tokens

CACHE_LIMIT = 100_000  # counts kept before the cache is cleared (keys are digests, not texts)
SPECIAL_SLACK = 16  # tokens a tokenizer may add to any text (BOS, EOS, a leading space marker...)
TEMPLATE_SLACK = 2048  # tokens a chat template may add around a message (role markers, a default system prompt)
PROBE = "The quick brown fox jumps over the lazy dog."  # counted once alone and 32 times, to see counts grow
NO_TOKENIZER = "give -M tokenizer=FOLDER|HUB_ID|NAME (the served model's tokenizer)"


def load_tokenizer(spec: str) -> Any:
    """A transformers tokenizer from a folder, a cached hub id, or a named model (toy-base)."""
    from transformers import AutoTokenizer

    kind, rest, _ = resolve_spec(spec)
    location, kwargs = spec, {}  # another backend's spec: transformers says why it is no tokenizer
    if kind == "hf":
        location = rest
    elif kind == "gguf":
        location, kwargs = str(Path(rest).parent), {"gguf_file": Path(rest).name}
    try:
        return AutoTokenizer.from_pretrained(location, **kwargs)
    except Exception as exc:  # transformers raises OSError, ValueError, hub errors... for a bad location
        raise UserError(f"-M tokenizer={spec}: could not load a tokenizer: {first_line(exc)}") from None


def local_counter(tokenizer: Any, spec: str, chat_api: bool, chat_template: bool) -> Callable[[str], int]:
    """Counts by a local tokenizer under the hf backend's rules (special tokens included); for the
    chat API, of the text as a user turn in the tokenizer's own chat template (the server's, one hopes:
    every answer's usage is checked against it)."""
    if not chat_api:
        return TokenRules(tokenizer, chat_template).count
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"-M tokenizer={spec} has no chat template to count a chat prompt's tokens with; leave "
                        "-M tokenizer out to count with the server's /tokenize, or give -M counts=usage")
    rules = TokenRules(tokenizer, chat_template=True)
    return lambda text: rules.count(user_turn(tokenizer, True, text))


class ServerTokenCounter:
    """Token counts asked of the server, cached: `POST {root}/tokenize` (vLLM's shape: {"count": n}
    or {"tokens": [...]}), or with `usage`, a one-token request's usage.prompt_tokens.
    `fields(text)`: the request's body; `template`: counts may hold a chat template's tokens."""

    def __init__(self, client: HttpClient, path: str, fields: Callable[[str], dict[str, Any]], *,
                 usage: bool = False, template: bool = False):
        self.client = client
        self.path = path
        self.fields = fields
        self.usage = usage
        self.slack = SPECIAL_SLACK + TEMPLATE_SLACK * template
        self._counts: dict[str, int] = {}
        self._checked = False

    def count(self, text: str) -> int:
        if not self._checked:
            self._check_growth()  # again at the next count if it fails: no count is used unchecked
            self._checked = True
        key = _digest(text)
        if key not in self._counts:
            if len(self._counts) >= CACHE_LIMIT:
                self._counts.clear()
            self._counts[key] = self._ask(text)
        return self._counts[key]

    def known(self, text: str) -> int | None:
        """The count of `text` if it was asked already (no request)."""
        return self._counts.get(_digest(text))

    def _check_growth(self) -> None:
        """A short text and 32 copies of it: counts that do not grow are not a tokenizer's."""
        long = " ".join([PROBE] * 32)
        short_count, long_count = self._ask(PROBE), self._ask(long)
        if long_count <= short_count:
            raise UserError(f"server {self.client.public(self.path)} counts {short_count} tokens in a text of "
                            f"{len(PROBE)} characters and {long_count} in one of {len(long)}: counts that do not grow "
                            f"with the text are no tokenizer's; {NO_TOKENIZER}")

    def _ask(self, text: str) -> int:
        result = self.client.call(self.path, json_body(self.fields(text)),
                                  self._parse_usage if self.usage else self._parse)
        if result.outcome == "ok":
            count, size = int(result.content), len(text.encode("utf-8", "surrogatepass"))
            if count > size + self.slack:
                raise UserError(f"server {self.client.public(self.path)} counts {count} tokens in a text of {size} "
                                f"bytes, more than any tokenizer makes; {NO_TOKENIZER}")
            return count
        if not self.usage and (result.error.startswith("HTTP 404") or result.error.startswith("HTTP 405")):
            raise UserError(f"server {self.client.public_url} offers no /tokenize to count tokens, which this task "
                            f"needs; {NO_TOKENIZER}, or -M counts=usage")
        hint = f"; {NO_TOKENIZER}, or -M counts=usage" if not self.usage and result.outcome == "rejected" else ""
        raise UserError(f"server {self.client.public(self.path)}: {result.error}{hint}")

    def _parse_usage(self, raw: bytes) -> int:
        try:
            count = prompt_tokens(json.loads(raw))
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep to read
            count = None
        if count is None:
            raise malformed(raw, self.client.scrub, "no usage.prompt_tokens to count tokens by")
        return count

    def _parse(self, raw: bytes) -> int:
        try:
            body = json.loads(raw)
            count = body["count"] if "count" in body else len(body["tokens"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise malformed(raw, self.client.scrub, "expected {\"count\": n} or {\"tokens\": [...]}") from None
        if not isinstance(count, int) or count < 0:
            raise malformed(raw, self.client.scrub, "count is not a token count")
        return count


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
