"""Data a task generates before it runs (RULER's samples), stored once and read back by content.

A task whose plan is expensive to build asks `generated(kind, key, make)`: `key` is everything the
data depends on (the generator's library and version, the tokenizer's content, seeds, sizes, the
local data's content), written as JSON; its sha256 names the entry. Where an entry with an equal key
is stored, it is read and `make` is not called; otherwise `make()` runs and its value is stored. The
value returned is the value as stored (read back through JSON), so a run that made the data and one
that read it hold equal values.

Where: `EVALSUITE_CACHE` names the folder (`off` turns the cache off); else `$XDG_CACHE_HOME/evalsuite/
generated`, else `~/.cache/evalsuite/generated`. An entry is `<kind>/<ab>/<sha256>.json.gz` holding its
key and value. Two processes filling one entry at once take turns on a lock beside it (the second
reads what the first made); an entry is written aside and renamed into place, so a reader never sees
half of one. An entry that cannot be read (cut short, not gzip or JSON, another key) is made again,
with one line on stderr. A cache folder that cannot be written costs the speed, never the run.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock

ENV = "EVALSUITE_CACHE"
OFF = "off"
FORMAT = 1  # bump when an entry's layout changes: older entries then read as damaged and are made again


def cache_root() -> Path | None:
    """The cache folder (None: turned off with EVALSUITE_CACHE=off)."""
    named = os.environ.get(ENV, "").strip()
    if named.lower() == OFF:
        return None
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base).expanduser() / "evalsuite" / "generated"


def content_key(key: Mapping[str, Any]) -> str:
    """The sha256 of a key's canonical JSON: equal keys, equal names."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_sha256(tokenizer: Any) -> str | None:
    """The sha256 of a tokenizer's whole content as the `tokenizers` library serializes it (vocabulary,
    merges, normalizer, pre-tokenizer, post-processor, added tokens): equal hashes, equal tokens. None
    for a tokenizer without that serialization."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    serialize = getattr(backend, "to_str", None)
    return text_sha256(serialize()) if callable(serialize) else None


@functools.cache
def environment_sha256(root: str) -> str:
    """The sha256 of Python's version and of `root` and every installed distribution it requires, however
    deeply (extras included), with their versions: a key part for data whose generation depends on more
    than its generator's own version. Only that closure counts, so a package installed beside it (a
    plugin, a test's) keeps the key."""
    return content_key({"python": sys.version, "distributions": sorted(_requirement_closure(root).items())})


def _requirement_closure(root: str) -> dict[str, str]:
    """`root` and the installed distributions it requires, transitively: name -> version."""
    found: dict[str, str] = {}
    pending = [root]
    while pending:
        name = _normalized(pending.pop())
        if name in found:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # an optional requirement not installed here
            continue
        found[name] = distribution.version
        pending.extend(_requirement_name(line) for line in distribution.requires or ())
    return found


def _requirement_name(line: str) -> str:
    """The distribution a requirement line names ("nltk>=3; extra == 'ruler'" -> "nltk")."""
    end = next((i for i, c in enumerate(line) if not (c.isalnum() or c in "-_.")), len(line))
    return line[:end]


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def generated(kind: str, key: Mapping[str, Any], make: Callable[[], Any]) -> Any:
    """`make()`'s value, read from the cache where an entry of this kind and key is stored."""
    root = cache_root()
    if root is None:
        return as_stored(make())
    return GeneratedCache(root).fetch(kind, key, make)


@dataclass(frozen=True)
class GeneratedCache:
    """The entries under one folder."""

    root: Path

    def path(self, kind: str, key: Mapping[str, Any]) -> Path:
        name = content_key({"kind": kind, **key})
        return self.root / kind / name[:2] / f"{name}.json.gz"

    def fetch(self, kind: str, key: Mapping[str, Any], make: Callable[[], Any]) -> Any:
        path = self.path(kind, key)
        found, damage = self._read(path, kind, key)
        if damage is None and found is not None:
            return found[0]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path.with_name(path.name + ".lock")))
            lock.acquire()
        except OSError as exc:
            print(f"evalsuite: cannot use the cache folder {self.root} ({exc}); generating without it",
                  file=sys.stderr)
            return as_stored(make())
        try:
            found, damage_now = self._read(path, kind, key)  # another process may have made it meanwhile
            if damage_now is None and found is not None:
                return found[0]
            if damage_now:
                print(f"evalsuite: cached {kind} data {path} is damaged ({damage}); generating it again",
                      file=sys.stderr)
            value = as_stored(make())
            self._write(path, kind, key, value)
            return value
        finally:
            lock.release()

    @staticmethod
    def _read(path: Path, kind: str, key: Mapping[str, Any]) -> tuple[tuple[Any] | None, str | None]:
        """((value,), None) for a good entry, (None, None) for none, (None, what is wrong) for a damaged one."""
        try:
            with gzip.open(path, "rt", encoding="utf-8") as stream:
                entry = json.load(stream)
        except FileNotFoundError:
            return None, None
        except (OSError, EOFError, ValueError) as exc:  # gzip's CRC and length checks, JSON's syntax
            return None, f"{type(exc).__name__}: {str(exc)[:80]}"
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or "value" not in entry:
            return None, "not an entry of this format"
        if entry.get("kind") != kind or entry.get("key") != as_stored(dict(key)):
            return None, "its key differs from its name's"
        return (entry["value"],), None

    @staticmethod
    def _write(path: Path, kind: str, key: Mapping[str, Any], value: Any) -> None:
        entry = {"format": FORMAT, "kind": kind, "key": dict(key), "value": value}
        try:
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as aside:
                with gzip.open(aside, "wt", encoding="utf-8", compresslevel=1) as stream:
                    json.dump(entry, stream, ensure_ascii=False)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(aside.name, 0o666 & ~mask)  # as any file this user makes (a temporary file is private)
            os.replace(aside.name, path)  # whole or not at all, for readers that take no lock
        except OSError as exc:
            with contextlib.suppress(OSError, NameError):
                os.unlink(aside.name)
            print(f"evalsuite: could not store {kind} data in {path.parent} ({exc}); the run goes on",
                  file=sys.stderr)


def as_stored(value: Any) -> Any:
    """`value` as an entry holds it: through JSON (tuples become lists), so made and read values are equal."""
    return json.loads(json.dumps(value, ensure_ascii=False))
