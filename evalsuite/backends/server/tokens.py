"""Counting tokens for a served model: with a local tokenizer, or through the server.

Tasks size their prompts in the model's tokens (haystacks to an exact budget), so
counts must be the served model's. `-M tokenizer=FOLDER|HUB_ID|NAMED_MODEL` loads that
tokenizer here (no weights); without it, counts come from the server's `/tokenize`
(vLLM and SGLang offer it beside `/v1`), cached because haystack fitting asks often.

A server's counts are checked before they are used: a prompt builder that fits
a haystack by its counts would search forever on counts that do not grow with
the text, and no tokenizer makes more tokens of a text than it has bytes (a
few special tokens aside).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from evalsuite.backends import resolve_spec
from evalsuite.backends.common.http import HttpClient, json_body, malformed
from evalsuite.errors import UserError, first_line

CACHE_LIMIT = 100_000  # counts kept before the cache is cleared (keys are digests, not texts)
SPECIAL_SLACK = 16  # tokens a tokenizer may add to any text (BOS, EOS, a leading space marker...)
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


class ServerTokenCounter:
    """Token counts from `POST {root}/tokenize` (vLLM's shape: {"count": n} or {"tokens": [...]})."""

    def __init__(self, root: HttpClient, model: str, add_special_tokens: bool):
        self.root = root
        self.model = model
        self.add_special_tokens = add_special_tokens
        self._counts: dict[str, int] = {}
        self._checked = False

    def count(self, text: str) -> int:
        if not self._checked:
            self._checked = True
            self._check_growth()
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        if key not in self._counts:
            if len(self._counts) >= CACHE_LIMIT:
                self._counts.clear()
            self._counts[key] = self._ask(text)
        return self._counts[key]

    def _check_growth(self) -> None:
        """A short text and 32 copies of it: counts that do not grow are not a tokenizer's."""
        long = " ".join([PROBE] * 32)
        short_count, long_count = self._ask(PROBE), self._ask(long)
        if long_count <= short_count:
            raise UserError(f"server {self.root.public_url}/tokenize counts {short_count} tokens in a text of "
                            f"{len(PROBE)} characters and {long_count} in one of {len(long)}: counts that do not grow "
                            f"with the text are no tokenizer's; {NO_TOKENIZER}")

    def _ask(self, text: str) -> int:
        body = json_body({"model": self.model, "prompt": text, "add_special_tokens": self.add_special_tokens})
        result = self.root.call("/tokenize", body, self._parse)
        if result.outcome == "ok":
            count, size = int(result.content), len(text.encode("utf-8", "surrogatepass"))
            if count > size + SPECIAL_SLACK:
                raise UserError(f"server {self.root.public_url}/tokenize counts {count} tokens in a text of {size} "
                                f"bytes, more than any tokenizer makes; {NO_TOKENIZER}")
            return count
        if result.error.startswith("HTTP 404") or result.error.startswith("HTTP 405"):
            raise UserError(f"server {self.root.public_url} offers no /tokenize to count tokens, which this task "
                            f"needs; {NO_TOKENIZER}")
        raise UserError(f"server {self.root.public_url}/tokenize: {result.error}")

    def _parse(self, raw: bytes) -> int:
        try:
            body = json.loads(raw)
            count = body["count"] if "count" in body else len(body["tokens"])
        except (ValueError, KeyError, TypeError):
            raise malformed(raw, self.root.scrub, "expected {\"count\": n} or {\"tokens\": [...]}") from None
        if not isinstance(count, int) or count < 0:
            raise malformed(raw, self.root.scrub, "count is not a token count")
        return count
