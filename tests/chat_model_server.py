"""A real OpenAI-compatible chat-completions server on 127.0.0.1, in a thread, backed by a real model.

It serves an evalsuite hf model (toy-base in the tests) the way vLLM serves an instruct model:

    GET  /v1/models             {"data": [{"id", "root", "max_model_len"}]}
    POST /v1/chat/completions   the messages rendered in the server's chat template (`TEMPLATE`:
                                BOS, role markers, the assistant's turn opened), tokenized without
                                further special tokens; greedy tokens (the hf backend's generation)
                                to max_tokens, EOS or a stop string; `usage.prompt_tokens` is the
                                rendered prompt's length
    POST /tokenize              {"count", "tokens"} of `messages` rendered the same way (or of a plain
                                `prompt`, special tokens as asked)

Modes make it a lesser or flakier server: `failures` answers the first chat requests with those
statuses (429, 503...; `Retry-After: 0`), `tokenize=False` has no /tokenize, `fixed_count` makes it
count nonsense, `usage=False` sends no usage. It records every request's body in `bodies`, its
method and path in `seen`, and in `answers` each chat request's prompt length and the text it answered.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

from completions_server import CompletionsServer

from evalsuite.types import GenerationRequest

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@dataclass
class ChatModes:
    failures: tuple[int, ...] = ()  # statuses of the first chat requests, before it answers
    tokenize: bool = True
    usage: bool = True
    fixed_count: int | None = None  # /tokenize answers this count whatever the text (a broken server)


@dataclass(frozen=True)
class Answer:
    content: str  # the user's message
    prompt_tokens: int  # the rendered prompt's tokens, as the model read them
    text: str  # what the server answered


def with_template(tokenizer: Any, template: str = TEMPLATE) -> Any:
    """A copy of `tokenizer` with `template` as its chat template (the toy models have none)."""
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = template
    return templated


class ChatModelServer(CompletionsServer):
    def __init__(self, model: Any, served_name: str = "toy-base", modes: ChatModes | None = None,
                 template: str = TEMPLATE):
        self.chat_modes = modes or ChatModes()
        self.tokenizer = with_template(model.tokenizer, template)
        self.answers: list[Answer] = []
        self._requests = 0
        self._count_lock = threading.Lock()
        super().__init__(model, served_name)

    # ---- answers ---------------------------------------------------------------------------

    def render(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        """The messages as the model reads them: the template rendered, then tokenized as it is."""
        rendered = str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return rendered, list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])

    def tokenize(self, body: dict) -> tuple[int, dict]:
        if not self.chat_modes.tokenize:
            return 404, {"error": "not found"}
        if "messages" in body:
            ids = self.render(body["messages"])[1]
        else:
            ids = self.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        count = len(ids) if self.chat_modes.fixed_count is None else self.chat_modes.fixed_count
        return 200, {"count": count, "tokens": ids, "max_model_len": self.model.max_context}

    def chat(self, body: dict) -> tuple[int, dict, dict[str, str]]:
        with self._count_lock:
            n, self._requests = self._requests, self._requests + 1
        if n < len(self.chat_modes.failures):
            return self.chat_modes.failures[n], {"error": "busy, try again"}, {"Retry-After": "0"}
        if body.get("model") != self.served_name:
            return 404, {"error": f"model {body.get('model')} does not exist"}, {}
        rendered, ids = self.render(body["messages"])
        with self._model_lock:
            text = self._greedy(ids, rendered, body["max_tokens"], body.get("stop") or [])
        generated = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        self.answers.append(Answer(body["messages"][-1]["content"], len(ids), text))
        reply: dict[str, Any] = {"id": f"chatcmpl-{n}", "object": "chat.completion", "model": self.served_name,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}]}
        if self.chat_modes.usage:
            reply["usage"] = {"prompt_tokens": len(ids), "completion_tokens": generated,
                              "total_tokens": len(ids) + generated}
        return 200, reply, {}

    def _greedy(self, ids: list[int], rendered: str, max_tokens: int, stop: list[str]) -> str:
        """Greedy tokens until EOS, a stop string (cut there, as vLLM cuts) or max_tokens: the hf
        backend's generation on the rendered prompt, whose BOS it adds itself."""
        plain = rendered.removeprefix(self.tokenizer.bos_token)
        assert self.model.tokens.encode(plain) == ids  # the model reads exactly the counted tokens
        return str(self.model.generate([GenerationRequest(plain, max_new_tokens=max_tokens, stop=tuple(stop))])[0])

    def post(self, path: str, body: dict, headers: dict) -> tuple[int, dict, dict[str, str]]:
        """The chat API and `/tokenize` (with messages); nothing else is served."""
        if path == "/v1/chat/completions":
            return self.chat(body)
        if path == "/tokenize":
            return (*self.tokenize(body), {})
        return 404, {"error": "not found"}, {}
