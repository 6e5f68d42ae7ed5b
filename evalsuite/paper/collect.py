"""The runs a paper report reads: every suite result in a results folder, by entry and model.

`evalsuite run --suite diff-paper --model A --model B` writes one suite result per model
(`suite-diff-paper-<model>.json`), each listing its run folders by entry name, and the entries it
skipped. The baseline is the model the run compared the others with (the first `--model`, or
`--baseline`): it is read back from the comparison folders the run wrote, or given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.runs.records import RunFolder, open_run
from evalsuite.runs.safe_json import read_json
from evalsuite.runs.suite_result import RESULT_FORMAT, read_json_input, skipped_entries, suite_model, suite_runs


@dataclass(frozen=True)
class PaperRuns:
    """Entry name -> model -> run folder, the models in report order (baseline first), what was skipped."""

    suite: str
    models: tuple[str, ...]
    runs: dict[str, dict[str, RunFolder]]
    skipped: dict[str, str] = field(default_factory=dict)  # entry name -> why
    notes: dict[str, list[str]] = field(default_factory=dict)  # entry name -> notes of its runs (lengths clipped)

    @property
    def baseline(self) -> str:
        return self.models[0]

    def entries(self, prefix: str) -> list[str]:
        """The entry names that start with `prefix` and ran, in suite order."""
        return [name for name in self.runs if name == prefix or name.startswith(prefix + "-")]

    def models_of(self, entry: str) -> list[tuple[str, RunFolder]]:
        """(model, run) of an entry, baseline first."""
        found = self.runs.get(entry, {})
        return [(model, found[model]) for model in self.models if model in found]


def suite_files(results: Path, suite: str | None) -> list[Path]:
    """The suite result files in `results` (of `suite` when named)."""
    if not results.is_dir():
        raise UserError(f"--paper takes a results folder; {results} is not one")
    files = []
    for path in sorted(results.glob("suite-*.json")):
        data = read_json_input(path)
        if data.get("format") == RESULT_FORMAT and (suite is None or data.get("suite") == suite):
            files.append(path)
    if not files:
        raise UserError(f"no suite results in {results}; run `evalsuite run --suite diff-paper --model A --model B "
                        f"--out {results}` first")
    return files


def collect(results: str | Path, baseline: str | None = None, suite: str | None = None) -> PaperRuns:
    """Every model's runs of one suite in `results`."""
    files = suite_files(Path(results), suite)
    datas = [read_json_input(path) for path in files]
    suites = sorted({str(d.get("suite")) for d in datas})
    if len(suites) > 1:
        raise UserError(f"{results} holds results of several suites ({', '.join(suites)}); name one with --suite")
    runs: dict[str, dict[str, RunFolder]] = {}
    notes: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    models = []
    for path, data in zip(files, datas):
        model = suite_model(path, data)
        models.append(model)
        for name, folder in suite_runs(path, data):
            runs.setdefault(name, {})[model] = open_run(folder)
        for item in data.get("runs", []):
            if item.get("note"):
                notes.setdefault(str(item["name"]), []).append(f"{model}: {item['note']}")
        skipped.update(skipped_entries(path, data))
    ordered = _baseline_first(models, baseline or _compared_baseline(Path(results), runs))
    return PaperRuns(suite=suites[0], models=tuple(ordered), runs=runs, skipped=skipped, notes=notes)


def _baseline_first(models: Sequence[str], baseline: str | None) -> list[str]:
    if baseline is not None and baseline not in models:
        raise UserError(f"--baseline {baseline} is none of the models with results ({', '.join(models)})")
    chosen = baseline if baseline is not None else models[0]
    return [chosen, *(m for m in models if m != chosen)]


def _compared_baseline(results: Path, runs: dict[str, dict[str, RunFolder]]) -> str | None:
    """The model on the baseline side of the comparisons the suite run wrote beside its runs."""
    folders = {run.path.name for by_model in runs.values() for run in by_model.values()}
    for path in sorted(results.glob("compare-*/comparison.json")):
        try:
            data = read_json(path)
        except (OSError, ValueError):  # a damaged comparison names no baseline
            continue
        side = data.get("a") if isinstance(data, dict) else None
        if isinstance(side, dict) and side.get("run") in folders:
            return str(side.get("model"))
    return None
