"""The suite result file: what the analysis commands accept besides a run folder.

`evalsuite run --suite` writes `suite-<suite>-<model>.json` here (`write_suite_result`), listing
its run folders by name and the entries it skipped; report, compare and check read it here,
finding the folders beside the file so that a results folder can be moved as a whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError

from .confine import beside
from .records import open_run, write_json_atomic
from .safe_json import DamagedJSON, holds, read_json

RESULT_FORMAT = "evalsuite-suite-result"


def read_json_input(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path)
    except OSError as exc:
        raise UserError(f"{path} is neither a run folder nor a readable file: {exc.strerror or exc}") from None
    except DamagedJSON as exc:
        raise UserError(f"{path} is neither a run folder nor a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is neither a run folder nor a suite result / baseline file")
    return data


def suite_runs(path: Path, data: Mapping[str, Any] | None = None) -> list[tuple[str, Path]]:
    """(entry name, run folder) of every run a suite result lists; folders are
    found beside the result file, so a results folder can be moved as a whole."""
    data = read_json_input(path) if data is None else data
    if data.get("format") != RESULT_FORMAT:
        raise UserError(f"{path} is not a suite result file (format {data.get('format')!r})")
    out = []
    for item in _entries(path, data, "runs", "run"):
        folder = beside(path.parent, item["run"], f"a run folder {path} lists")
        open_run(folder)  # a clear error when a listed run is missing
        out.append((item["name"], folder))
    return out


def _entries(path: Path, data: Mapping[str, Any], section: str, detail: str) -> list[dict[str, str]]:
    """The entries of `section` (runs, skipped): each an object whose name and `detail` are text."""
    entries = data.get(section, [])
    if not isinstance(entries, list) or not all(
            isinstance(item, dict) and holds(item.get("name"), (str,)) and holds(item.get(detail), (str,))
            for item in entries):
        raise UserError(f"{path} is a damaged suite result: its {section!r} are not entries with a name "
                        f"and a {detail}")
    return entries


def run_folders(inputs: Sequence[str | Path]) -> list[Path]:
    """Run folders from run folders and suite result files, in the order given."""
    folders = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            folders.append(open_run(path).path)
        elif path.is_file():
            folders.extend(folder for _, folder in suite_runs(path))
        else:
            raise UserError(f"no such run folder or suite result: {item}")
    return folders


def write_suite_result(path: Path, content: Mapping[str, Any]) -> None:
    """A suite result file: `content` (suite, suite_file, model, model_spec, scale, runs, skipped)
    under this format's name and version."""
    write_json_atomic(path, {"format": RESULT_FORMAT, "version": 1, **content})


def skipped_entries(result: Path, data: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(entry name, why) of the entries a suite result file says were left out."""
    data = read_json_input(result) if data is None else data
    return [(item["name"], item["reason"]) for item in _entries(result, data, "skipped", "reason")]


def suite_model(result: Path, data: Mapping[str, Any]) -> str:
    """The model whose runs a suite result lists."""
    if not holds(data.get("model"), (str,)) or not data["model"]:
        raise UserError(f"{result} is a damaged suite result: it names no model")
    return str(data["model"])
