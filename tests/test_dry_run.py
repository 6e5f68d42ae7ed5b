"""`evalsuite run ... --dry-run`: the plan and a measured time estimate; nothing run, nothing written.

The estimate scales a plan's tokens by a calibration measured on the machine, so no test here
rests on what it measures: the commands are given a fixed calibration (`fixed_speed`), and the
rule that flags a long plan is tested on costs of known seconds."""

from __future__ import annotations

import json

import pytest
from conftest import invoke

from evalsuite.engine import plan_cost
from evalsuite.engine.plan_cost import HOUR, Calibration, GroupCost, PlanCost, describe

# 1 ms per prompt token and 20 ms per new token: paper-64k's 73.7M prompt tokens are about 20 hours
FIXED = Calibration(prefill_s_per_token=1e-3, decode_s_per_token=2e-2)


@pytest.fixture
def fixed_speed(monkeypatch):
    """The calibration of every dry run in the test is FIXED, whatever this machine's speed and load."""
    monkeypatch.setattr(plan_cost, "calibrate", lambda model: FIXED)
    return FIXED


def test_paper_64k_plan_on_toy_base_is_counted_and_flagged_as_long(capsys, tmp_path, fixed_speed):
    out = tmp_path / "results"
    code, text, err = invoke(capsys, "run", "--model", "toy-base", "--task", "needle", "-T", "preset=paper-64k",
                             "-M", "max_context=65536", "--out", str(out), "--dry-run")
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0].startswith("dry run: about ") and "(more than an hour)" in lines[0]
    assert "needle on toy-base: 2,000 samples in 40 cells (50 per cell)" in text
    rows = [line for line in lines if line.startswith("  | ") and line[4].isdigit()]
    assert [row.split(" | ")[1] for row in rows] == [f"{8192 * k:,}" for k in range(1, 9)]
    assert all(row.split(" | ")[2] == "250" for row in rows)
    assert "new tokens at most 40,000" in text  # 2,000 samples x 20 answer tokens
    assert not out.exists() and not list(tmp_path.iterdir())


def test_counted_prompt_tokens_match_the_real_runs(capsys, tmp_path, fixed_speed, monkeypatch):
    """Every sample of a small plan is built by the dry run: its count is what the run records."""
    monkeypatch.setattr(plan_cost, "BUILD_BUDGET_S", float(HOUR))  # every length built, however slow the machine
    args = ["--model", "toy-base", "--task", "needle", "-T", "lengths=256,512", "-T", "depths=0,1", "-T", "samples=1",
            "--out", str(tmp_path)]
    code, text, err = invoke(capsys, "run", *args, "--dry-run")
    assert code == 0, err
    assert "more than an hour" not in text.splitlines()[0]
    planned = {int(row.split(" | ")[1]): int(row.split(" | ")[3].replace(",", ""))
               for row in text.splitlines() if row.startswith("  | 2") or row.startswith("  | 5")}
    assert not list(tmp_path.iterdir())
    code, _, err = invoke(capsys, "run", *args, "--no-progress")
    assert code == 0, err
    (run,) = tmp_path.glob("needle-toy-base-*")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    measured: dict[int, int] = {}
    for record in records:
        length = record["axes"]["context_length"]
        measured[length] = measured.get(length, 0) + record["info"]["prompt_tokens"]
    assert planned == measured


def _cost_of(seconds: float) -> PlanCost:
    """A plan of one group whose estimate is `seconds` (a second per prompt token)."""
    group = GroupCost(length=1024, samples=1, prompt_tokens=round(seconds), new_tokens=0, counted="built")
    return PlanCost(task="needle", model="m", cells=(("all", 1),), groups=(group,), calibration=Calibration(1.0, 1.0))


@pytest.mark.parametrize(("seconds", "long"), [(0, False), (HOUR - 1, False), (HOUR, False), (HOUR + 1, True),
                                               (40 * HOUR, True)])
def test_a_plan_is_flagged_as_long_exactly_past_an_hour(seconds, long):
    first = describe([_cost_of(seconds)]).splitlines()[0]
    assert first.startswith("dry run: about ") and first.endswith("nothing was run or written")
    assert ("(more than an hour)" in first) == long, first


def test_the_flag_counts_every_plan_together():
    first = describe([_cost_of(HOUR * 0.6), _cost_of(HOUR * 0.6)]).splitlines()[0]
    assert "(more than an hour)" in first and "1 h 12 min" in first


def test_groups_past_the_build_budget_are_counted_from_their_length(monkeypatch):
    from evalsuite.backends import load_model
    from evalsuite.engine.runner import check_task, make_task, planned_samples

    monkeypatch.setattr(plan_cost, "BUILD_BUDGET_S", 0.0)  # only the first (shortest) group is built
    model = load_model("fake", {})
    task = make_task("needle", {"lengths": "1024,2048,4096", "depths": "0,1", "samples": "2"})
    state = check_task(task, model)
    cost = plan_cost.plan_cost(task, model, planned_samples(task, state, None), state,
                               plan_cost.Calibration(1e-3, 1e-2))
    assert [g.counted for g in cost.groups] == ["built", "from length", "from length"]
    assert [(g.length, g.samples, g.new_tokens) for g in cost.groups[1:]] == [(2048, 4, 80), (4096, 4, 80)]
    assert [g.prompt_tokens for g in cost.groups[1:]] == [4 * (2048 - 20), 4 * (4096 - 20)]
    assert cost.seconds == pytest.approx(cost.prompt_tokens * 1e-3 + cost.new_tokens * 1e-2)


def test_the_calibration_is_never_zero_and_says_what_it_timed():
    """toy-base generates past its first token, so its decode is timed; the fake model answers at
    once, so no decode stands out of the noise: a new token is then priced as a prompt token.
    Either way both costs are above zero, whatever the machine's speed."""
    from evalsuite.backends import load_model

    toy = plan_cost.calibrate(load_model("toy-base", {}, device="cpu"))
    assert toy.prefill_s_per_token > 0 and toy.decode_s_per_token > 0
    assert toy.basis.startswith("timed on this model: a ") and f"{plan_cost.CALIBRATION_STEPS} more new tokens" in toy.basis
    instant = plan_cost.calibrate(load_model("fake", {}))
    assert instant.decode_s_per_token == instant.prefill_s_per_token > 0
    assert "a new token is taken to cost a prompt token's time" in instant.basis


def test_the_printed_estimate_names_its_basis_in_significant_digits():
    tiny = Calibration(2.5e-5, 2.5e-5, "timed on this model: a 218-token prefill 5.4 ms, 16 more new tokens +0.1 ms")
    cost = PlanCost(task="needle", model="m", cells=(("all", 1),), calibration=tiny,
                    groups=(GroupCost(length=1024, samples=1, prompt_tokens=1000, new_tokens=20, counted="built"),))
    (line,) = [text for text in describe([cost]).splitlines() if text.startswith("  estimate")]
    assert "0.025 ms per prompt token, 0.025 ms per new token (timed on this model: a 218-token prefill" in line


SUITE = """
name = "two-needles"
[[run]]
task = "needle"
name = "short"
[run.params]
lengths = [1024]
samples = 2
[[run]]
task = "needle"
name = "long"
[run.params]
lengths = [2048, 4096]
depths = [0.5]
samples = 3
"""


def test_a_suite_dry_run_plans_every_entry_and_writes_nothing(capsys, tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    code, text, err = invoke(capsys, "run", "--suite", str(suite), "--model", "fake", "--model", "fake:wrong",
                             "--out", str(tmp_path / "r"), "--dry-run")
    assert code == 0, err
    assert text.count("needle on fake-oracle: 10 samples in 5 cells (2 per cell)") == 1
    assert text.count("needle on fake-wrong: 6 samples in 2 cells (3 per cell)") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.toml"]


def test_a_plan_the_run_would_refuse_is_refused_in_one_line(capsys, tmp_path):
    code, _, err = invoke(capsys, "run", "--model", "toy-base", "--task", "needle", "-T", "preset=paper-64k",
                          "--out", str(tmp_path / "r"), "--dry-run")
    assert code == 2 and "exceeds toy-base's maximum context" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_durations_read_as_people_write_them():
    from evalsuite.engine.plan_cost import duration

    assert [duration(s) for s in (4.25, 125, 3 * 3600 + 61)] == ["4.2 s", "2 min 05 s", "3 h 01 min"]
