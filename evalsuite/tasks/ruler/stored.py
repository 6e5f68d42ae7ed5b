"""RULER's samples made once: lm-eval's generator runs only where the generated-data cache
(runs/generated_cache.py) holds no entry for what the samples depend on.

The key of a sub-task's samples (everything they depend on, by content):
- the generator: lm-eval and its version, the environment it runs in (Python and the version of every
  installed distribution lm-eval requires, however deeply: the draws imports make after seeding and
  NLTK's and wonderwords' code come from them) and the task's plan version (how evalsuite calls the generator);
- the tokenizer: the sha256 of its content (not its path), the counts the model gives a few probe
  texts (which catch the counting rule: a BOS or none, a chat template or none) and whether prompts are
  chat-templated;
- the sub-task, its lengths in order, lm-eval's two seeds;
- the local data's content (the essays, the QA file) and, for the essay sub-tasks, NLTK's punkt_tab model.
An entry holds the sub-task's YAML settings and all of lm-eval's documents of those lengths (500 a
length), so any `-T samples` reads the same entry. A model that shows no tokenizer content (the fake
backend, a server without a local tokenizer) generates every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evalsuite.modeling.compat import installed_version
from evalsuite.runs.generated_cache import as_stored, content_key, environment_sha256, generated, tokenizer_sha256

from . import generator
from .stand_ins import PUNKT, LocalData

KIND = "ruler"
# texts whose counts tell counting rules apart: empty (the special tokens alone), words, digits and
# punctuation, non-ASCII, a run of whitespace
PROBES = ("", "The grass is green.", "7654321, 12:30 -- (a) [b] {c}", "Ünïcødé 日本語 テキスト", " \n\n\t  x")


def made(name: str, lengths: Sequence[int], seeds: tuple[int, int], model: Any, data: LocalData,
         split_sentences: bool, plan_version: int) -> tuple[generator.Setting, list[dict[str, Any]]]:
    """Sub-task `name`'s YAML settings and lm-eval's documents at `lengths`, from the cache or made now."""
    def make() -> dict[str, Any]:
        found = generator.setting(name)
        docs = generator.generate(name, found, lengths, seeds, model.count_tokens, data, split_sentences)
        return {"setting": dataclasses.asdict(found), "docs": docs}

    key = sample_key(name, lengths, seeds, model, data, split_sentences, plan_version)
    value = as_stored(make()) if key is None else generated(KIND, key, make)
    return generator.Setting(**value["setting"]), value["docs"]


def sample_key(name: str, lengths: Sequence[int], seeds: tuple[int, int], model: Any, data: LocalData,
               split_sentences: bool, plan_version: int) -> dict[str, Any] | None:
    """What the samples depend on (the module's docstring), or None where the tokenizer's content is unknown."""
    tokenizer = tokenizer_sha256(getattr(model, "tokenizer", None))
    if tokenizer is None:
        return None
    return {"generator": "lm-eval", "version": installed_version("lm-eval"), "environment": environment_sha256("lm-eval"),
            "plan_version": plan_version, "tokenizer": tokenizer,
            "counts": [model.count_tokens(text) for text in PROBES], "chat_template": bool(model.chat_template),
            "subtask": name, "lengths": list(lengths), "seeds": list(seeds), "data": data_sha256(data),
            "punkt": punkt_sha256() if split_sentences else None}


def data_sha256(data: LocalData) -> str:
    return content_key({"essays": list(data.essays), "qa_json": data.qa_json})


def punkt_sha256() -> str | None:
    """The sha256 of NLTK's English punkt_tab model where NLTK finds it first (None: nowhere), found
    without importing NLTK: the folders NLTK searches on POSIX (NLTK_DATA's, then its defaults)."""
    homes = [p for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p] + ["~/nltk_data"]
    homes += [os.path.join(sys.prefix, *parts) for parts in (("nltk_data",), ("share", "nltk_data"),
                                                             ("lib", "nltk_data"))]
    homes += ["/usr/share/nltk_data", "/usr/local/share/nltk_data", "/usr/lib/nltk_data", "/usr/local/lib/nltk_data"]
    for home in homes:
        english, packed = Path(home).expanduser() / PUNKT / "english", Path(home).expanduser() / f"{PUNKT}.zip"
        if english.is_dir():
            digest = hashlib.sha256()
            for path in sorted(p for p in english.rglob("*") if p.is_file()):
                digest.update(json.dumps(str(path.relative_to(english))).encode() + path.read_bytes())
            return digest.hexdigest()
        if packed.is_file():  # NLTK reads a zipped model too
            return hashlib.sha256(packed.read_bytes()).hexdigest()
    return None
