"""A small JSON-over-HTTP client for OpenAI-compatible endpoints, shared by the `openai:`
judge and the `server:` backend. Standard library only (urllib, threads).

- Only http(s) base URLs with a host; a proxy from the environment is bypassed for
  loopback servers.
- Concurrency: `call_all` keeps at most `concurrency` requests in flight (a thread pool).
- Retries: 429, 5xx, timeouts, dropped connections and malformed bodies are retried
  with exponential backoff (jittered, honouring Retry-After).
- Outcomes instead of exceptions (`CallResult`): ok, rejected (a 400: this request only),
  malformed (retries used up on bad bodies), down (retries used up on an unreachable or
  failing endpoint), fatal (401/403/404: every request would fail), cancelled.
  After down or fatal no new request starts.
- The API key is read from an environment variable when the client is made and sent only in
  the Authorization header. A server may echo headers back: every text kept from a reply is
  scrubbed of the key before it is cut, and of any piece of it (8 or more of its characters
  in a row, in any letter case), so a key echoed in halves or upper-cased leaves nothing.
- Redirects are followed within the endpoint's origin (scheme, host and port) only; one to
  another origin is refused (fatal), so the Authorization header never reaches another server.
- A base URL may carry `user:password@` (sent as Basic authorization, unless an API key is
  given) and a token among its query values (kept at the end of every request's URL). Messages
  and files name the endpoint only as `runs.urls.public_url` shows it, and every text kept from
  a reply or an error is scrubbed of those parts too.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import random
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from evalsuite.errors import UserError
from evalsuite.runs.urls import public_url, scrub_url

MAX_DELAY = 60.0  # seconds: no single backoff wait is longer
ERROR_BODY_READ = 65536  # bytes of an error body read (and scrubbed) before it is cut for a message
FRAGMENT = 8  # this many of the key's characters in a row are a piece of it that must not be kept
KEY_TAIL = 256  # characters dropped from the end of a body cut at the read limit (longer than any key)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def check_http_url(url: str, option: str) -> None:
    """Only http(s) endpoints with a host: a file:// or malformed URL is refused before any request."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{option} must be an http:// or https:// URL with a host, got {public_url(url)!r}")


def joined(base_url: str, path: str) -> str:
    """`path` added to the path of `base_url`, whose query (a token some gateways take there) stays at the end."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def split_credentials(url: str) -> tuple[str, str | None]:
    """`url` without its user:password@ part, and that part as a Basic Authorization header
    value (None when there is none): urllib would take it for part of the host name."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    pair = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), "Basic " + base64.b64encode(pair.encode()).decode()


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port filled in for http and https."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: no origin equals it
        port = -1
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def redact(text: str, key: str | None) -> str:
    """`text` with every run of the key's characters at least FRAGMENT long (the whole key when it
    is shorter), compared without letter case, replaced by "[redacted]": a server may echo the key
    whole, in halves or upper-cased."""
    if not key:
        return text
    secret = key.translate(_ASCII_LOWER)  # ASCII only: a lowered text keeps its length and positions
    size = min(FRAGMENT, len(secret))
    pieces = {secret[i:i + size] for i in range(len(secret) - size + 1)}
    lowered = text.translate(_ASCII_LOWER)
    spans: list[list[int]] = []  # [start, end) of each run of pieces, overlapping ones merged
    for start in range(len(text) - size + 1):
        if lowered[start:start + size] in pieces:
            if spans and start <= spans[-1][1]:
                spans[-1][1] = start + size
            else:
                spans.append([start, start + size])
    out, kept = [], 0
    for start, end in spans:
        out += [text[kept:start], "[redacted]"]
        kept = end
    return "".join([*out, text[kept:]])


def excerpt(raw: bytes, scrub: Callable[[str], str], limit: int) -> str:
    """At most `limit` characters of a reply body for a message. Only its first ERROR_BODY_READ
    bytes are read; they are scrubbed before whitespace is collapsed and the text is cut, so no
    cut leaves a piece of the key; and where the body went on past them, their last KEY_TAIL
    characters are dropped (they may hold the start of a key, too few characters to recognise)."""
    text = raw[:ERROR_BODY_READ].decode("utf-8", "replace")
    if len(raw) > ERROR_BODY_READ:
        text = text[:len(text) - KEY_TAIL]
    return " ".join(scrub(text).split())[:limit]


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, within the request's origin only: its own handler copies every
    header, the Authorization header with the key included, to wherever a server points."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if origin(newurl) != origin(req.full_url):
            fp.close()
            raise Fatal(f"HTTP {code}: the endpoint redirects to another origin, {public_url(newurl)}; "
                        "the API key is never sent there (give that address as the base URL if it is the "
                        "endpoint)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class CallResult:
    """How one request ended after its retries; `content` is what the parser made of the body."""

    outcome: str  # ok | rejected | malformed | down | fatal | cancelled
    content: Any = None
    error: str = ""
    attempts: int = 0


class Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, malformed: bool = False):
        super().__init__(reason)
        self.retry_after = retry_after
        self.malformed = malformed


class Rejected(Exception):
    """The endpoint refused this one request (e.g. 400): retrying will not help."""


class Fatal(Exception):
    """The endpoint refuses every request (bad key, wrong address): stop."""


@dataclass(frozen=True)
class HttpSettings:
    """How to reach an endpoint. Holds the *name* of the environment variable with the key."""

    base_url: str
    api_key_env: str = ""  # "" -> no Authorization header
    retries: int = 5
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    timeout: float = 120.0
    user_agent: str = "evalsuite"
    not_found_hint: str = "check the base URL"  # what a 404 tells the user to check


class HttpClient:
    def __init__(self, settings: HttpSettings):
        self.settings = settings
        self.base_url, self._basic = split_credentials(settings.base_url.rstrip("/"))
        self._key = (os.environ.get(settings.api_key_env) or None) if settings.api_key_env else None
        # a proxy from the environment must not capture requests to a server on this machine
        handlers: list[urllib.request.BaseHandler] = [SameOriginRedirects()]
        if is_loopback(self.base_url):
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)
        self.public_url = self.public()

    def public(self, path: str = "") -> str:
        """The address of base_url + `path` as messages and files show it (`runs.urls.public_url`)."""
        return public_url(joined(self.base_url, path))

    def scrub(self, text: str) -> str:
        """`text` with the API key and every piece of it blanked out (`redact`), and the base
        URL's credentials and query values (`runs.urls.scrub_url`)."""
        return scrub_url(redact(text, self._key), self.settings.base_url)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": self.settings.user_agent}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        elif self._basic:
            headers["Authorization"] = self._basic
        return headers

    # ---- one attempt -------------------------------------------------------------------------

    def send(self, url: str, body: bytes | None) -> bytes:
        """The raw body of one POST (or GET when `body` is None), or the exception that says
        what went wrong: Retryable, Rejected or Fatal, with the key scrubbed."""
        request = urllib.request.Request(url, data=body, method="GET" if body is None else "POST",
                                         headers=self._headers())
        try:
            with self._opener.open(request, timeout=self.settings.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                raise Retryable(f"timed out after {self.settings.timeout:g}s") from None
            raise Retryable(self.scrub(f"connection failed ({reason or type(exc).__name__})")) from None

    def _http_error(self, exc: urllib.error.HTTPError) -> Exception:
        try:  # one byte past the read limit tells whether the body went on
            detail = excerpt(exc.read(ERROR_BODY_READ + 1), self.scrub, 300)
        except (OSError, http.client.HTTPException):
            detail = ""
        status = f"HTTP {exc.code}" + (f": {detail}" if detail else "")
        if exc.code == 429 or exc.code >= 500:
            return Retryable(status, retry_after=_retry_after(exc.headers.get("Retry-After") if exc.headers else None))
        if exc.code in (401, 403):
            return Fatal(f"{status}; the endpoint refused the API key (read from ${self.settings.api_key_env})")
        if exc.code == 404:
            return Fatal(f"{status}; {self.settings.not_found_hint}")
        return Rejected(status)

    # ---- retries and concurrency -----------------------------------------------------------

    def call(self, path: str, body: bytes | None, parse: Callable[[bytes], Any],
             stop: threading.Event | None = None) -> CallResult:
        """One request to base_url + path with its retries; never raises for HTTP trouble.
        `parse` turns a body into content, raising Retryable(malformed=True) for a bad one."""
        stop = stop or threading.Event()
        attempts = 1 + self.settings.retries
        last: Retryable | None = None
        for attempt in range(1, attempts + 1):
            if stop.is_set():
                return CallResult("cancelled", attempts=attempt - 1)
            try:
                return CallResult("ok", content=parse(self.send(joined(self.base_url, path), body)), attempts=attempt)
            except Retryable as exc:
                last = exc
            except Rejected as exc:
                return CallResult("rejected", error=self.scrub(str(exc)), attempts=attempt)
            except Fatal as exc:
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

    def call_all(self, path: str, bodies: Sequence[bytes], parse: Callable[[bytes], Any],
                 concurrency: int) -> Iterator[tuple[int, CallResult]]:
        """(index, result) of each body, as each finishes, at most `concurrency` in flight.
        After a down or fatal result, requests not yet started are dropped; those in
        flight finish and are still yielded."""
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures: dict[Future, int] = {pool.submit(self.call, path, body, parse, stop): i
                                          for i, body in enumerate(bodies)}
            try:
                for future in as_completed(futures):
                    if future.cancelled():
                        continue
                    result: CallResult = future.result()
                    if result.outcome in ("down", "fatal"):
                        for other in futures:
                            other.cancel()
                    yield futures[future], result
            finally:
                stop.set()


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # the HTTP-date form: fall back to our own backoff
        return None


def json_body(payload: dict[str, Any]) -> bytes:
    """A request body, sorted so that equal requests are equal bytes (cache keys)."""
    return json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")


def malformed(raw: bytes, scrub: Callable[[str], str], why: str = "") -> Retryable:
    """A retryable fault for a body that cannot be read, with a short scrubbed excerpt."""
    shown = excerpt(raw, scrub, 120)
    return Retryable(f"malformed response body{f' ({why})' if why else ''}: {shown!r}", malformed=True)
