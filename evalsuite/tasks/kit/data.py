"""The one data loader of the tasks: a local file, a folder of files, or `datasets.load_dataset`.

    load_table(source, what)            rows of a table: a .jsonl/.json/.csv/.parquet file, a folder
                                         of such files (one format), or a hub name / local dataset
                                         folder through `datasets.load_dataset` (`Hub` says which)
    load_texts(source, what, field)      texts: a text file, a folder of .txt files (one text each),
                                         or `dataset:NAME[:SPLIT]` (column `field`)
    dataset_column(spec, field, what)    one column of `dataset:NAME[:SPLIT]`

Every failure is one line naming `what` the data is for and what to do (a UserError): a path that
is not there, a format it cannot read, an empty file, a missing column, a hub name it cannot load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, first_line

TABLE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TABLE_SUFFIXES = ", ".join(TABLE_FORMATS)


@dataclass(frozen=True)
class Hub:
    """A dataset `datasets.load_dataset` finds by name (the hub, or a local dataset folder)."""

    path: str
    config: str | None = None
    split: str | None = "train"  # None: every split (a DatasetDict)
    revision: str | None = None


def load_table(source: str | Path | Hub, what: str, advice: str = "give a local copy") -> Any:
    """A `datasets.Dataset` (a `DatasetDict` for a Hub with split None) of `source`'s rows; `advice`
    ends the message of a hub name that cannot be loaded (how the task takes a local copy)."""
    try:
        import datasets
    except ModuleNotFoundError:  # a declared dependency, yet a bare GPU image can lack it: say so, not a traceback
        raise UserError(f"reading {what} needs the datasets library, which is not installed: "
                        "pip install 'datasets>=3'") from None

    datasets.disable_progress_bars()  # a small file loads in a blink; keep stderr for errors
    if isinstance(source, Hub):
        return _hub_table(source, what, advice)
    path = Path(source).expanduser()
    files = _table_files(path, what) if path.is_dir() else [_table_file(path, what)]
    builder = TABLE_FORMATS[files[0].suffix.lower()]
    if all(_is_empty(f) for f in files):  # datasets says StopIteration, or "corresponds to no data"
        raise UserError(f"{what} {source} is empty: it holds no rows")
    try:
        return datasets.load_dataset(builder, data_files=[str(f.resolve()) for f in files], split="train")
    except Exception as exc:  # pyarrow, json and csv parsers each raise their own types for a bad file
        raise UserError(f"cannot read {what} {source} as {builder}: {first_line(exc)}") from None


def _table_file(path: Path, what: str) -> Path:
    if path.suffix.lower() not in TABLE_FORMATS:
        raise UserError(f"{what} {path}: unsupported file type {path.suffix or '(none)'}; use {TABLE_SUFFIXES}")
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    return path


def _table_files(folder: Path, what: str) -> list[Path]:
    """A folder's table files, all of one format (a mix has no one column layout)."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in TABLE_FORMATS and p.is_file())
    if not files:
        raise UserError(f"{what} {folder} is a folder with no {TABLE_SUFFIXES} files; give a file or such a folder")
    kinds = {TABLE_FORMATS[f.suffix.lower()] for f in files}
    if len(kinds) > 1:
        raise UserError(f"{what} {folder} mixes {' and '.join(sorted(kinds))} files; keep one format per folder")
    return files


def _hub_table(hub: Hub, what: str, advice: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(hub.path, hub.config, split=hub.split, revision=hub.revision)
    except Exception as exc:  # offline, missing, gated, a changed repository: many types, one meaning
        raise UserError(f"could not load {what} ({hub.path}): {first_line(exc)}; {advice}") from None


def _is_empty(path: Path) -> bool:
    """A file of zero bytes, or (a text format) of blank lines only; a large file is not read whole."""
    size = path.stat().st_size
    if size == 0:
        return True
    if path.suffix.lower() == ".parquet" or size > 1 << 20:
        return False
    return not path.read_bytes().strip()


def require_columns(table: Any, columns: Sequence[tuple[str, str]], where: str, hint: str = "") -> None:
    """A one-line error for the first (role, column) of `columns` the table lacks."""
    for role, column in columns:
        if column not in table.column_names:
            raise UserError(f"{where} has no {role} column {column!r} (columns: {', '.join(table.column_names)})"
                            + (f"; {hint.format(role=role)}" if hint else ""))


# ---- texts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    name: str  # where it came from: a file name, or dataset[row]
    text: str


def load_texts(source: str, what: str, field: str = "text", limit: int | None = None, advice: str = ""
               ) -> list[Text]:
    """The texts of a text file (one), a folder of .txt files (one each, by name; only the first
    `limit` are read) or `dataset:NAME[:SPLIT]` (column `field`, its first `limit` rows);
    `advice` follows the message of a path that is not there."""
    if source.startswith("dataset:"):
        name, values = dataset_column(source, field, what, limit)
        return [Text(f"{name}[{i}]", "" if value is None else str(value)) for i, value in enumerate(values)]
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.txt"))[:limit]
        if not files:
            raise UserError(f"{what} {source} is a folder that holds no .txt files")
        return [Text(f.name, read_text(f, what)) for f in files]
    if not path.is_file():
        raise UserError(f"{what} not found: {source}{f' ({advice})' if advice else ''}")
    return [Text(path.name, read_text(path, what))]


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} file {path}: {exc}") from None


def dataset_column(spec: str, field: str, what: str, limit: int | None = None) -> tuple[str, list[Any]]:
    """`dataset:NAME[:SPLIT]` (split `train` by default) loaded with `datasets.load_dataset`:
    the name and the first `limit` values (all with None) of column `field`; one-line
    UserErrors naming `what` the data is for."""
    import datasets

    _, name, *rest = spec.split(":")
    split = rest[0] if rest else "train"
    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types; all mean "cannot load this name"
        raise UserError(f"cannot load {what} from dataset {name!r} (split {split}): {first_line(exc)}") from None
    if field not in data.column_names:
        raise UserError(f"{what}: dataset {name!r} has no column {field!r}; columns: {', '.join(data.column_names)}")
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    return name, list(data[field])
