"""A real OpenAI-compatible completions server on 127.0.0.1, in a thread, backed by a real model.

It serves an evalsuite hf model (toy-base in the tests) the way vLLM serves one:

    GET  /v1/models        {"data": [{"id", "root", "max_model_len"}]}
    POST /v1/completions   greedy text (temperature 0, stop, max_tokens); with echo + logprobs,
                           the prompt's tokens with their log-probs, BOS first ("<bos>", None),
                           then `max_tokens` greedy tokens, as vLLM echoes them
    POST /tokenize         {"count", "tokens", "max_model_len"}

Modes make it a lesser server: `echo=False` ignores echo and sends no logprobs (llama.cpp-like),
`echo_status=400` refuses echo requests, `tokenize=False` has no /tokenize, `models=False` no
/v1/models, `fixed_count` and `count_times` make /tokenize count nonsense. It records every request's body and headers,
and in `seen` its method, path (with its query: a token in the base URL arrives there) and headers.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import torch
from chat_server import LoopbackServer, route

from evalsuite.types import GenerationRequest


@dataclass
class Modes:
    echo: bool = True
    echo_status: int = 200
    tokenize: bool = True
    models: bool = True
    error_status: int = 0  # answer every completion with this status, echoing the Authorization header
    fixed_count: int | None = None  # /tokenize answers this count whatever the text (a broken server)
    count_times: int = 1  # /tokenize multiplies its counts by this (a server that counts far too many)


class CompletionsServer(LoopbackServer):
    def __init__(self, model: Any, served_name: str = "toy-base", modes: Modes | None = None):
        self.model = model  # an evalsuite HFModel
        self.served_name = served_name
        self.modes = modes or Modes()
        self._model_lock = threading.Lock()  # the model's prefix cache is not thread-safe
        super().__init__(self._handler())

    # ---- answers ---------------------------------------------------------------------------

    def models(self) -> tuple[int, dict]:
        if not self.modes.models:
            return 404, {"error": "not found"}
        return 200, {"object": "list", "data": [{"id": self.served_name, "object": "model", "root": "/models/toy-base",
                                                 "max_model_len": self.model.max_context}]}

    def tokenize(self, body: dict) -> tuple[int, dict]:
        if not self.modes.tokenize:
            return 404, {"error": "not found"}
        ids = self.model.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        count = len(ids) * self.modes.count_times if self.modes.fixed_count is None else self.modes.fixed_count
        return 200, {"count": count, "tokens": ids, "max_model_len": self.model.max_context}

    def completions(self, body: dict, headers: dict) -> tuple[int, dict]:
        if self.modes.error_status:
            return self.modes.error_status, {"error": "bad request", "headers": headers.get("Authorization", "")}
        if body.get("model") != self.served_name:
            return 404, {"error": f"model {body.get('model')} does not exist"}
        echo = body.get("echo") and self.modes.echo
        if body.get("echo") and self.modes.echo_status != 200:
            return self.modes.echo_status, {"error": "echo is not supported"}
        with self._model_lock:
            choice = self._echo(body) if echo else self._generate(body)
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": self.served_name, "choices": [choice]}

    def _generate(self, body: dict) -> dict:
        request = GenerationRequest(prompt=body["prompt"], max_new_tokens=body["max_tokens"],
                                    stop=tuple(body.get("stop") or ()))
        text = self.model.generate([request])[0]
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}

    @torch.inference_mode()
    def _echo(self, body: dict) -> dict:
        """The prompt's tokens and log-probs, then max_tokens greedy tokens, as vLLM echoes them."""
        tokenizer, top_n = self.model.tokenizer, int(body.get("logprobs") or 0)
        ids = tokenizer(body["prompt"])["input_ids"]
        prompt_length = len(ids)
        for _ in range(body.get("max_tokens", 0)):
            ids.append(int(self._logprobs(ids)[-1].argmax()))
        logits = self._logprobs(ids)
        texts = [tokenizer.decode([i]) for i in ids]
        token_logprobs: list[float | None] = [None] + [float(logits[p - 1, ids[p]]) for p in range(1, len(ids))]
        top: list[dict | None] = [None]
        for p in range(1, len(ids)):
            values, indices = logits[p - 1].topk(top_n)
            top.append({tokenizer.decode([int(i)]): float(v) for v, i in zip(values, indices)})
        offsets = [sum(len(t) for t in texts[:p]) for p in range(len(texts))]
        return {"index": 0, "text": body["prompt"] + tokenizer.decode(ids[prompt_length:]), "finish_reason": "length",
                "logprobs": {"tokens": texts, "token_logprobs": token_logprobs, "text_offset": offsets,
                             "top_logprobs": top}}

    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        return self.model.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)

    # ---- HTTP ------------------------------------------------------------------------------

    def post(self, path: str, body: dict, headers: dict) -> tuple[int, dict, dict[str, str]]:
        """The reply to a POST on `path`: status, payload and extra headers (a subclass adds routes)."""
        if path == "/v1/completions":
            return (*self.completions(body, headers), {})
        if path == "/tokenize":
            return (*self.tokenize(body), {})
        return 404, {"error": "not found"}, {}

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, payload: dict,
               headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(raw)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.headers.append(dict(self.headers.items()))
                server.seen.append(("GET", self.path, dict(self.headers.items())))
                if route(self.path) == "/v1/models":
                    server._reply(self, *server.models())
                else:
                    server._reply(self, 404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                headers = dict(self.headers.items())
                server.bodies.append(body)
                server.headers.append(headers)
                server.seen.append(("POST", self.path, dict(self.headers.items())))
                server._reply(self, *server.post(route(self.path), body, headers))

            def log_message(self, *args: object) -> None:
                pass  # keep test output clean

        return Handler
