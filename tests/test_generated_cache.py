"""The generated-data cache (evalsuite/runs/generated_cache.py): made once and read back by content, a
damaged entry made again with one line, two processes filling one entry in turn, a folder that
cannot be written costing nothing but speed."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evalsuite.runs.generated_cache import GeneratedCache, cache_root, generated, tokenizer_sha256

KEY = {"generator": "demo", "version": "1.0", "seed": 3, "lengths": [512, 1024]}


def counting_maker(value):
    calls = []

    def make():
        calls.append(1)
        return value

    return make, calls


def test_made_once_then_read_with_equal_values(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path))
    make, calls = counting_maker({"docs": [{"input": "haystack", "outputs": ("7",)}]})
    first = generated("demo", KEY, make)
    second = generated("demo", dict(reversed(KEY.items())), make)  # the same key, its items in another order
    assert len(calls) == 1 and first == second == {"docs": [{"input": "haystack", "outputs": ["7"]}]}
    generated("demo", {**KEY, "seed": 4}, make)
    assert len(calls) == 2 and len(list(tmp_path.rglob("*.json.gz"))) == 2


def test_a_damaged_entry_is_made_again_with_one_line(tmp_path, capsys):
    cache = GeneratedCache(tmp_path)
    make, calls = counting_maker(["a", "b"])
    cache.fetch("demo", KEY, make)
    path = cache.path("demo", KEY)
    for damage in (path.read_bytes()[:20], b"not gzip at all",
                   gzip.compress(json.dumps({"format": 1, "kind": "demo", "key": {"other": 1}, "value": 1}).encode())):
        path.write_bytes(damage)
        capsys.readouterr()
        assert cache.fetch("demo", KEY, make) == ["a", "b"]
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "damaged" in err and str(path) in err
    assert len(calls) == 4
    assert cache.fetch("demo", KEY, make) == ["a", "b"] and len(calls) == 4  # whole again


FILL = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from evalsuite.runs.generated_cache import generated

    def make():
        with open(sys.argv[1], "a") as log:
            log.write("made\\n")
        time.sleep(1.0)  # long enough for the other process to arrive while this one makes it
        return {"docs": list(range(1000))}

    print(json.dumps(generated("demo", {"k": 1}, make)))
""")


def test_two_processes_filling_one_entry_make_it_once(tmp_path):
    log = tmp_path / "made.log"
    env = {**__import__("os").environ, "EVALSUITE_CACHE": str(tmp_path / "cache")}
    runs = [subprocess.Popen([sys.executable, "-c", FILL, str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err for _, err in outputs]
    assert log.read_text() == "made\n"
    assert json.loads(outputs[0][0]) == json.loads(outputs[1][0]) == {"docs": list(range(1000))}
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.startswith(".")]  # nothing left aside


def test_the_folder_is_an_option_and_off_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.delenv("EVALSUITE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "evalsuite" / "generated"
    monkeypatch.setenv("EVALSUITE_CACHE", "~/somewhere")
    assert cache_root() == Path.home() / "somewhere"
    monkeypatch.setenv("EVALSUITE_CACHE", "off")
    make, calls = counting_maker((1, 2))
    assert generated("demo", KEY, make) == generated("demo", KEY, make) == [1, 2]
    assert len(calls) == 2 and not (tmp_path / "xdg").exists()


def test_a_folder_that_cannot_be_written_costs_only_the_speed(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a file where the cache folder would be")
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "file"))
    make, calls = counting_maker({"x": 1})
    assert generated("demo", KEY, make) == {"x": 1} and len(calls) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "generating without it" in err


def test_a_tokenizer_is_known_by_its_content(toy_tokenizer):
    """(Not by its path: the ruler tests run two toy checkpoints of one tokenizer from two folders.)"""
    import copy

    same, other = copy.deepcopy(toy_tokenizer), copy.deepcopy(toy_tokenizer)
    other.add_tokens(["<extra>"])
    assert tokenizer_sha256(same) == tokenizer_sha256(toy_tokenizer) is not None
    assert tokenizer_sha256(other) != tokenizer_sha256(toy_tokenizer)
    assert tokenizer_sha256(object()) is None


@pytest.mark.parametrize("kind", ["ruler", "other"])
def test_entries_of_one_key_and_two_kinds_are_apart(tmp_path, kind):
    cache = GeneratedCache(tmp_path)
    assert cache.path(kind, KEY) != cache.path("demo", KEY)
    assert cache.path(kind, KEY).parent.parent.name == kind


def test_the_environment_key_is_the_generators_requirements_alone(tmp_path, monkeypatch):
    """A distribution installed beside the generator (a plugin, a test's package on sys.path) keeps the
    key; the generator's own requirements are in it, however deep."""
    from importlib import metadata

    from evalsuite.runs.generated_cache import _requirement_closure, environment_sha256

    before = environment_sha256("lm-eval")
    info = tmp_path / "evalsuite_unrelated-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evalsuite-unrelated\nVersion: 0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "evalsuite-unrelated" in {d.metadata["Name"] for d in metadata.distributions()}
    assert environment_sha256("lm-eval") == before
    closure = _requirement_closure("lm-eval")
    assert {"lm-eval", "nltk", "wonderwords", "numpy"} <= set(closure)  # the ruler extra's and a deep one
