"""The task kit's own pieces: the data loader, the string scorers (against lm-eval's RULER code),
the layout and length checks of the prompt builder, and the depth x length view's grids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from evalsuite.backends.common.tokens import TokenizerAdapter
from evalsuite.errors import UserError
from evalsuite.tasks.kit import (
    DepthLengthView,
    Haystack,
    Hub,
    Layout,
    build_prompt,
    check_lengths,
    load_table,
    load_texts,
    significance_marks,
    string_match_all,
    string_match_part,
)
from evalsuite.tasks.kit.strings import all_references, any_reference


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- data ---------------------------------------------------------------------------------------------------


def test_a_folder_of_tables_reads_as_one_table_in_file_name_order(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b0"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a0"}, {"text": "a1"}])
    (tmp_path / "notes.txt").write_text("not a table")
    assert load_table(tmp_path, "-T data")["text"] == ["a0", "a1", "b0"]
    assert load_table(tmp_path / "a.jsonl", "-T data")["text"] == ["a0", "a1"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.jsonl", "-T data file not found"),
    (lambda p: (p / "x.txt").write_text("a") and p / "x.txt", r"unsupported file type \.txt"),
    (lambda p: (p / "e.jsonl").write_text("\n\n") and p / "e.jsonl", "is empty: it holds no rows"),
    (lambda p: (p / "bad.jsonl").write_text("{not json") and p / "bad.jsonl", "cannot read -T data .* as json"),
    (lambda p: (p / "none").mkdir() or p / "none", "is a folder with no .jsonl, .json, .csv, .parquet files"),
    (lambda p: (write_jsonl(p / "a.jsonl", [{"x": 1}]), (p / "b.csv").write_text("x\n1\n")) and p,
     "mixes csv and json files"),
])
def test_a_table_that_cannot_be_read_is_one_line(tmp_path, make, message):
    with pytest.raises(UserError, match=message) as raised:
        load_table(make(tmp_path), "-T data")
    assert "\n" not in str(raised.value)


def test_a_hub_name_that_cannot_be_loaded_says_how_to_give_a_local_copy():
    with pytest.raises(UserError, match=r"could not load xsum \(nobody/nothing\): .*; pass -T data=PATH$"):
        load_table(Hub("nobody/nothing"), "xsum", advice="pass -T data=PATH")


def test_texts_of_a_file_a_folder_and_a_dataset(tmp_path):
    (tmp_path / "books").mkdir()
    for name in ("b.txt", "a.txt", "c.md"):
        (tmp_path / "books" / name).write_text(f"text of {name}")
    assert [(t.name, t.text) for t in load_texts(str(tmp_path / "books"), "nll data")] == [
        ("a.txt", "text of a.txt"), ("b.txt", "text of b.txt")]
    assert [t.name for t in load_texts(str(tmp_path / "books"), "nll data", limit=1)] == ["a.txt"]
    assert [t.text for t in load_texts(str(tmp_path / "books" / "c.md"), "haystack")] == ["text of c.md"]
    table = tmp_path / "table"
    table.mkdir()
    write_jsonl(table / "train.jsonl", [{"body": "one"}, {"body": None}])
    assert [(t.name, t.text) for t in load_texts(f"dataset:{table}", "nll data", "body")] == [
        (f"{table}[0]", "one"), (f"{table}[1]", "")]
    with pytest.raises(UserError, match=r"nll data not found: .*nothing \(give a file\)$"):
        load_texts(str(tmp_path / "nothing"), "nll data", advice="give a file")


# ---- string scores ------------------------------------------------------------------------------------------

CASES = [  # outputs, references (one list per output)
    (["The answer is Paris and ROME."], [["paris", "rome"]]),
    (["  paris\x07 only  "], [["Paris", "Rome", "Oslo"]]),
    (["nothing here"], [["x1"]]),
    (["a b", "b c"], [["a", "c"], ["b", "c"]]),
]


@pytest.mark.parametrize("outputs, references", CASES)
def test_string_matches_are_lm_evals(outputs, references):
    from lm_eval.tasks.ruler import common_utils

    predictions = common_utils.postprocess_pred(outputs)
    assert string_match_all(outputs, references) == common_utils.string_match_all(predictions, references)
    assert string_match_part(outputs, references) == common_utils.string_match_part(predictions, references)


def test_all_and_any_reference():
    assert all_references("Paris, rome", ["paris", "Rome"]) and not all_references("Paris", ["paris", "rome"])
    assert any_reference("Paris", ["paris", "rome"]) and not any_reference("Oslo", ["paris", "rome"])
    assert string_match_part(["Paris"], [["paris", "rome"]]) == 0.5  # lm-eval's: the share, not "any"
    with pytest.raises(ValueError, match="no reference"):
        all_references("x", [])


# ---- the prompt builder -------------------------------------------------------------------------------------


def test_a_layout_puts_the_answer_prefix_in_the_chat_turn_or_after_answer(toy_tokenizer):
    layout = Layout("Read this.")
    plain = TokenizerAdapter(toy_tokenizer, chat_template=False)
    assert layout.render(plain, "Hay.", "Who?", "It is") == "Read this.\n\nHay.\n\nQuestion: Who?\nAnswer: It is"
    assert layout.render(plain, "Hay.", "Who?") == "Read this.\n\nHay.\n\nQuestion: Who?\nAnswer:"


def test_an_item_lands_at_its_depth_in_a_prompt_of_the_length(toy_tokenizer):
    model = TokenizerAdapter(toy_tokenizer, chat_template=False)
    layout = Layout("Remember the code word.")
    for depth in (0.0, 0.3, 1.0):
        built = build_prompt(model, Haystack.load("builtin"), tokens=400, depth=depth, item="The code word is ZEBRA.",
                             others=[(0.9, "Nothing else matters.")], seed=7,
                             render=lambda text: layout.render(model, text, "What is the code word?"))
        assert 396 <= built.facts["prompt_tokens"] == model.count_tokens(built.prompt) <= 400
        assert abs(built.facts["measured_depth"] - depth) <= 0.02
        assert "Nothing else matters." in built.prompt


def test_lengths_a_model_cannot_hold_are_refused(toy_tokenizer):
    model = TokenizerAdapter(toy_tokenizer, chat_template=False)
    with pytest.raises(UserError, match="exceeds .*maximum context"):
        check_lengths(model, [256, model.max_context + 1], 20)
    with pytest.raises(UserError, match="length 16 leaves no room .* answer budget of 20 tokens"):
        check_lengths(model, [16, 256], 20)
    check_lengths(model, [256], 20)


# ---- the view -----------------------------------------------------------------------------------------------


class Swept:
    """A length-swept task without a depth axis: one row per heatmap."""

    name, metrics, group_by, primary_metric = "swept", ("correct",), ("kind", "context_length"), None


def test_a_task_without_depth_gets_one_row_per_facet(tmp_path):
    frame = pd.DataFrame({"id": [f"s{i}" for i in range(8)], "kind": ["a", "b"] * 4,
                          "context_length": [256, 256, 512, 512] * 2, "correct": [1, 0, 1, 1, 0, 0, 1, 0]})
    view = DepthLengthView(Swept())
    assert view.facet_axes == ("kind",) and view.scored == "correct"
    paths = view.plots(frame, None, tmp_path, "swept")
    assert sorted(p.name for p in paths) == ["heatmap_kinda.png", "heatmap_kindb.png"]
    cells = [{"metric": "correct", "kind": k, "context_length": n, "significant": k == "a" and n == 512}
             for k in "ab" for n in (256, 512)]
    marks = significance_marks(cells, "correct", ("kind",))
    assert set(marks) == {("a",), ("b",)} and bool(marks[("a",)].loc["all", 512])


def test_load_table_without_the_datasets_library_is_one_line(monkeypatch, tmp_path):
    """A GPU image without `datasets` (a declared dependency) gets a line naming the install, not a
    traceback: a suite's check of its entries skips an optional entry on it."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ModuleNotFoundError
    with pytest.raises(UserError, match=r"reading xsum needs the datasets library.*pip install 'datasets>=3'"):
        load_table(Hub("nobody/nothing"), "xsum")
