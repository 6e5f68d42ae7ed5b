"""`evalsuite check`: did this checkpoint regress against a baseline?

The candidate (a run folder or a suite result) and the baseline (a run folder, a suite result or
an exported baseline file) are read and matched run by run on their task configuration
(`outcomes.py`); every gated row of every run pair is measured and decided as one Holm family
(`gate.py`, which says how); the result is a markdown table, JUnit XML and GitHub's step summary.

Exit 0: nothing failed; 1: something failed; 2: bad input (from the CLI),
including a check with nothing to test: a gated metric without paired numeric
values, or with too few paired samples (clusters) over all samples to reach
alpha (two pass/fail pairs reach p = 0.26 at best), and a run whose judged
samples are incomplete unless `allow_unjudged`.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evalsuite.errors import UserError

from .gate import MetricCheck, decide, measure_pair, wanted_metrics
from .outcomes import ALL, Outcomes, coverage_notes, load_outcomes, match_runs, unjudged
from .power import ALTERNATIVES, PERSIST, TURN
from .tolerances import DEFAULT_MAX_DROP, Tolerances

# ---- the result -----------------------------------------------------------------------------

def _p(p: float) -> str:
    if math.isnan(p):
        return "n/a"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _level(level: float) -> str:
    return "n/a" if math.isnan(level) else f"{level:.3g}"


def _num(value: float, digits: int = 3, sign: str = "") -> str:
    if math.isinf(value):  # `detects` of a row that cannot catch any drop with 80% power
        return "none (cannot)"
    return "n/a" if math.isnan(value) else f"{value:{sign}.{digits}f}"


def _bound(value: float) -> str:
    return f"{value:+.3f}" if math.isfinite(value) else "n/a" if math.isnan(value) else f"{value:+}"


def _bounds(c: MetricCheck) -> str:
    if not c.n:
        return "n/a"
    return f"{c.drop:+.3f} [{_bound(c.low)}, {_bound(c.high)}]"


@dataclass(frozen=True)
class CheckResult:
    candidate: str
    baseline: str
    alpha: float
    checks: tuple[MetricCheck, ...]  # the gated rows
    notes: tuple[str, ...]
    non_inferiority: bool = False
    reported: tuple[MetricCheck, ...] = ()  # metrics not gated, over all samples
    tolerances: Tolerances = field(default_factory=Tolerances)
    alternative: str = PERSIST  # what `detects` assumes of the drop (power.ALTERNATIVES)

    @property
    def failed(self) -> list[MetricCheck]:
        return [c for c in self.checks if c.failed]

    def _rule(self) -> str:
        gated = sorted({c.metric for c in self.checks})
        cells = " in every cell of the task's gating axes and over all samples" if any(
            c.cell != ALL for c in self.checks) else " over all samples"
        head = f"Gated: {', '.join(gated)}{cells}, tolerance {self.tolerances.text()}. "
        if self.non_inferiority:
            return head + (f"A row passes only when the upper {1 - self.alpha:.0%} bound of its drop is within its "
                           "tolerance (non-inferiority; every row at alpha, as the check passes only when all do).")
        testable = sum(not math.isnan(c.p_value) for c in self.checks)
        return head + (f"A row fails when its drop exceeds its tolerance beyond noise: Holm's step-down over the "
                       f"{testable} testable gated rows rejects 'true drop <= tolerance' (family-wise alpha "
                       f"{self.alpha:g}); its one-sided bounds and 'detects' are at the level the row was tested at.")

    def _tests(self) -> str:
        return ("Independent pass/fail pairs: an exact test (the score statistic, its largest tail probability over "
                "every discordance the null allows); other rows: one-sided t tests with a cluster-robust standard "
                "error, p no smaller than 2^-k on k clusters. A row whose n cannot reach alpha is not testable and "
                "left out of Holm. 'detects': the true drop caught with 80% power at the row's level if "
                f"{ALTERNATIVES[self.alternative]}" + (" (the row's discordant pairs stay, split evenly, and the drop "
                                                       "comes on top: the conservative alternative)"
                                                       if self.alternative == PERSIST else "") + ".")

    def markdown(self) -> str:
        status = f"FAIL ({len(self.failed)} regression{'s' if len(self.failed) != 1 else ''})" if self.failed \
            else "PASS"
        lines = [f"## evalsuite check: {status}", "",
                 f"Candidate `{self.candidate}` against baseline `{self.baseline}`. {self._rule()} {self._tests()}", "",
                 "| run | metric | cell | n | baseline | candidate | drop [one-sided bounds] | tolerance | level | "
                 f"detects ({ALTERNATIVES[self.alternative]}) | p (Holm) | verdict |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in self.checks:
            verdict = f"**{c.verdict}**" if c.failed else c.verdict
            lines.append(f"| {c.name} | {c.metric} | {c.cell} | {c.n} | {_num(c.baseline)} | {_num(c.candidate)} | "
                         f"{_bounds(c)} | {c.max_drop:g} | {_level(c.level)} | {_num(c.detectable)} | {_p(c.p_value)} | "
                         f"{verdict} |")
        if self.reported:
            lines += ["", f"Reported, not gated (`--metric NAME` gates one), bounds at {1 - self.alpha:.0%}, "
                      "p unadjusted:", "", "| run | metric | n | baseline | candidate | drop [one-sided bounds] | p |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {c.name} | {c.metric} | {c.n} | {_num(c.baseline)} | {_num(c.candidate)} | {_bounds(c)} | "
                      f"{_p(c.p_value) if c.verdict == 'not gated' else c.verdict} |" for c in self.reported]
        lines += [""] + [f"- {note}" for note in self.notes] if self.notes else []
        return "\n".join(lines) + "\n"

    def junit(self) -> ET.ElementTree:
        skipped = [c for c in self.checks if math.isnan(c.p_value)]
        suite = ET.Element("testsuite", name="evalsuite check", tests=str(len(self.checks)),
                           failures=str(len(self.failed)), errors="0", skipped=str(len(skipped)))
        for c in self.checks:
            label = c.metric if c.cell == ALL else f"{c.metric} [{c.cell}]"
            case = ET.SubElement(suite, "testcase", classname=f"evalsuite.check.{c.name}", name=label, time="0")
            detail = (f"{label}: baseline {c.baseline:.4f}, candidate {c.candidate:.4f}, drop {c.drop:+.4f} "
                      f"[{c.low:+.4f}, {c.high:+.4f}] at level {_p(c.level)}, p={_p(c.p_value)} (Holm), n={c.n}, "
                      f"detects {_num(c.detects_persist)} if {ALTERNATIVES[PERSIST]}, {_num(c.detects_turn)} if "
                      f"{ALTERNATIVES[TURN]}: {c.verdict}")
            if c.failed:
                failure = ET.SubElement(case, "failure", message=f"{label}: {c.verdict.lower()} (drop "
                                        f"{c.drop:.4f}, tolerance {c.max_drop:g}, p={_p(c.p_value)})",
                                        type="regression")
                failure.text = detail
            elif c in skipped:
                ET.SubElement(case, "skipped", message=c.verdict).text = detail
            else:
                ET.SubElement(case, "system-out").text = detail
        root = ET.Element("testsuites", name="evalsuite", tests=str(len(self.checks)),
                          failures=str(len(self.failed)))
        root.append(suite)
        ET.indent(root)
        return ET.ElementTree(root)


# ---- the check ------------------------------------------------------------------------------

def validate_gate(tolerances: Tolerances, alpha: float) -> None:
    """The gate's options as `check` takes them: finite tolerances of zero or more, 0 < alpha < 1
    (`watch` refuses by these same rules at its start)."""
    for metric, value in [("", tolerances.default), *tolerances.by_metric.items()]:
        if not (math.isfinite(value) and value >= 0):
            raise UserError(f"--max-drop must be zero or more, got {f'{metric}=' if metric else ''}{value}")
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be between 0 and 1, got {alpha}")


def _known(metrics: Sequence[str], tolerances: Tolerances, pairs: Sequence[tuple[Outcomes, Outcomes]]) -> None:
    """A metric named in --metric or --max-drop that no run pair has is a typo, not a pass."""
    known = {m for cand, base in pairs for m in cand.scores if m in base.scores}
    for metric in [*metrics, *tolerances.by_metric]:
        if metric not in known:
            raise UserError(f"no run of this check has the metric {metric!r} (it has {', '.join(sorted(known))})")


def _refuse_unjudged(pairs: Sequence[tuple[Outcomes, Outcomes]], allow: bool) -> list[str]:
    """One line per unjudged side score: bad input, or with `allow` a note (left out of that metric)."""
    notes = []
    for cand, base in pairs:
        for metric, count in unjudged(cand, base).items():
            if not allow:
                raise UserError(f"{cand.name}: {count} samples have no {metric} value (unjudged: a judge error or no "
                                "verdict); judge them again with `evalsuite score`, or pass --allow-unjudged to gate "
                                "the judged samples only")
            notes.append(f"{cand.name}: {count} unjudged samples left out of {metric} (--allow-unjudged)")
    return notes


def _refuse_missing(pairs: Sequence[tuple[Outcomes, Outcomes]], metrics: Sequence[str]) -> None:
    """A metric the gate wants that one run of a pair lacks (a metric with no value in any sample,
    another judge) is bad input, not a pass."""
    for cand, base in pairs:
        for metric in wanted_metrics(cand, base, metrics):
            for run, role in ((cand, "candidate"), (base, "baseline")):
                if metric not in run.scores:
                    raise UserError(f"{cand.name}: nothing to gate: {metric} has no paired numeric values (the "
                                    f"{role} run {run.name} has none)")


def _refuse_nothing(checks: Sequence[MetricCheck], names: Sequence[str]) -> None:
    """A run pair without a gated metric, or a gated metric with no testable row, is bad input:
    never a pass on nothing."""
    for name in names:
        if not any(c.name == name for c in checks):
            raise UserError(f"{name}: nothing to gate: no metric has values in both runs")
    by_metric: dict[tuple[str, str], list[MetricCheck]] = {}
    for c in checks:
        by_metric.setdefault((c.name, c.metric), []).append(c)
    for (name, metric), rows in by_metric.items():
        if all(math.isnan(c.p_value) for c in rows):
            pooled = next(c for c in rows if c.cell == ALL)
            what = "has no paired numeric values (each is missing, not a number or infinite)" if not pooled.n else \
                f"is {pooled.verdict}; the gate needs enough paired samples (clusters) to reach p < alpha"
            raise UserError(f"{name}: nothing to gate: {metric} {what}")


def check(candidate: str | Path, baseline: str | Path, max_drop: float | Tolerances = DEFAULT_MAX_DROP, alpha: float = 0.05,
          require_non_inferiority: bool = False, metrics: Sequence[str] = (), allow_unjudged: bool = False,
          alternative: str = PERSIST) -> CheckResult:
    """The regression gate of `candidate` against `baseline`; `alternative` is what the table's
    `detects` assumes of a drop (`power.ALTERNATIVES`; both are computed for every row)."""
    tolerances = max_drop if isinstance(max_drop, Tolerances) else Tolerances(max_drop)
    validate_gate(tolerances, alpha)
    pairs, unmatched = match_runs(load_outcomes(candidate), load_outcomes(baseline))
    if not pairs:
        raise UserError(f"{candidate} has no run with the task configuration of any run in {baseline}")
    _known(metrics, tolerances, pairs)
    _refuse_missing(pairs, metrics)
    notes = _refuse_unjudged(pairs, allow_unjudged)
    measured = [m for cand, base in pairs for m in measure_pair(cand, base, tolerances.of, metrics)]
    shared = {cand.name: len(set(cand.ids) & set(base.ids)) for cand, base in pairs}
    rows = decide(measured, alpha, require_non_inferiority, alternative)
    gated = [c for c in rows if c.gated]
    _refuse_nothing(gated, [cand.name for cand, _ in pairs])
    notes += [f"{c.name}: {c.metric} paired on {c.n} of the {shared[c.name]} shared samples (the others have no "
              "numeric value in one of the runs)" for c in gated if c.cell == ALL and c.n < shared[c.name]]
    return CheckResult(candidate=str(candidate), baseline=str(baseline), alpha=alpha, checks=tuple(gated),
                       notes=tuple(coverage_notes(pairs, unmatched) + notes), non_inferiority=require_non_inferiority,
                       reported=tuple(c for c in rows if not c.gated), tolerances=tolerances, alternative=alternative)


def publish(result: CheckResult, junit: Path | None) -> None:
    """The summary into GitHub's step summary when running there, and JUnit XML when asked."""
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        if summary_file:
            with open(summary_file, "a", encoding="utf-8") as fh:
                fh.write(result.markdown() + "\n")
        if junit is not None:
            junit.parent.mkdir(parents=True, exist_ok=True)
            result.junit().write(junit, encoding="utf-8", xml_declaration=True)
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename or junit}: {exc.strerror or exc}") from None
