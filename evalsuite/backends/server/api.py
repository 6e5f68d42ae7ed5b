"""The two OpenAI-compatible APIs the server backend speaks (`-M api=`): what a request carries
and where a reply keeps its text (pure functions, no HTTP).

    completions   POST /v1/completions {"prompt": text}: the model reads the text as it is (a
                  chat template, if any, is rendered here first by -M chat_template=true)
    chat          POST /v1/chat/completions {"messages": [{"role": "user", "content": text}]}:
                  the server wraps the text in the model's chat template and the model answers
                  in a new assistant turn (choices[0].message.content)

vLLM's `/tokenize` takes either shape (`prompt`, or `messages` with `add_generation_prompt`),
so the server counts a prompt's tokens the way it will read them, its template included.
"""

from __future__ import annotations

from typing import Any

from evalsuite.errors import UserError


class CompletionsApi:
    name = "completions"
    path = "/completions"

    def prompt(self, text: str) -> dict[str, Any]:
        return {"prompt": text}

    def tokenize_fields(self, text: str, add_special_tokens: bool) -> dict[str, Any]:
        return {"prompt": text, "add_special_tokens": add_special_tokens}

    def text_of(self, choice: dict[str, Any]) -> str:
        text = choice.get("text")
        if not isinstance(text, str):
            raise UserError("a completions response has no choices[0].text")
        return text


class ChatApi:
    name = "chat"
    path = "/chat/completions"

    def prompt(self, text: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}]}

    def tokenize_fields(self, text: str, add_special_tokens: bool) -> dict[str, Any]:
        # the template carries the special tokens (vLLM adds none to a chat prompt by default)
        return {**self.prompt(text), "add_generation_prompt": True}

    def text_of(self, choice: dict[str, Any]) -> str:
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise UserError("a chat completions response has no choices[0].message.content")
        return content


Api = CompletionsApi | ChatApi
APIS: dict[str, Api] = {"completions": CompletionsApi(), "chat": ChatApi()}


def prompt_tokens(body: Any) -> int | None:
    """usage.prompt_tokens of a response body: the tokens the server read (None when it does not say)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
