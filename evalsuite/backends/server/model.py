"""The `server` adapter: a model served behind an OpenAI-compatible `/v1/completions` endpoint, or
its `/v1/chat/completions` (`-M api=chat`), where the server applies the model's chat template."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from evalsuite.backends.common.chat import user_turn
from evalsuite.backends.common.checkpoint import vocabulary_sha256
from evalsuite.backends.common.http import HttpClient, HttpSettings, check_http_url, json_body, malformed
from evalsuite.backends.common.tokens import move_trailing_whitespace
from evalsuite.errors import UserError, unknown
from evalsuite.params import build_params
from evalsuite.types import GenerationRequest, Loglikelihood, LoglikelihoodRequest

from .api import APIS, prompt_tokens
from .echo import EchoMismatch, NoPromptLogprobs, continuation_loglikelihood, echoed_tokens
from .tokens import ServerTokenCounter, load_tokenizer, local_counter


@dataclass(frozen=True)
class ServerOptions:
    name = "server model"
    base_url: str = ""  # e.g. http://127.0.0.1:8000/v1
    api: str = "completions"  # or "chat": /v1/chat/completions, the server's chat template around each prompt
    api_key_env: str = ""  # the environment variable holding the key; "" sends none
    concurrency: int = 8  # requests in flight
    retries: int = 3
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    timeout: float = 600.0  # seconds per request: a long prompt's prefill can take a while
    max_context: int = 0  # 0: the server's max_model_len from /v1/models
    tokenizer: str = ""  # folder, hub id or named model whose tokenizer counts tokens; "": the server's /tokenize
    counts: str = ""  # "usage": count tokens by a one-token request's usage.prompt_tokens (no /tokenize needed)
    chat_template: bool = False  # wrap prompts in the tokenizer's chat template (rendered here)
    echo_max_tokens: int = 1  # max_tokens of a log-likelihood request: 1 suits every server, 0 some

    def __post_init__(self) -> None:
        if not self.base_url:
            raise UserError("the server backend needs -M base_url=http://HOST:PORT/v1")
        check_http_url(self.base_url, "-M base_url")
        if self.concurrency < 1 or self.retries < 0 or self.backoff < 0 or self.timeout <= 0:
            raise UserError("-M concurrency must be >= 1, retries and backoff >= 0, timeout > 0")
        if self.max_context < 0 or self.echo_max_tokens not in (0, 1):
            raise UserError("-M max_context must be >= 0 and -M echo_max_tokens 0 or 1")
        if self.api not in APIS:
            raise unknown("-M api", self.api, APIS)
        if self.counts not in ("", "usage"):
            raise unknown("-M counts", self.counts, ["usage"])
        if self.counts and self.tokenizer:
            raise UserError("give -M tokenizer=... or -M counts=usage, not both: each is a way to count tokens")
        if self.chat_template and self.api == "chat":
            raise UserError("-M chat_template=true renders a template for /v1/completions; with -M api=chat "
                            "the server applies the model's own")
        if self.chat_template and not self.tokenizer:
            raise UserError("-M chat_template=true needs -M tokenizer=... (the template is rendered here: "
                            "/v1/completions takes plain text)")


def _without_v1(base_url: str) -> str:
    """The server's root, where vLLM answers /tokenize: the base URL without its final /v1 (its query kept)."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=re.sub(r"/v1/?$", "", parts.path)))


NO_ECHO = ("log-likelihood tasks need prompt log-probabilities (echo=true with logprobs, as vLLM gives), "
           "which server {url} does not return ({why}); generation tasks still run on it")
NO_CHAT_LOGPROBS = ("log-likelihood tasks and answer sets need prompt log-probabilities, which the chat API "
                    "(-M api=chat) does not return; serve the model's /v1/completions with echo (vLLM) and "
                    "leave -M api out. Generation tasks run through the chat API")


class ServerModel:
    """No capability beyond generate and loglikelihood: a server shows no weights, activations or token ids."""

    def __init__(self, model: str, options: ServerOptions, label: str | None):
        self.model = model
        self.options = options
        self.name = label or re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "server"
        self.api = APIS[options.api]
        # with the chat API the task's plain prompt is the user's message and the server adds the
        # template: the prompt is built as plain text, as for /v1/completions without a template
        self.chat_template = options.chat_template
        settings = HttpSettings(base_url=options.base_url, api_key_env=options.api_key_env, retries=options.retries,
                                backoff=options.backoff, timeout=options.timeout, user_agent="evalsuite-server",
                                not_found_hint=f"check -M base_url and the served model name {model!r}")
        self.client = HttpClient(settings)
        self.served = self._served_model()
        self.max_context = options.max_context or int(self.served.get("max_model_len") or 0)
        if not self.max_context:
            raise UserError(f"server {self.client.public_url} does not report its context length; "
                            "give -M max_context=TOKENS")
        self.tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer else None
        self.local_count = (local_counter(self.tokenizer, options.tokenizer, self.api.name == "chat", self.chat_template)
                            if self.tokenizer is not None else None)
        self.counter = self._server_counter(settings)

    # ---- what is served ------------------------------------------------------------------

    def _served_model(self) -> dict[str, Any]:
        """The server's entry for our model from GET /models ({} when the server lists none).
        Reaching the server here makes a wrong address fail at load, in one line."""
        result = self.client.call("/models", None, self._parse_json)
        if result.outcome in ("down", "fatal") and not result.error.startswith("HTTP 404"):
            raise UserError(f"server {self.client.public_url}: {result.error}")
        data = result.content.get("data") if result.outcome == "ok" and isinstance(result.content, dict) else None
        entries = [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)] if isinstance(data, list) else []
        if not entries:
            return {}
        match = [e for e in entries if e["id"] == self.model]
        if not match:
            raise unknown(f"model on server {self.client.public_url}", self.model, [e["id"] for e in entries])
        return match[0]

    def fingerprint(self) -> dict[str, Any]:
        """What answers: the address (no credentials), the API, the served model as the server
        reports it, the tokenizer that counts tokens, and who applies a chat template: "server"
        with the chat API, with the tokens it adds around an empty message. Concurrency, retries
        and timeouts change no output."""
        chat = self.api.name == "chat"
        return {
            "backend": "server",
            "name": self.name,
            "model": self.model,
            "base_url": self.client.public_url,
            "api": self.api.name,
            "served_model": {k: self.served[k] for k in ("id", "root", "max_model_len") if k in self.served} or None,
            "tokenizer": self.options.tokenizer or ("server usage" if self.options.counts else "server /tokenize"),
            "tokenizer_sha256": vocabulary_sha256(self.tokenizer) if self.tokenizer is not None else None,
            "chat_template": "server" if chat else self.chat_template,
            **({"template_tokens": self._template_tokens()} if chat else {}),
            "max_context": self.max_context,
        }

    def _template_tokens(self) -> int | None:
        """Tokens the server's chat template puts around a message: the count of an empty one
        (None where nothing here can count: a task that counts is refused when it starts)."""
        try:
            return self.count_tokens("")
        except UserError:
            return None

    # ---- tokens --------------------------------------------------------------------------

    def _server_counter(self, settings: HttpSettings) -> ServerTokenCounter:
        """Counts asked of the server: /tokenize at its root (beside /v1), or a one-token request's usage."""
        chat = self.api.name == "chat"
        if self.options.counts == "usage":
            return ServerTokenCounter(self.client, self.api.path, template=chat, usage=True, fields=lambda text: {
                "model": self.model, **self.api.prompt(text), "max_tokens": 1, "temperature": 0})
        root = HttpClient(replace(settings, base_url=_without_v1(settings.base_url)))
        return ServerTokenCounter(root, "/tokenize", template=chat, fields=lambda text: {
            "model": self.model, **self.api.tokenize_fields(text, add_special_tokens=not self.chat_template)})

    def count_tokens(self, text: str) -> int:
        if self.local_count is None:
            return self.counter.count(text)
        return self.local_count(text)

    def _check_served_length(self, text: str, served: int | None) -> None:
        """With the chat API, a prompt whose tokens were counted here must be as long as the server
        read it (its usage.prompt_tokens): a record's prompt_tokens and length say what the model
        saw, and the template that counts here is not the one that wraps the prompt there. A local
        tokenizer whose chat template differs from the server's is caught here."""
        if self.api.name != "chat" or served is None:
            return
        local = self.local_count
        counted = local(text) if local is not None else self.counter.known(text)
        if counted is None or served == counted:
            return
        by, fix = ((f"-M tokenizer={self.options.tokenizer}", "leave -M tokenizer out to count with the server's "
                    "/tokenize, or give -M counts=usage") if local else
                   (f"the server's {self.counter.path}", "give -M counts=usage to count by usage itself"))
        raise UserError(f"server {self.client.public_url} read {served} tokens (usage.prompt_tokens) in a prompt "
                        f"counted as {counted} by {by}, so prompts would miss their lengths; {fix}")

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        # ServerOptions refuses chat_template without a tokenizer
        return user_turn(self.tokenizer, self.chat_template, user, assistant_prefix)

    # ---- generation ----------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """Greedy text for open requests; for a closed answer set, the choice with the highest
        log-likelihood (the log-likelihood path: it needs a server that echoes prompt log-probs)."""
        outputs = [""] * len(requests)
        open_ = [i for i, r in enumerate(requests) if not r.choices]
        bodies = [self._generation_body(requests[i]) for i in open_]
        for i, (choice, served) in zip(open_, self._post_all(bodies, "")):
            self._check_served_length(requests[i].prefix + requests[i].prompt, served)
            outputs[i] = _cut_at_stop(self.api.text_of(choice), requests[i].stop)
        closed = [i for i, r in enumerate(requests) if r.choices]
        for i, answer in zip(closed, self._likeliest_choices([requests[i] for i in closed])):
            outputs[i] = answer
        return outputs

    def _generation_body(self, request: GenerationRequest) -> bytes:
        body: dict[str, Any] = {"model": self.model, **self.api.prompt(request.prefix + request.prompt),
                                "max_tokens": request.max_new_tokens, "temperature": 0}
        if request.stop:
            body["stop"] = list(request.stop)
        return json_body(body)

    def _likeliest_choices(self, requests: Sequence[GenerationRequest]) -> list[str]:
        scored = [(r, c) for r in requests for c in r.choices or ()]
        results = iter(self.loglikelihood([LoglikelihoodRequest(context=r.prompt, continuation=c, prefix=r.prefix)
                                           for r, c in scored]))
        answers = []
        for request in requests:
            logprobs = [next(results).logprob for _ in request.choices or ()]
            answers.append((request.choices or ())[logprobs.index(max(logprobs))])  # ties: the first choice
        return answers

    # ---- log-likelihood ------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        if self.api.name == "chat" and requests:
            raise UserError(NO_CHAT_LOGPROBS)
        split = [_split_continuation(r) for r in requests]
        bodies = [json_body({"model": self.model, "prompt": context + continuation, "echo": True, "logprobs": 1,
                             "max_tokens": self.options.echo_max_tokens, "temperature": 0})
                  for context, continuation in split]
        results = []
        for (context, continuation), (choice, _) in zip(split, self._post_all(bodies, NO_ECHO)):
            try:
                results.append(continuation_loglikelihood(echoed_tokens(choice), context + continuation, len(context)))
            except NoPromptLogprobs as exc:
                raise UserError(NO_ECHO.format(url=self.client.public_url, why=exc)) from None
            except EchoMismatch as exc:
                raise UserError(f"server {self.client.public_url}: {exc}") from None
        return results

    # ---- HTTP ----------------------------------------------------------------------------

    def _post_all(self, bodies: Sequence[bytes], refused: str) -> list[tuple[dict[str, Any], int | None]]:
        """(choices[0], usage.prompt_tokens) of each response, in order. Any failure stops the call
        with one line: an adapter has no slot for one request's error, and the run resumes where it
        stopped. `refused`: the message for a request the server rejects (400), with {url} and {why}."""
        out: list[tuple[dict[str, Any], int | None]] = [({}, None)] * len(bodies)
        for index, result in self.client.call_all(self.api.path, bodies, self._parse_choice, self.options.concurrency):
            if result.outcome == "rejected" and refused:
                raise UserError(refused.format(url=self.client.public_url, why=result.error))
            if result.outcome != "ok":
                raise UserError(f"server {self.client.public_url}: {result.error}")
            out[index] = result.content
        return out

    def _parse_json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep to read
            raise malformed(raw, self.client.scrub) from None

    def _parse_choice(self, raw: bytes) -> tuple[dict[str, Any], int | None]:
        body = self._parse_json(raw)
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed(raw, self.client.scrub, "no choices")
        return choices[0], prompt_tokens(body)


def load_server(rest: str, raw_options: dict[str, str], label: str | None) -> ServerModel:
    if not rest.strip():
        raise UserError("the server backend needs the served model's name: --model server:MODEL_NAME")
    return ServerModel(rest.strip(), build_params(ServerOptions, raw_options, flag="-M"), label)


def _split_continuation(request: LoglikelihoodRequest) -> tuple[str, str]:
    """(prefix + context, continuation) with the context's trailing whitespace moved to the
    continuation, as lm-eval and the hf backend split them, so tokens do not straddle the cut."""
    if not request.continuation:
        raise UserError("empty continuation")
    return move_trailing_whitespace(request.prefix + request.context, request.continuation)


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Text up to the first stop string: servers differ in whether they cut, and where."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text
