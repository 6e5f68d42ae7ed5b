"""A failed gate posted to a webhook as Slack-compatible JSON (`evalsuite watch --webhook URL`).

The body is what Slack's incoming webhooks take, and what Mattermost, Discord's `/slack`
endpoints and most chat bridges accept too: `text` (the one-line verdict, the fallback every
client shows) and `blocks` (the verdict, then the offending cells, one per line, in mrkdwn).
A webhook that cannot be reached is a warning: the checkpoint's records are safe on disk. The
warning names the webhook by its scheme and host only: a webhook URL's path and query are its
secret (Slack's and Discord's carry the token there), and `user:password@` is sent as Basic
authorization, never shown.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from evalsuite.backends.common.http import split_credentials
from evalsuite.errors import UserError
from evalsuite.runs.urls import public_url, scrub_url

MAX_LINES = 20  # offending cells listed in one message; the rest are counted
TIMEOUT_S = 10.0


def check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--webhook takes an http:// or https:// URL, got {public_url(url, path=False)!r}")
    return url


def message(verdict: str, cells: Sequence[str]) -> dict[str, Any]:
    """The Slack body: `text` holds the verdict, `blocks` the verdict and each offending cell."""
    shown = list(cells[:MAX_LINES])
    if len(cells) > MAX_LINES:
        shown.append(f"... and {len(cells) - MAX_LINES} more")
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{verdict}*"}}]
    if shown:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(shown)}})
    return {"text": verdict, "blocks": blocks}


def post(url: str, body: dict[str, Any]) -> bool:
    """POST `body` as JSON (a `user:password@` in the URL as Basic authorization); False, and a
    warning line naming only the webhook's host (`public_url`), when the webhook did not take it."""
    address, basic = split_credentials(url)
    headers = {"Content-Type": "application/json", **({"Authorization": basic} if basic else {})}
    request = urllib.request.Request(address, data=json.dumps(body).encode("utf-8"), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        said = f"HTTP {exc.code} {exc.reason}" if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        why = scrub_url(str(said or exc), url, path=False)
        print(f"warning: webhook {public_url(url, path=False)} did not take the gate's message: {why}",
              file=sys.stderr)
        return False
    return True
