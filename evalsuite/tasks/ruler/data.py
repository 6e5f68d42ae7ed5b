"""The data some RULER sub-tasks read besides their generator, from local files.

lm-eval downloads three things: the Paul Graham essays (the haystack of the essay sub-tasks, from
the `baber/paul_graham_essays` dataset), SQuAD 2.0's dev set and HotpotQA's dev set (distractor
setting). Here each is a task option naming a local file (or, for the essays, `dataset:NAME`), and a
sub-task whose data is not given is refused before anything runs, in one line naming the option.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks.kit.data import TABLE_FORMATS, load_table, load_texts, read_text, require_columns

from .stand_ins import LocalData

# sub-tasks whose haystack is lm-eval's essay text (split into sentences with NLTK's punkt_tab)
ESSAY_SUBTASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue")
QA_OPTION = {"qa_squad": "squad", "qa_hotpot": "hotpotqa"}  # sub-task -> the option naming its JSON
WHAT = {
    "essays": "the Paul Graham essays lm-eval downloads (a .txt file, a folder of .txt files, or a .jsonl or "
              ".parquet file with a 'text' column, as the baber/paul_graham_essays dataset)",
    "squad": "SQuAD 2.0's dev set as lm-eval downloads it (dev-v2.0.json)",
    "hotpotqa": "HotpotQA's dev set, distractor setting, as lm-eval downloads it (hotpot_dev_distractor_v1.json)",
}


def option_for(subtask: str) -> str | None:
    """The option naming the local data a sub-task needs (None: it needs none)."""
    return "essays" if subtask in ESSAY_SUBTASKS else QA_OPTION.get(subtask)


def require(subtask: str, option: str, source: str) -> str:
    """What an option names, or one line saying what is missing."""
    if not source:
        raise UserError(f"ruler {subtask} needs {WHAT[option]}: give a local copy with -T {option}=PATH")
    if not (Path(source).exists() or (option == "essays" and source.startswith("dataset:"))):
        raise UserError(f"-T {option}={source}: no such file or folder (ruler {subtask} reads {WHAT[option]})")
    return source


def local_data(option: str | None, source: str | None) -> LocalData:
    """What one sub-task reads: the essays' texts in order, or a QA set's JSON."""
    if option is None or source is None:
        return LocalData()
    if option == "essays":
        return LocalData(essays=essay_texts(source))
    try:
        return LocalData(qa_json=json.loads(read_text(Path(source), f"ruler's -T {option}")))
    except json.JSONDecodeError as exc:
        raise UserError(f"-T {option}={source} is not a JSON file ({exc})") from None


def essay_texts(source: str) -> tuple[str, ...]:
    """The essays in order (lm-eval joins them with a space): the 'text' column of a table file
    (.jsonl, .parquet... as the baber/paul_graham_essays dataset), or a text file (one essay), a folder
    of .txt files (one each, in name order) or `dataset:NAME[:SPLIT]`."""
    what = "the essays of ruler's -T essays"
    if Path(source).suffix.lower() in TABLE_FORMATS:
        table = load_table(source, what)
        require_columns(table, [("essay text", "text")], f"-T essays={source}")
        return tuple(str(text) for text in table["text"])
    return tuple(text.text for text in load_texts(source, what))
