"""Judging as the hallucination task's run step, and the judge options that ask for it (`--judge J`, -J key=value).

`evalsuite run --judge J` judges right after generation, `evalsuite score RUN... --judge J`
judges finished runs again; both build the step through `Hallucination.run_step`. The
step reads each run's own task back from the run (its data, its samples), so one judge
(one model loaded, one cache) serves runs made with different parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsuite.analysis.task_of import task_for_run
from evalsuite.errors import UserError
from evalsuite.params import PathText, split_pairs
from evalsuite.runs.view import RunView

from .judges import Judge, JudgeOutcome, JudgeSettings, judge_missing, make_judge


def _flag(flag: str, help_text: str) -> dict[str, str]:
    return {"flag": flag, "help": help_text}


@dataclass(frozen=True)
class JudgeOptions:
    """The options of the judging step: `-J key=value`, or each one's flag (`--judge J` is `-J judge=J`)."""

    judge: str = field(default="", metadata=_flag("--judge", (
        "Judge whether outputs are supported by their documents: openai:<model> (OpenAI-compatible endpoint), "
        "hf:<model> (a local causal LM) or lexical (an offline heuristic).")))
    judge_base_url: str = field(default="", metadata=_flag("--judge-base-url", (
        "Chat-completions endpoint of an openai judge [default: $OPENAI_BASE_URL or https://api.openai.com/v1].")))
    judge_api_key_env: str = field(default="OPENAI_API_KEY", metadata=_flag("--judge-api-key-env", (
        "Environment variable holding the judge's API key (the key is never written anywhere) "
        "[default: OPENAI_API_KEY].")))
    judge_concurrency: int = field(default=4, metadata=_flag("--judge-concurrency",
                                                             "Judge requests in flight at once [default: 4]."))
    judge_retries: int = field(default=5, metadata=_flag("--judge-retries", (
        "Retries of a judge request on 429, 5xx, timeouts and malformed replies [default: 5].")))
    judge_backoff: float = field(default=1.0, metadata=_flag("--judge-backoff", (
        "Seconds before the first retry; doubled for each further retry [default: 1.0].")))
    judge_timeout: float = field(default=120.0, metadata=_flag("--judge-timeout",
                                                                "Seconds to wait for one judge reply [default: 120.0]."))
    judge_max_tokens: int = field(default=1024, metadata=_flag("--judge-max-tokens", (
        "Most tokens a judge may write (0: the endpoint's default) [default: 1024].")))
    judge_cache: PathText = field(default=PathText(""), metadata=_flag("--judge-cache", (
        "Response cache of openai judges [default: judge-cache.sqlite beside the run folders].")))
    judge_option: tuple[str, ...] = field(default=(), metadata=_flag("--judge-option", (
        "Backend option of an hf judge, like -M (e.g. --judge-option chat_template=true); repeatable.")))

    def __post_init__(self) -> None:
        for key, least, open_below in (("judge_concurrency", 1, False), ("judge_retries", 0, False),
                                       ("judge_backoff", 0, False), ("judge_timeout", 0, True),
                                       ("judge_max_tokens", 0, False)):
            value = getattr(self, key)
            if value < least or (open_below and value == least):
                bound = f"above {least}" if open_below else f"at least {least}"
                raise UserError(f"-J {key} must be {bound}, got {value}")


def judge_step(options: JudgeOptions, *, out: Path, device: str, batch_size: int) -> JudgeStep | None:
    """The step the judge options ask for (None without a judge). An openai judge's cache defaults
    to judge-cache.sqlite in `out`."""
    if not options.judge:
        return None
    settings = JudgeSettings(
        spec=options.judge, base_url=options.judge_base_url, api_key_env=options.judge_api_key_env,
        concurrency=options.judge_concurrency, retries=options.judge_retries, backoff=options.judge_backoff,
        timeout=options.judge_timeout, max_tokens=options.judge_max_tokens,
        cache=Path(options.judge_cache) if options.judge_cache else None,
        options=split_pairs(options.judge_option, "--judge-option"), device=device, batch_size=batch_size,
    )
    return JudgeStep(make_judge(settings, out / "judge-cache.sqlite"))


class JudgeStep:
    """One judge's verdicts on the saved outputs of finished runs (a `contracts.RunStep`)."""

    def __init__(self, judge: Judge):
        self.judge = judge
        self.label = judge.label
        self._states: dict[Any, Any] = {}  # a run's task -> what its prepare(None) read (the rows), once

    def judge_run(self, run: RunView, progress: bool = True) -> JudgeOutcome:
        """Judge the samples of `run` that have no verdict from this judge yet; rewrite judgements.md."""
        from .judges.tables import write_table

        task = task_for_run(run)
        if task not in self._states:
            self._states[task] = task.prepare(None)
        items = task.judge_items(run, self._states[task])
        outcome = judge_missing(run.path / "judgements", items, self.judge, progress=progress)
        write_table(run.path)
        return outcome

    def apply(self, run: RunView, progress: bool) -> str:
        outcome = self.judge_run(run, progress)
        return f"{outcome.new} new verdicts from {outcome.label}"

    def table(self, runs: Sequence[Path]) -> str:
        """Judged accuracy of these runs by this judge, with paired comparisons."""
        from .judges.tables import judge_table

        return judge_table(runs, self.judge.name)
