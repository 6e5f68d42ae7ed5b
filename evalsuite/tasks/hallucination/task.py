"""Contextual hallucination (Differential Transformer paper, §3.6).

What it measures: the model summarizes a document (XSum, CNN/DM, MultiNews)
or answers a question about it (Qasper, HotpotQA, 2WikiMultihopQA); a judge
then decides, from the document, the reference and the output, whether the
output is supported by the document and free of hallucination. Accuracy is
the share judged True (paper: 100 samples per dataset, GPT-4o as judge).

Generation and judging are separate steps. Judging is the task's run step
(step.py): `evalsuite run` generates (and judges when `--judge` is given);
`evalsuite score RUN --judge ...` judges the saved outputs again with any judge,
without loading the evaluated model. Verdicts live beside samples.jsonl, one file
per judge (see evalsuite.tasks.hallucination.judges).

Choices the paper leaves open, made here and exposed as parameters:
- data: the usual hub copies (`datasets.load_dataset`), or a local
  jsonl/csv/parquet file with `-T data=PATH`; field names are found by the
  dataset's own names, then `document`/`reference`/`question`, or set with
  `-T document_field=...` etc. Qasper in its original nested form is read as
  the full paper text (title, abstract and every section), not the abstract;
- a fixed seeded sample of `-T samples` rows; a sample's id is its row index;
- greedy decoding with per-dataset max new tokens and stop strings;
- a document too long for the model's context is cut (by default in the
  middle, keeping its start and end; `-T truncate=end` keeps the start only),
  never the instruction or the question; the cut is measured in the model's
  own tokens and recorded. The judge sees the document as the model saw it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsuite.contracts import ModelAdapter, TaskBase
from evalsuite.errors import UserError, unknown
from evalsuite.registry import register_task
from evalsuite.tasks.kit.data import Hub, load_table
from evalsuite.tasks.kit.document import fit_document, kept_document
from evalsuite.types import GenerationRequest, Sample, output_from_json

from .step import JudgeOptions, JudgeStep, judge_step
from .view import HallucinationView

if TYPE_CHECKING:
    import pandas as pd

    from evalsuite.runs.view import RunView

    from .judges import JudgeItem


class DataFile(str):
    """The `-T data` parameter: a file named by its absolute path ("" for none), so that a run
    found again from another folder (`evalsuite score`) reads the same file."""

    __slots__ = ()

    def __new__(cls, path: str = "") -> DataFile:
        return super().__new__(cls, str(Path(path).expanduser().resolve()) if path else "")


@dataclass(frozen=True)
class Source:
    """One dataset: where it lives, its field names, its prompt and generation settings."""

    kind: str  # summary | answer
    hub: tuple[str, str | None, str]  # datasets.load_dataset path, config, split
    document: tuple[str, ...]  # field names, tried in order
    reference: tuple[str, ...]
    question: tuple[str, ...]
    max_new_tokens: int
    stop: tuple[str, ...]
    instruction: str
    document_label: str


_QA = "Answer the question using only the {what} below. Answer as briefly as you can."
_LONGBENCH = dict(document=("context", "document"), reference=("answers", "reference"), question=("input", "question"))

SOURCES = {
    "xsum": Source("summary", ("EdinburghNLP/xsum", None, "test"), ("document",), ("summary", "reference"), (),
                   64, ("\n",), "Summarize the article below in one sentence.", "Article"),
    "cnn_dailymail": Source("summary", ("abisee/cnn_dailymail", "3.0.0", "test"), ("article", "document"),
                            ("highlights", "reference"), (), 128, ("\n\n",),
                            "Summarize the news article below in three sentences.", "Article"),
    "multi_news": Source("summary", ("THUDM/LongBench", "multi_news", "test"), **_LONGBENCH, max_new_tokens=512,
                         stop=("\n\n",), instruction="Write a one-paragraph summary of the news articles below.",
                         document_label="News articles"),
    "qasper": Source("answer", ("allenai/qasper", None, "test"), **_LONGBENCH, max_new_tokens=128, stop=("\n",),
                     instruction=_QA.format(what="scientific paper") + ' If the paper does not answer it, say '
                                 '"unanswerable".', document_label="Paper"),
    "hotpotqa": Source("answer", ("THUDM/LongBench", "hotpotqa", "test"), **_LONGBENCH, max_new_tokens=32,
                       stop=("\n",), instruction=_QA.format(what="passages"), document_label="Passages"),
    "2wikimqa": Source("answer", ("THUDM/LongBench", "2wikimqa", "test"), **_LONGBENCH, max_new_tokens=32,
                       stop=("\n",), instruction=_QA.format(what="passages"), document_label="Passages"),
}


# ---- reading datasets ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    index: int  # position in the source: the sample id
    document: str
    question: str
    references: tuple[str, ...]


def _texts(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value if v is not None and str(v).strip())
    return (str(value).strip(),) if str(value).strip() else ()


def _as_records(value: Any) -> list[dict[str, Any]]:
    """A list of dicts from a JSON list of objects or from datasets' dict-of-lists form."""
    if not value:
        return []
    if isinstance(value, dict):
        keys = list(value)
        return [{k: value[k][i] for k in keys} for i in range(len(value[keys[0]]))]
    return list(value)


def _qasper_answer(answer: dict[str, Any]) -> str:
    if answer.get("unanswerable"):
        return ""
    if (answer.get("free_form_answer") or "").strip():
        return answer["free_form_answer"].strip()
    spans = [s for s in answer.get("extractive_spans") or [] if s]
    if spans:
        return "; ".join(spans)
    if answer.get("yes_no") is not None:
        return "Yes" if answer["yes_no"] else "No"
    return ""


def qasper_row(index: int, paper: dict[str, Any]) -> Row | None:
    """Qasper's nested form: the full text (title, abstract, every section) and the paper's
    first question that has an answer. None when no question is answerable."""
    parts = [paper.get("title") or "", f"Abstract\n{paper.get('abstract') or ''}"]
    for section in _as_records(paper.get("full_text")):
        paragraphs = [p for p in section.get("paragraphs") or [] if p and p.strip()]
        parts.append("\n".join([section.get("section_name") or "", *paragraphs]))
    document = "\n\n".join(p.strip() for p in parts if p.strip())
    for qa in _as_records(paper.get("qas")):
        answers = [_qasper_answer(a.get("answer", a)) for a in _as_records(qa.get("answers"))]
        references = tuple(a for a in answers if a)
        if references:
            return Row(index, document, str(qa.get("question") or ""), references)
    return None


# ---- the task --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HallucinationState:
    """What `prepare` reads once per run: the dataset's usable rows."""

    rows: tuple[Row, ...]


@register_task
@dataclass(frozen=True)
class Hallucination(TaskBase, name="hallucination", view=HallucinationView, group_by=("dataset",),
                    metrics=("empty_output",),
                    primary_metric="empty_output",  # with the judged side scores, per dataset
                    lower_is_better=("empty_output",),  # the gate reads a rise as a regression
                    step_options=JudgeOptions,  # --judge and its settings, on `evalsuite run` and `evalsuite score`
                    smoke_plan={"dataset": "xsum", "data": "{data}/hallucination/xsum.jsonl", "samples": "2"}):
    """Contextual hallucination: outputs judged for support by their document (paper §3.6)."""

    dataset: str = "xsum"
    data: DataFile = DataFile()  # a local jsonl/csv/parquet file instead of the hub copy
    split: str = ""  # hub split; "" = the dataset's test split
    samples: int = 100
    seed: int = 0
    document_field: str = ""
    reference_field: str = ""
    question_field: str = ""
    max_new_tokens: int = 0  # 0 = the dataset's default
    truncate: str = "middle"  # middle: keep the document's start and end; end: keep its start

    def __post_init__(self) -> None:
        if self.dataset not in SOURCES:
            raise unknown("dataset for hallucination", self.dataset, SOURCES)
        if self.samples < 1 or self.max_new_tokens < 0:
            raise ValueError("-T samples must be at least 1 and -T max_new_tokens at least 0")
        if self.truncate not in ("middle", "end"):
            raise ValueError(f"-T truncate must be middle or end, got {self.truncate!r}")

    @property
    def source(self) -> Source:
        return SOURCES[self.dataset]

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or self.source.max_new_tokens

    def prepare(self, model: ModelAdapter | None) -> HallucinationState:
        """The rows, read once per run; with a model, a refusal when its answer cannot fit."""
        if model is not None and self.new_tokens >= model.max_context:
            raise UserError(f"{self.new_tokens} new tokens do not fit {model.name}'s context of "
                            f"{model.max_context} tokens (-T max_new_tokens=N)")
        return HallucinationState(rows=tuple(self.read_rows()))

    # ---- data ----------------------------------------------------------------------------

    def _where(self) -> str:
        return self.data or f"{self.source.hub[0]} ({self.source.hub[1] or 'default'})"

    def _load_table(self) -> Any:
        if self.data:
            return load_table(self.data, "-T data")
        hub, config, split = self.source.hub
        return load_table(Hub(hub, config, self.split or split), self.dataset,
                          advice="download it and pass -T data=PATH (jsonl, csv or parquet)")

    def read_rows(self) -> list[Row]:
        """Every usable row of the dataset, in its own order."""
        table = self._load_table()
        columns = table.column_names
        if {"full_text", "qas"} <= set(columns) and not self.document_field:
            papers = [qasper_row(i, dict(paper)) for i, paper in enumerate(table)]
            return [row for row in papers if row is not None]
        need_question = self.source.kind == "answer"
        doc = self._column("document", self.document_field, self.source.document, columns, True)
        ref = self._column("reference", self.reference_field, self.source.reference, columns, True)
        question = self._column("question", self.question_field, self.source.question, columns, need_question)
        table = table.select_columns([c for c in dict.fromkeys((doc, ref, question)) if c])
        rows: list[Row] = []
        for i, raw in enumerate(table):
            document = raw[doc] if isinstance(raw[doc], str) else "\n\n".join(_texts(raw[doc]))
            rows.append(Row(i, document, str(raw[question] or "") if question else "", _texts(raw[ref])))
        return rows

    def _column(self, role: str, explicit: str, names: tuple[str, ...], columns: list[str], required: bool) -> str:
        if explicit:
            if explicit not in columns:
                raise UserError(f"-T {role}_field={explicit}: no such column in {self._where()}; "
                                f"columns: {', '.join(columns)}")
            return explicit
        for name in (*names, role):
            if name in columns:
                return name
        if required:
            raise UserError(f"{self._where()} has no {role} column (tried {', '.join(dict.fromkeys((*names, role)))}); "
                            f"columns: {', '.join(columns)}; name it with -T {role}_field=NAME")
        return ""

    # ---- plan ----------------------------------------------------------------------------

    def plan(self, state: HallucinationState) -> list[Sample]:
        rows = state.rows
        if not rows:
            raise UserError(f"{self._where()} holds no usable rows")
        rng = random.Random(f"hallucination-{self.dataset}-{self.seed}")
        picked = sorted(rng.sample(range(len(rows)), min(self.samples, len(rows))))
        return [self._sample(rows[i]) for i in picked]

    def _sample(self, row: Row) -> Sample:
        data = {"document": row.document, "question": row.question,
                "doc_sha256": hashlib.sha256(row.document.encode()).hexdigest()}
        return Sample(id=f"{self.dataset}-{row.index:06d}", task=self.name,
                      axes={"dataset": self.dataset, "seed": self.seed}, target=row.references, data=data)

    # ---- prompts -------------------------------------------------------------------------

    def render(self, model: ModelAdapter, document: str, question: str) -> str:
        user = f"{self.source.instruction}\n\n{self.source.document_label}:\n{document}"
        if question:
            user += f"\n\nQuestion: {question}"
        if model.chat_template:
            return model.format_user_turn(user)
        return f"{user}\n\n{'Answer' if self.source.kind == 'answer' else 'Summary'}:"

    def requests(self, sample: Sample, model: ModelAdapter, state: HallucinationState
                 ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        question = sample.data["question"]
        fitted = fit_document(sample.data["document"], lambda doc: self.render(model, doc, question),
                              model.count_tokens, model.max_context - self.new_tokens, self.truncate)
        info = {"prompt_tokens": fitted.tokens, "doc_tokens_cut": fitted.cut_tokens,
                "truncated": fitted.cut_tokens > 0, "doc_words": fitted.words, "doc_keep": list(fitted.keep),
                "doc_sha256": sample.data["doc_sha256"]}
        request = GenerationRequest(prompt=fitted.prompt, max_new_tokens=self.new_tokens, stop=self.source.stop)
        return [request], info

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        return {"empty_output": not outputs[0].strip()}

    # ---- judging: the run step (step.py), repeatable with `evalsuite score` ---------------

    def run_step(self, options: JudgeOptions, *, out: Path, device: str, batch_size: int) -> JudgeStep | None:
        """Judging with the judge `--judge` names (None without one); its response cache
        defaults to judge-cache.sqlite in `out`, beside the run folders."""
        return judge_step(options, out=out, device=device, batch_size=batch_size)

    def judge_items(self, run: RunView, state: HallucinationState) -> list[JudgeItem]:
        """What the judge sees for each saved record, rebuilt from the data and the record."""
        from .judges import JudgeItem

        samples = {s.id: s for s in self.plan(state)}
        items = []
        for record in run.read_records():
            sample = samples.get(record.id)
            if sample is None or sample.data["doc_sha256"] != record.info.get("doc_sha256"):
                raise UserError(f"sample {record.id} of {run.path.name} differs from {self._where()}; "
                                "judge with the data the run was made from")
            items.append(JudgeItem(id=record.id, document=kept_document(sample.data["document"],
                                                                         record.info["doc_keep"]),
                                   reference=tuple(record.target),
                                   output=output_from_json("generation", record.outputs[0]).strip(),
                                   question=sample.data["question"]))
        return items

    def summary(self, frame: pd.DataFrame, run: RunView) -> dict[str, Any]:
        from .judges.tables import judge_summaries

        return {"judges": judge_summaries(run.path)}

    def side_scores(self, run: RunView) -> dict[str, dict[str, float | None]]:
        """Judged accuracy as metrics, two per judge with verdicts in the run, so that compare and
        check see a drop in it: `judged_<judge>` (None where unjudged: a judge error or no verdict
        yet) and `judged_<judge>_all` (unjudged counted as not True); the verdicts stay in judgements/."""
        from .judges.tables import judged_scores

        return judged_scores(run.path)
