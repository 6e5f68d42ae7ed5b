"""Judges: decide whether a model's output is supported by its source document.

A judge sees the document, the reference and the model's output (and the
question, for QA) and answers with its reasoning followed by one explicit line,
"Conclusion: True" or "Conclusion: False" (the Lookback Lens protocol the
Differential Transformer paper cites for §3.6). Only a bare True or False after
the response's last `Conclusion:` is read; anything else ("Not True", "partially
true", a note about a conclusion after the verdict, a verdict taken back after it:
"Conclusion: True ... Actually no. False.") is "unparseable": it is not
True, and it is counted on its own.

Judges, chosen by a spec string:

    openai:<model>   any OpenAI-compatible chat-completions endpoint (judges.remote)
    hf:<model>       a local causal LM through evalsuite's own model adapter (judges.local)
    lexical          an offline heuristic, always labelled as one (judges.local)

Judging is a separate, repeatable step. Verdicts go to one file per judge in
the run folder, `judgements/<judge>.jsonl`, appended and flushed one line per
sample like samples.jsonl; the last line for a sample wins. A rerun judges
only samples that have no verdict yet (never judged, or whose judge call
failed), so an interrupted or failed judging run is finished by running the
same command again.

Modules: `verdicts` (the prompt, a verdict, the settings, the Judge protocol),
`store` (verdict files, judging what has no verdict), `local` and `remote`
(the judges), `tables` (judged accuracy from the verdict files). This package
names them all and makes a judge from its settings.
"""

from __future__ import annotations

from pathlib import Path

from .store import JudgementFile, JudgeOutcome, judge_missing, judgement_files, slug, write_meta
from .verdicts import (
    KINDS,
    PROMPT_VERSION,
    SYSTEM,
    Judge,
    JudgeItem,
    JudgeSettings,
    JudgeUnavailable,
    Verdict,
    error_verdict,
    judge_prompt,
    label_for,
    parse_verdict,
    verdict_from_text,
)

__all__ = [
    "KINDS", "PROMPT_VERSION", "SYSTEM", "Judge", "JudgeItem", "JudgeOutcome", "JudgeSettings", "JudgeUnavailable",
    "JudgementFile", "Verdict", "error_verdict", "judge_missing", "judge_prompt", "judgement_files", "label_for",
    "make_judge", "parse_verdict", "slug", "verdict_from_text", "write_meta",
]


def make_judge(settings: JudgeSettings, default_cache: Path) -> Judge:
    """The judge a spec names. Heavy parts (a model, an HTTP client) load only here."""
    if settings.kind == "lexical":
        from .local import LexicalJudge

        return LexicalJudge()
    if settings.kind == "hf":
        from .local import HFJudge

        return HFJudge(settings)
    from .remote import OpenAIJudge

    return OpenAIJudge(settings, settings.cache or default_cache)
