"""A run resumed under other library versions than those that wrote its records so far: refused in
one line naming both, unless `--allow-version-change`; then config.json says which versions wrote
which samples, and `compare` shows the run's versions joined.

The older versions are made by editing a real run's config.json (a run killed part-way, as under
an older transformers and torch), not by installing old releases."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import invoke

from evalsuite.engine.code_versions import library_versions

RUN = ("run", "--model", "fake:oracle", "--task", "needle", "-T", "lengths=512", "-T", "depths=0,0.5,1",
       "-T", "samples=2", "--no-progress")
OLD = {"transformers": "4.0.0", "torch": "1.0.0"}


def killed_under_old_versions(capsys, out: Path, kept: int = 2) -> tuple[Path, list[str]]:
    """A finished run cut back to its first `kept` records, no summary, its config naming OLD versions."""
    code, _, err = invoke(capsys, *RUN, "--out", str(out))
    assert code == 0, err
    (run,) = [p for p in out.iterdir() if (p / "config.json").is_file()]
    config = json.loads((run / "config.json").read_text())
    config["versions"].update(OLD)
    (run / "config.json").write_text(json.dumps(config))
    lines = (run / "samples.jsonl").read_text().splitlines(keepends=True)
    (run / "samples.jsonl").write_text("".join(lines[:kept]))
    (run / "summary.json").unlink()
    return run, [json.loads(line)["id"] for line in lines[kept:]]


def test_a_resume_under_other_versions_is_refused_naming_both(capsys, tmp_path):
    run, _ = killed_under_old_versions(capsys, tmp_path)
    before = (run / "samples.jsonl").read_bytes()
    code, _, err = invoke(capsys, *RUN, "--out", str(tmp_path))
    now = library_versions()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "transformers 4.0.0" in err and "torch 1.0.0" in err, err  # what wrote the records so far
    assert f"transformers {now['transformers']}" in err and f"torch {now['torch']}" in err, err  # this process
    assert "--allow-version-change" in err
    assert (run / "samples.jsonl").read_bytes() == before and not (run / "summary.json").exists()


def test_allowed_the_resume_records_which_versions_wrote_which_samples(capsys, tmp_path):
    run, left = killed_under_old_versions(capsys, tmp_path)
    code, _, err = invoke(capsys, *RUN, "--out", str(tmp_path), "--allow-version-change")
    assert code == 0, err
    assert f"the {len(left)} left are written with" in err and "resumed_under" in err, err
    config = json.loads((run / "config.json").read_text())
    assert {k: config["versions"][k] for k in OLD} == OLD  # the first records' versions stay
    (resumed,) = config["resumed_under"]
    assert resumed == {"versions": library_versions(), "samples": left}
    written = [json.loads(line)["id"] for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(written) == 6 and set(left) < set(written)
    assert json.loads((run / "summary.json").read_text())["n"] == 6

    code, _, err = invoke(capsys, *RUN, "--out", str(tmp_path))  # finished: nothing left to write, nothing refused
    assert code == 0 and "resumed_under" not in err, err
    assert json.loads((run / "config.json").read_text())["resumed_under"] == [resumed]

    from evalsuite.runs.versions import version_differences

    other = {**config, "resumed_under": []}
    (difference,) = [d for d in version_differences([config, other]) if d.startswith("transformers")]
    assert difference == f"transformers 4.0.0+{library_versions()['transformers']} vs 4.0.0"


def test_a_finished_run_under_other_versions_is_read_not_refused(capsys, tmp_path):
    run, _ = killed_under_old_versions(capsys, tmp_path, kept=6)  # every record there: nothing to write
    code, _, err = invoke(capsys, *RUN, "--out", str(tmp_path))
    assert code == 0, err
    assert "resumed_under" not in json.loads((run / "config.json").read_text())
