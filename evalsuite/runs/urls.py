"""What of a URL may be printed, logged or written to a file.

A URL given to evalsuite may carry a secret: `user:password@` in its address, a token among
its query values (`?api-key=...`, `?sig=...`), or, for a webhook, in its path (Slack's and
Discord's webhook URLs are their own secret). Every message, log line and file that names a
URL names `public_url(url)`: no credentials, every query value and any fragment replaced by
[redacted] (the query's keys stay, so the address is still recognisable). A message that
quotes what a library said about the URL goes through `scrub_url`, which blanks out each of
those secret parts wherever it appears.
"""

from __future__ import annotations

import urllib.parse

REDACTED = "[redacted]"
MIN_SCRUBBED = 4  # characters: a shorter part of a URL is not looked for in messages (`scrub_url`)


def _split(url: str) -> urllib.parse.SplitResult | None:
    try:
        return urllib.parse.urlsplit(url)
    except ValueError:  # an address urllib cannot take apart (a bracket left open)
        return None


def public_url(url: str, *, path: bool = True) -> str:
    """`url` with its user and password left out and its query values and fragment redacted;
    with `path=False`, its path redacted too (a webhook's path is its secret)."""
    parts = _split(url)
    if parts is None or not parts.scheme:
        return REDACTED  # nothing in it can be told apart from a secret
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: perhaps a password, in a URL cut wrong
        port = ""
    host = parts.hostname or ""
    netloc = f"[{host}]{port}" if ":" in host else f"{host}{port}"
    shown_path = parts.path if path or not parts.path.strip("/") else f"/{REDACTED}"
    query = "&".join(f"{segment.partition('=')[0]}={REDACTED}" if "=" in segment else REDACTED
                     for segment in parts.query.split("&") if segment)
    return urllib.parse.urlunsplit((parts.scheme, netloc, shown_path, query, REDACTED if parts.fragment else ""))


def url_secrets(url: str, *, path: bool = True) -> list[str]:
    """What `public_url(url, path=path)` leaves out of `url`, longest first: user, password,
    query values (a segment without `=` whole), fragment, and with `path=False` the path."""
    parts = _split(url)
    if parts is None:
        return [url]
    userinfo = parts.netloc.rpartition("@")[0]  # as given: a library may quote it so
    found = [userinfo, *userinfo.split(":", 1), parts.username or "", parts.password or "", parts.fragment,
             parts.query, *(segment.partition("=")[2] if "=" in segment else segment
                            for segment in parts.query.split("&"))]
    if not path and parts.path.strip("/"):
        found.append(parts.path)
    return sorted({piece for piece in found if piece}, key=len, reverse=True)


def scrub_url(text: str, url: str, *, path: bool = True) -> str:
    """`text` (a message that may quote `url` or a piece of it) with every part of `url` that
    `public_url(url, path=path)` leaves out replaced by [redacted], as given or percent-decoded.
    Parts shorter than MIN_SCRUBBED are left in the text: blanking every "1" of a message for
    `?page=1` would garble it, and so short a value is no secret (public_url drops them all)."""
    for secret in url_secrets(url, path=path):
        for form in {secret, urllib.parse.unquote(secret)}:
            if len(form) >= MIN_SCRUBBED:
                text = text.replace(form, REDACTED)
    return text
