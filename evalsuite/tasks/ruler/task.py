"""RULER (Hsieh et al., 2024) through evalsuite's engine, its samples made by lm-eval's own RULER code.

What it measures: thirteen synthetic long-context tasks at chosen lengths, named as the YAML files of
lm-evaluation-harness's `ruler` group: needle retrieval (niah_single_1..3, niah_multikey_1..3,
niah_multivalue, niah_multiquery), variable tracking (vt), common and frequent words extraction (cwe,
fwe) and QA among distractor documents (qa_squad, qa_hotpot).

Each sub-task's generator is called as lm-eval calls it for `lm_eval --tasks SUBTASK --metadata
'{"max_seq_lengths": LENGTHS}' --seed SEED,NUMPY_SEED` (generator.py), sized with the model's own
tokenizer: sample i of a length is that command's i-th of that length, its prompt lm-eval's (lengths
are generated in the order given, as lm-eval does: `lengths=1024,2048` and `lengths=2048` differ at
2048). Decoding is greedy for the YAML's `max_gen_toks`, stopping only at the end of the answer.
Choices made here: `samples` keeps the first N of each length (lm-eval makes 500); needle sub-tasks get
a measured `depth` (samples.py); what lm-eval downloads is read from local files (data.py); scores are
the task kit's string matches: lm-eval's per-sample score and whether all / any references were found.
lm-eval's documents are made once for a tokenizer's content, the data and the seeds, and read back
by every later run (stored.py; EVALSUITE_CACHE names the folder).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from evalsuite.contracts import ModelAdapter, TaskBase
from evalsuite.errors import UserError, unknown
from evalsuite.params import PathText
from evalsuite.registry import register_task
from evalsuite.tasks.kit.strings import all_references, any_reference, string_match_all, string_match_part
from evalsuite.types import GenerationRequest, Sample

from . import generator, stored
from .data import ESSAY_SUBTASKS, QA_OPTION, local_data, option_for, require
from .samples import samples_of
from .view import RulerView

SUBTASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
            "niah_multikey_3", "niah_multiquery", "niah_multivalue", "vt", "cwe", "fwe", *QA_OPTION)
PER_LENGTH = 500  # samples lm-eval makes of each length


@dataclass(frozen=True)
class RulerState:
    """The generated samples (with their prompts' parts) and each sub-task's YAML settings."""

    samples: tuple[Sample, ...] = ()
    settings: Mapping[str, generator.Setting] = field(default_factory=dict)


@register_task
@dataclass(frozen=True)
class Ruler(TaskBase, name="ruler", view=RulerView, group_by=("subtask", "context_length", "depth"),
            metrics=("score", "all_found", "any_found"), gating_axes=("subtask", "context_length", "depth"),
            primary_metric="score", smoke_plan={"lengths": "512", "samples": "2"},
            presets={"lmeval": {"subtasks": ",".join(SUBTASKS), "lengths": "4096", "samples": str(PER_LENGTH)}}):
    """RULER's sub-tasks with lm-eval's own samples and scores, at a set of context lengths."""

    subtasks: tuple[str, ...] = ("niah_single_1",)
    lengths: tuple[int, ...] = (4096,)  # lm-eval's default max_seq_lengths
    samples: int = 50  # per (sub-task, length): the first of lm-eval's 500
    seed: int = 0  # lm-eval's --seed: Python's random
    numpy_seed: int = 1234  # lm-eval's --seed: numpy's (variable tracking draws values with it)
    essays: PathText = PathText("")  # data.py says what each names
    squad: PathText = PathText("")
    hotpotqa: PathText = PathText("")
    depth_bins: int = 5
    preset: str = ""

    def __post_init__(self) -> None:
        for subtask in self.subtasks:
            if subtask not in SUBTASKS:
                raise unknown("RULER sub-task", subtask, SUBTASKS)
        if not self.subtasks or not self.lengths or min(self.lengths) < 1:
            raise ValueError("-T subtasks and -T lengths must each name at least one, e.g. lengths=4096")
        if not 1 <= self.samples <= PER_LENGTH or self.depth_bins < 1:
            raise ValueError(f"-T samples must be 1..{PER_LENGTH} (lm-eval makes {PER_LENGTH}) and depth_bins >= 1")

    def prepare(self, model: ModelAdapter | None) -> RulerState:
        """Every sub-task's local data checked (one line for what is missing); with a model, the samples."""
        sources = {s: self._source(s) for s in self.subtasks}
        if model is None:
            return RulerState()
        if max(self.lengths) > model.max_context:
            raise UserError(f"length {max(self.lengths)} exceeds {model.name}'s maximum context of "
                            f"{model.max_context} tokens (-M max_context=N overrides)")
        settings: dict[str, generator.Setting] = {}
        made: list[Sample] = []
        for subtask in self.subtasks:  # lm-eval's documents made once per tokenizer and data (stored.py)
            settings[subtask], docs = stored.made(
                subtask, self.lengths, (self.seed, self.numpy_seed), model,
                local_data(option_for(subtask), sources[subtask]), subtask in ESSAY_SUBTASKS, self.plan_version)
            made += samples_of(docs, subtask, self.lengths, self.samples, self.seed, self.depth_bins,
                               part=settings[subtask].rule.endswith("_part"))
        return RulerState(tuple(made), settings)

    def _source(self, subtask: str) -> str | None:
        option = option_for(subtask)
        return require(subtask, option, getattr(self, option)) if option else None

    def plan(self, state: RulerState | None) -> Iterator[Sample]:
        """lm-eval's samples as `prepare(model)` made them (none without a model)."""
        yield from state.samples if state is not None else ()

    def requests(self, sample: Sample, model: ModelAdapter, state: RulerState
                 ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        setting = state.settings[sample.axes["subtask"]]
        text = generator.prompt(model, sample.data["input"], sample.data["gen_prefix"], setting.delimiter)
        info = {"prompt_tokens": model.count_tokens(text), "answer_budget": setting.max_new_tokens,
                "lmeval_length": sample.data["lmeval_length"]}
        if sample.data["measured_depth"] is not None:
            info["measured_depth"] = round(sample.data["measured_depth"], 4)
        return [GenerationRequest(prompt=text, max_new_tokens=setting.max_new_tokens)], info

    def score(self, sample: Sample, outputs: list[Any]) -> dict[str, Any]:
        """lm-eval's score of the sub-task (its all- or part- string match), and all / any references found."""
        output, references = str(outputs[0]), sample.target
        match = string_match_part if sample.data.get("part") else string_match_all
        return {"score": match([output], [references]), "all_found": all_references(output, references),
                "any_found": any_reference(output, references)}

    def summary(self, frame: Any, run: Any) -> dict[str, Any]:
        """lm-eval's table: the mean score per sub-task and length."""
        table: dict[str, dict[str, float]] = {}
        for (subtask, length), value in frame.groupby(["subtask", "context_length"])["score"].mean().items():
            table.setdefault(str(subtask), {})[str(int(length))] = round(float(value), 4)
        return {"lmeval_scores": table}
