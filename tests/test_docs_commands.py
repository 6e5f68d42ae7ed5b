"""Commands of the docs as written: a shell pattern that names a run matches one run folder after
the README's quickstart has filled results/, a figure is copied before a later command
overwrites it, and a model folder made as docs/diff-v2.md makes it runs (it holds a tokenizer)."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

from conftest import invoke

DOCS = Path(__file__).parents[1] / "docs"
README = DOCS.parent / "README.md"


def blocks(path: Path, language: str = "bash") -> list[str]:
    """The fenced code blocks of `language` (or of none named) in a markdown file, continuation lines joined."""
    found = re.findall(r"```(\w*)\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
    return [block.replace("\\\n", " ") for named, block in found if named in (language, "")]


def commands(text: str) -> list[list[str]]:
    """`evalsuite ...` lines of a block as argument lists (comments left out)."""
    out = []
    for line in text.splitlines():
        for part in line.split("&&"):  # `pip install . && evalsuite run ...`
            if part.strip().startswith("evalsuite "):
                out.append(shlex.split(part, comments=True)[1:])
    return out


def option(words: list[str], name: str, default: str) -> str:
    return words[words.index(name) + 1] if name in words else default


def run_folders(words: list[str], index: int) -> list[str]:
    """The run folders `evalsuite run WORDS` writes, named as the runner names them: task-model-hash."""
    models = [words[i + 1] for i, w in enumerate(words) if w == "--model"]
    task, out = option(words, "--task", "?"), option(words, "--out", "results")
    return [f"{out}/{task}-{Path(model).name}-{index:010x}" for model in models]


def test_every_run_pattern_of_compare_and_export_matches_one_run(tmp_path):
    quickstart = next(c for c in commands(README.read_text()) if c[:1] == ["run"] and "needle" in c)
    documented = [c for block in blocks(DOCS / "compare-and-check.md")[:1] for c in commands(block)]
    runs = [c for c in [quickstart, *documented] if c[0] == "run"]
    for index, words in enumerate(runs):  # the quickstart's runs, then the doc's, each a distinct configuration
        for folder in run_folders(words, index):
            (tmp_path / folder).mkdir(parents=True)
    readers = [c for c in documented if c[0] == "compare"]
    readers += [c for block in blocks(DOCS / "trackers-and-export.md") for c in commands(block) if c[0] == "export"]
    assert len(readers) == 2
    for words in readers:
        for pattern in (w for w in words if "*" in w):
            matched = glob.glob(str(tmp_path / pattern))
            assert len(matched) == 1, (words[0], pattern, matched)


def test_the_trend_figure_is_copied_before_a_later_trend_overwrites_it():
    (block,) = [b for b in blocks(DOCS / "checkpoints.md") if "trend_example.png" in b]
    written: dict[str, list[str]] = {}  # trend output folder -> the runs drawn into it
    copied = None
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["evalsuite", "trend"]:
            runs = [w for w in words[2:] if not w.startswith("-")]
            written[option(words, "--out", "trend")] = runs
        if "cp" in words and "trend/trend_correct_all.png" in words:
            copied = written.get("trend")
    assert copied == ["results"]  # every checkpoint, the broken one included: the figure the doc shows


def test_a_v2_folder_made_as_the_doc_makes_it_runs(tmp_path, capsys, monkeypatch):
    (code,) = [b for b in blocks(DOCS / "diff-v2.md", "python") if 'save_pretrained("my-v2")' in b]
    small = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "intermediate_size": 128}  # the doc's model, smaller: the same steps
    for key, value in small.items():
        code = re.sub(rf"{key}=\d+", f"{key}={value}", code)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/diff-v2.md", "exec"), {})
    (run,) = [c for b in blocks(DOCS / "diff-v2.md") for c in commands(b) if c[:3] == ["run", "--model", "my-v2"]]
    ran = invoke(capsys, *run, "--device", "cpu", "--no-progress", "--out", str(tmp_path / "results"))
    assert ran.code == 0, ran.err
    assert len(list((tmp_path / "results").glob("needle-*/summary.json"))) == 1
