"""The `openai:<model>` judge: any OpenAI-compatible chat-completions endpoint over HTTP.

Standard library only (urllib, threads, sqlite3), so no extra package is needed.

- Concurrency: at most `concurrency` requests in flight (a thread pool).
- Retries: 429, 5xx, timeouts, dropped connections and malformed bodies are
  retried with exponential backoff (jittered, honouring Retry-After).
- A request that still fails for a sample-level reason (a malformed body, a
  400) is recorded as that sample's judge error and the run goes on. An
  endpoint that stays down (every attempt refused, 5xx, 429 or timed out) or
  rejects the key (401/403) or the address (404) stops the run with one clear
  message; what was judged is kept.
- Cache: sqlite, keyed by the endpoint plus the full request body (which holds
  the judge model), so one model's answer is never served for another.
- The API key is read from an environment variable when the judge is made,
  sent only in the Authorization header, and scrubbed from anything recorded.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import os
import random
import sqlite3
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from . import (
    SYSTEM,
    JudgeItem,
    JudgeSettings,
    JudgeUnavailable,
    Verdict,
    error_verdict,
    judge_prompt,
    verdict_from_text,
)

MAX_DELAY = 60.0  # seconds: no single backoff wait is longer
ERROR_BODY_READ = 65536  # bytes of an error body read (and scrubbed) before it is cut for the record


class ResponseCache:
    """Judge responses on disk: sha256(endpoint + request body) -> response text."""

    def __init__(self, path: Path):
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=30)
            self.db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, content TEXT NOT NULL)")
            self.db.commit()
        except (sqlite3.Error, OSError) as exc:
            raise UserError(f"--judge-cache {path} is not a usable sqlite file: {exc}") from None

    @staticmethod
    def key(endpoint: str, body: bytes) -> str:
        return hashlib.sha256(endpoint.encode() + b"\n" + body).hexdigest()

    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT content FROM responses WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, content: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO responses (key, content) VALUES (?, ?)", (key, content))
        self.db.commit()

    def close(self) -> None:
        self.db.close()


@dataclass(frozen=True)
class CallResult:
    """How one request ended after its retries."""

    outcome: str  # ok | rejected | malformed | down | fatal | cancelled
    content: str = ""
    error: str = ""
    attempts: int = 0


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, malformed: bool = False):
        super().__init__(reason)
        self.retry_after = retry_after
        self.malformed = malformed


class _Rejected(Exception):
    """The endpoint refused this one request (e.g. 400): retrying will not help."""


class _Fatal(Exception):
    """The endpoint refuses every request (bad key, wrong address): stop the run."""


def _without_credentials(url: str) -> str:
    """`url` fit for files and messages: any user:password@ part removed."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIJudge:
    heuristic = False

    def __init__(self, settings: JudgeSettings, cache_path: Path):
        self.settings = settings
        self.name = settings.name
        self.label = settings.name
        self.model = settings.spec.partition(":")[2].strip()
        self.endpoint = settings.endpoint
        self.url = f"{self.endpoint}/chat/completions"
        self._key = os.environ.get(settings.api_key_env) or None
        self.cache = ResponseCache(cache_path)
        # a proxy from the environment must not capture requests to a server on this machine
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self.public_endpoint = _without_credentials(self.endpoint)
        self.public_settings = {"endpoint": self.public_endpoint, "model": self.model, "max_tokens": settings.max_tokens,
                                "api_key_env": settings.api_key_env}

    # ---- requests --------------------------------------------------------------------------

    def request_body(self, item: JudgeItem) -> bytes:
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": judge_prompt(item)}],
            "temperature": 0,
        }
        if self.settings.max_tokens:
            body["max_tokens"] = self.settings.max_tokens
        return json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "evalsuite-judge"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def scrub(self, text: str) -> str:
        """`text` with the API key blanked out: a server may echo headers back in an error."""
        return text.replace(self._key, "[redacted]") if self._key else text

    # ---- judging ---------------------------------------------------------------------------

    def judge(self, items: Sequence[JudgeItem], on_verdict: Callable[[Verdict], None]) -> None:
        pending = []
        for item in items:
            body = self.request_body(item)
            key = ResponseCache.key(self.endpoint, body)
            digest = hashlib.sha256(body).hexdigest()
            cached = self.cache.get(key)
            if cached is not None:
                on_verdict(verdict_from_text(item.id, self.name, cached, cached=True, request_sha256=digest))
            else:
                pending.append((item, body, key, digest))
        if pending:
            self._judge_pending(pending, on_verdict)

    def _judge_pending(self, pending: list, on_verdict: Callable[[Verdict], None]) -> None:
        stop = threading.Event()
        failure = ""
        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            futures: dict[Future, tuple] = {pool.submit(self._call, body, stop): (item, key, digest)
                                            for item, body, key, digest in pending}
            try:
                for future in as_completed(futures):
                    if future.cancelled():
                        continue
                    item, key, digest = futures[future]
                    result: CallResult = future.result()
                    extra = {"attempts": result.attempts, "request_sha256": digest}
                    if result.outcome == "ok":
                        self.cache.put(key, result.content)
                        on_verdict(verdict_from_text(item.id, self.name, result.content, **extra))
                    elif result.outcome in ("rejected", "malformed", "down"):
                        on_verdict(error_verdict(item.id, self.name, result.error, **extra))
                    if result.outcome in ("down", "fatal") and not failure:
                        failure = result.error  # requests in flight finish and are kept
                        for other in futures:
                            other.cancel()
            finally:
                stop.set()
        if failure:
            raise JudgeUnavailable(f"judge endpoint {self.public_endpoint}: {failure}")

    def _call(self, body: bytes, stop: threading.Event) -> CallResult:
        """One request with its retries; never raises for HTTP trouble."""
        attempts = 1 + self.settings.retries
        last: _Retryable | None = None
        for attempt in range(1, attempts + 1):
            if stop.is_set():
                return CallResult("cancelled", attempts=attempt - 1)
            try:
                return CallResult("ok", content=self.scrub(self._post(body)), attempts=attempt)
            except _Retryable as exc:
                last = exc
            except _Rejected as exc:
                return CallResult("rejected", error=self.scrub(str(exc)), attempts=attempt)
            except _Fatal as exc:
                stop.set()  # at once, from this thread: no other request starts after this
                return CallResult("fatal", error=self.scrub(str(exc)), attempts=attempt)
            if attempt < attempts:
                stop.wait(self._delay(attempt, last.retry_after))
        assert last is not None
        outcome = "malformed" if last.malformed else "down"
        if outcome == "down":
            stop.set()  # the endpoint is down: no other request starts after this
        error = f"{last} (after {attempts} attempt{'s' if attempts > 1 else ''})"
        return CallResult(outcome, error=self.scrub(error), attempts=attempts)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        # jitter spreads the retries of concurrent requests so they do not all land at once
        delay = min(MAX_DELAY, self.settings.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_DELAY))
        return delay

    def _post(self, body: bytes) -> str:
        """The response text of one request, or the exception that says what went wrong."""
        request = urllib.request.Request(self.url, data=body, method="POST", headers=self._headers())
        try:
            with self._opener.open(request, timeout=self.settings.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                raise _Retryable(f"timed out after {self.settings.timeout:g}s") from None
            raise _Retryable(f"connection failed ({reason or type(exc).__name__})") from None
        return _content(raw, self.scrub)

    def _http_error(self, exc: urllib.error.HTTPError) -> Exception:
        try:  # scrub the whole body first, then cut: a key straddling the cut must not leave a fragment
            detail = " ".join(self.scrub(exc.read(ERROR_BODY_READ).decode("utf-8", "replace")).split())[:300]
        except (OSError, http.client.HTTPException):
            detail = ""
        status = f"HTTP {exc.code}" + (f": {detail}" if detail else "")
        if exc.code == 429 or exc.code >= 500:
            return _Retryable(status, retry_after=_retry_after(exc.headers.get("Retry-After") if exc.headers else None))
        if exc.code in (401, 403):
            return _Fatal(f"{status}; the endpoint refused the API key (read from ${self.settings.api_key_env})")
        if exc.code == 404:
            return _Fatal(f"{status}; check --judge-base-url and the judge model name {self.model!r}")
        return _Rejected(status)

    def close(self) -> None:
        self.cache.close()


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # the HTTP-date form: fall back to our own backoff
        return None


def _content(raw: bytes, scrub: Callable[[str], str]) -> str:
    """choices[0].message.content of a chat-completions response. An empty or cut-off body
    (a proxy's glitch) is a retryable fault, never an answer: it must not be cached."""
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        excerpt = " ".join(scrub(raw.decode("utf-8", "replace")).split())[:120]
        raise _Retryable(f"malformed response body: {excerpt!r}", malformed=True) from None
    if not isinstance(content, str):
        raise _Retryable("malformed response body: message content is not text", malformed=True)
    if not content.strip():
        raise _Retryable("empty response: the message content is blank", malformed=True)
    return content
