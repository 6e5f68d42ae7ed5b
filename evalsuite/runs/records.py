"""Samples, records and the run folder on disk.

    results/<run>/config.json     everything needed to rerun (written first)
    results/<run>/samples.jsonl   one record per sample, appended and flushed
    results/<run>/summary.json    derived from samples.jsonl only (written last)
    results/<run>/plots/

A run is complete exactly when summary.json exists. A run killed at any moment
leaves a prefix of whole lines plus at most one torn line, which `RunFolder`
cuts off before appending again. A finished run ends with a whole line, so a
torn last line there is damage, left out and said like any damaged line.

Every record carries its run's hash. Reading keeps the first record of each
sample id whose hash, task and model are the run's; anything else (a line
copied from another run or with no hash, a duplicate, a damaged line) is left
out with one warning line, and moved to samples.rejected.jsonl when the run
resumes, so good records after a damaged line are kept rather than recomputed.

Files are parsed by `safe_json`: bytes that are not UTF-8, text that is not
JSON and values nested past its MAX_DEPTH are damaged lines (a damaged
config.json is one error line), never a traceback. A line is also damaged when
it breaks the record format (`record_format`: the type of each field, one kind
of value per field of `axes` and `scores` across the run, and what an installed
task declares), so one damaged line never turns a run's numbers into text. Resume and every reader of a finished run (report,
compare, check, view, trend, log, export) read records here, by one rule.

While a run writes, it holds an exclusive lock on run.lock (filelock: flock on POSIX,
LockFileEx on Windows) and writes its pid to run.pid: a second process on the
same folder is refused with the holder's pid. The operating system drops the
lock when its holder dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from evalsuite.errors import UserError

from .record_format import check_config, check_declared, check_fields, odd_kinds
from .safe_json import DamagedJSON, json_lines, read_json

# The axes and metrics an installed task declares, by task name (None: not installed here). The
# registry sets it when it loads: it sits above the run-folder format, which therefore cannot ask it.
DeclaredFields = Callable[[str], "tuple[Sequence[str], Sequence[str]] | None"]
_declared: list[DeclaredFields] = []


def declare_fields(lookup: DeclaredFields) -> None:
    """Check records against what their task declares, as `lookup` tells (`record_format.check_declared`)."""
    _declared[:] = [lookup]


class DamagedRun(UserError):
    """A run folder whose config.json names a task but holds a field readers cannot take apart."""


@dataclass(frozen=True)
class Record:
    """One finished sample: what was asked, what came back, how it scored."""

    id: str
    task: str
    model: str
    axes: Mapping[str, Any]
    target: tuple[str, ...]
    prompt: Mapping[str, Any]  # sha256 and token counts; the text only with --log-prompts
    info: Mapping[str, Any]  # measured facts: prompt_tokens, needle positions...
    outputs: tuple[Any, ...]
    scores: Mapping[str, Any]
    error: str | None = None
    run: str = ""  # the run's config hash: ties the record to its run folder

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Record:
        """A record from one parsed line; ValueError (saying which field) when the line is not
        a record of this format (`record_format.check_fields`)."""
        if not isinstance(raw, Mapping):
            raise ValueError("not a JSON object")
        values = dict(raw)
        check_fields(values)
        values["target"] = tuple(values["target"])
        values["outputs"] = tuple(values["outputs"])
        try:
            return cls(**values)
        except TypeError as exc:  # a field this format does not have
            raise ValueError(str(exc)) from None


@dataclass
class ReadReport:
    """What reading samples.jsonl left out, by reason."""

    damaged: list[bytes] = field(default_factory=list)
    foreign: list[bytes] = field(default_factory=list)
    duplicate: list[bytes] = field(default_factory=list)
    torn: bool = False
    why: str = ""  # what is wrong with the first damaged line, for the warning

    @property
    def rejected(self) -> list[bytes]:
        return self.damaged + self.foreign + self.duplicate

    def summary(self) -> str:
        parts = [f"{len(lines)} {what}" for what, lines in
                 (("damaged", self.damaged), ("from another run", self.foreign), ("duplicate id", self.duplicate))
                 if lines]
        return ", ".join(parts)

    def detail(self) -> str:
        """What is wrong with the first damaged line, for a warning ("" when none is damaged)."""
        return f" (the first damaged one: {self.why})" if self.damaged and self.why else ""

    def damage(self, line: bytes, why: str) -> None:
        self.damaged.append(line)
        self.why = self.why or why


def prompt_fields(prompts: Iterable[str], keep_text: bool) -> dict[str, Any]:
    """A hash of the prompts (their token counts live in the record's info), and the
    text itself only when asked for: a 64K-token run must not write gigabytes."""
    prompts = list(prompts)
    joined = "\x1e".join(prompts)
    out: dict[str, Any] = {"sha256": hashlib.sha256(joined.encode()).hexdigest()}
    if keep_text:
        out["text"] = prompts
    return out


def config_hash(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # nothing half-written is left behind
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


_WARNED: set[tuple[Any, ...]] = set()  # the warnings about damaged lines this process gave


class RunBusy(UserError):
    """A run folder another live process is writing: a wait, not a fault of the run (`watch` tries again)."""


class RunFolder:
    """The files of one run; appends records durably and reads them back."""

    def __init__(self, path: Path):
        self.path = path
        self.config_path = path / "config.json"
        self.samples_path = path / "samples.jsonl"
        self.summary_path = path / "summary.json"
        self.plots = path / "plots"
        self.append_path = self.samples_path  # where this process appends (a rank's own file under torchrun)

    @property
    def complete(self) -> bool:
        return self.summary_path.is_file()

    def create(self, config: Mapping[str, Any]) -> None:
        """Make the folder and its config, or check that an existing one matches."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.plots.mkdir(exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot write output folder {self.path}: {exc.strerror or exc}") from None
        if not os.access(self.path, os.W_OK):
            raise UserError(f"cannot write output folder {self.path}: permission denied")
        if self.config_path.is_file():
            existing = self.read_config()
            if existing.get("hash") != config.get("hash"):
                raise UserError(f"{self.path} holds a run with a different configuration; choose another --out")
            if bool(existing.get("log_prompts")) != bool(config.get("log_prompts")):
                flag = "with" if existing.get("log_prompts") else "without"
                raise UserError(f"{self.path} was started {flag} --log-prompts; resume it the same way, "
                                "or choose another --out")
            return
        write_json_atomic(self.config_path, config)

    def read_config(self) -> dict[str, Any]:
        try:
            config = read_json(self.config_path)
        except OSError as exc:
            raise UserError(f"{self.path} is not a readable run folder: cannot read config.json: "
                            f"{exc.strerror or exc}") from None
        except DamagedJSON as exc:
            raise UserError(f"{self.path} is not a readable run folder: config.json is {exc}") from None
        if not isinstance(config, dict) or not isinstance(config.get("task"), str):
            raise UserError(f"{self.path} is not a readable run folder: config.json does not name its task")
        try:
            check_config(config)
        except ValueError as exc:
            raise DamagedRun(f"{self.path} is not a readable run folder: config.json's {exc}") from None
        return config

    def read_records(self, repair: bool = False) -> list[Record]:
        """This run's records, each sample id once: samples.jsonl, then the files of data-parallel
        ranks (samples.rank*.jsonl). Lines that are not this run's are left out with a warning
        line; with `repair` (the process resuming the run) everything is consolidated into
        samples.jsonl, rejected lines move to samples.rejected.jsonl and torn last lines (a
        process killed mid-write) are cut off."""
        records, report = self._read_all()
        if repair and (report.rejected or report.torn or self.rank_files()):
            self._rewrite(records, report)
        elif report.rejected:
            self._warn_once(f"warning: {self.samples_path}: left out {report.summary()} line(s){report.detail()}; "
                            "rerun the run's command to move them to samples.rejected.jsonl")
        return records

    def _warn_once(self, message: str) -> None:
        """`message` on stderr, unless this process said it already about these very files: a
        command reads a run's records several times (report, summary, plots) and must warn once."""
        files = []
        for path in [self.samples_path, *self.rank_files()]:
            try:
                stat = path.stat()
            except OSError:  # gone since it was read: nothing to tell these files apart by
                continue
            files.append((path.name, stat.st_size, stat.st_mtime_ns))
        key = (str(self.path.resolve()), message, tuple(files))
        if key not in _WARNED:
            _WARNED.add(key)
            print(message, file=sys.stderr)

    def merge(self, order: Sequence[str]) -> None:
        """One samples.jsonl in plan order (`order`: sample ids), whatever wrote the records."""
        records = self.read_records(repair=True)
        position = {sample_id: index for index, sample_id in enumerate(order)}
        ordered = sorted(records, key=lambda r: position.get(r.id, len(position)))
        if [r.id for r in ordered] != [r.id for r in records]:
            self._rewrite(ordered, ReadReport())

    def replace_records(self, records: list[Record]) -> None:
        """samples.jsonl holding exactly `records` (written whole, then moved into place)."""
        self._rewrite(records, ReadReport())

    def rank_files(self) -> list[Path]:
        return sorted(self.path.glob("samples.rank*.jsonl"))

    def write_rank_file(self, rank: int) -> None:
        """Append this process's records to its own file (a data-parallel rank)."""
        self.append_path = self.path / f"samples.rank{rank}.jsonl"

    def _read_all(self) -> tuple[list[Record], ReadReport]:
        identity = self._identity()
        records: list[Record] = []
        seen: set[str] = set()
        report = ReadReport()
        mine: list[tuple[bytes, Record]] = []
        for path in [self.samples_path, *self.rank_files()]:
            if path.is_file():
                self._parse(_read_bytes(path), identity, mine, report, finished=self.complete)
        odd = odd_kinds([record for _, record in mine])
        declared = _declared[0](identity[1]) if _declared else None
        for index, (line, record) in enumerate(mine):
            why = odd.get(index) or (check_declared(record, *declared) if declared else None)
            if why:
                report.damage(line, why)
            elif record.id in seen:
                report.duplicate.append(line)
            else:
                seen.add(record.id)
                records.append(record)
        return records, report

    @staticmethod
    def _parse(raw: bytes, identity: tuple[str, str, str], mine: list[tuple[bytes, Record]],
               report: ReadReport, finished: bool) -> None:
        """Each line of `raw`: a record of this run goes to `mine`, anything else to `report`.
        A torn last line is the last write of a killed process, redone when the run resumes; in
        a finished run (which ends with whole lines) it is damage, said and kept aside."""
        for line in json_lines(raw):
            if line.torn and not finished:
                report.torn = True
                continue
            if line.damage is not None:
                report.damage(line.raw, line.damage)
                continue
            try:
                record = Record.from_dict(line.value)
            except ValueError as exc:  # a JSON value that is not a record of this format
                report.damage(line.raw, str(exc))
                continue
            if _belongs(record, identity):
                mine.append((line.raw, record))
            else:
                report.foreign.append(line.raw)

    def _identity(self) -> tuple[str, str, str]:
        config = self.read_config() if self.config_path.is_file() else {}
        model = config.get("model", {}).get("name", "") if isinstance(config.get("model"), Mapping) else ""
        return str(config.get("hash", "")), str(config.get("task", "")), str(model)

    def _rewrite(self, records: list[Record], report: ReadReport) -> None:
        """samples.jsonl holding only this run's records; the rest kept aside, never deleted."""
        if report.rejected:
            with (self.path / "samples.rejected.jsonl").open("ab") as fh:
                fh.writelines(line if line.endswith(b"\n") else line + b"\n" for line in report.rejected)
            print(f"warning: {self.samples_path}: moved {report.summary()} line(s) to samples.rejected.jsonl"
                  f"{report.detail()}", file=sys.stderr)
        tmp = self.samples_path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(record.to_json() + "\n" for record in records)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.samples_path)
        for path in self.rank_files():  # their records are in samples.jsonl now (a crash here only duplicates)
            path.unlink()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive write access to this run folder for the life of the block. The holder's pid
        goes to run.pid beside the lock (Windows lets no other process read a locked file)."""
        lock = FileLock(str(self.path / "run.lock"), timeout=0)
        pid_path = self.path / "run.pid"
        try:
            lock.acquire()
        except Timeout:
            try:
                holder = pid_path.read_text(encoding="utf-8").strip() or "?"
            except OSError:  # the holder has the lock and has not written its pid yet
                holder = "?"
            raise RunBusy(f"{self.path} is being written by another evalsuite process (pid {holder}); "
                            "wait for it to finish, or stop it and rerun") from None
        try:
            pid_path.write_text(f"{os.getpid()}\n", encoding="utf-8")
            yield
        finally:
            lock.release()

    def append(self, records: Iterable[Record]) -> None:
        with self.append_path.open("a", encoding="utf-8") as fh:
            for record in records:
                fh.write(record.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)


def _belongs(record: Record, identity: tuple[str, str, str]) -> bool:
    """A record is this run's when its hash, task and model are the run's."""
    run_hash, task, model = identity
    return record.run == run_hash and record.task == task and record.model == model


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def open_run(path: str | Path) -> RunFolder:
    """An existing run folder, with a clear error for anything else."""
    run = RunFolder(Path(path))
    if not run.config_path.is_file():
        raise UserError(f"not a run folder (no config.json): {path}")
    return run
