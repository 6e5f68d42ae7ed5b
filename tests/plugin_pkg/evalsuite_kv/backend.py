"""`lookup:perfect` and `lookup:forgetful`: scripted models that read the key-value lines.

The forgetful one only remembers the second half of the prompt, so the two
differ in a way compare and check can see.
"""

import re
from collections.abc import Mapping, Sequence

from evalsuite import GenerationRequest, Loglikelihood, LoglikelihoodRequest, UserError, register_backend

MODES = ("perfect", "forgetful")


class LookupModel:
    max_context = 1 << 16
    chat_template = False

    def __init__(self, mode: str):
        self.mode = mode
        self.name = f"lookup-{mode}"

    def fingerprint(self) -> dict:
        return {"backend": "lookup", "name": self.name, "mode": self.mode}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        return user + assistant_prefix

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return [self._answer(r.prefix + r.prompt) for r in requests]

    def _answer(self, prompt: str) -> str:
        lines = prompt.splitlines()
        asked = re.search(r"value of (\d+)\?", lines[-1])
        memory = lines[len(lines) // 2 :] if self.mode == "forgetful" else lines
        table = dict(line.split(": ", 1) for line in memory if re.fullmatch(r"\d+: \d+", line))
        return " " + table.get(asked.group(1), "?") if asked else ""

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        raise UserError("the lookup backend answers generation requests only")


@register_backend("lookup")
def load(rest: str, options: Mapping[str, str], *, device: str, batch_size: int, label: str | None) -> LookupModel:
    if rest not in MODES:
        raise UserError(f"lookup backend: unknown mode {rest!r}; use lookup:perfect or lookup:forgetful")
    return LookupModel(rest)
