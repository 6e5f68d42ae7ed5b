"""The effective length as text: `report`'s section, `compare`'s section and comparison.json's entry.

The numbers are effective_length.py's; this module only says them (the rule in words, the per-length
tables, whether the two bases differ).
"""

from __future__ import annotations

import math
from typing import Any

from .effective_length import (
    NOLIMA_BASE,
    NOLIMA_SHARE,
    RESAMPLES,
    EffectiveLength,
    PairedEffectiveLength,
    words,
)


def base_rule(found: EffectiveLength) -> str:
    """What the base is, and whose: NoLiMa's short lengths, the declared ones, or the shortest length run."""
    declared = found.definition.base
    if not found.declared:
        missing = [n for n in declared if n not in found.lengths]
        whose = "NoLiMa's" if declared == NOLIMA_BASE else "the declared"
        return (f"base: the {found.metric} score at {found.base_lengths[0]} tokens, the shortest length run: the run "
                f"lacks {whose} base length{'s' * (len(missing) > 1)} {words(missing)}, so this is not NoLiMa's base")
    where = "NoLiMa's short lengths" if declared == NOLIMA_BASE else "--effective-base"
    return (f"base: the {found.metric} score over the samples at {words(declared)} tokens ({where}; pooled, where "
            "NoLiMa's paper averages each needle's best of the three)")


def rule(found: EffectiveLength) -> str:
    share = found.definition.share
    whose = " (NoLiMa's)" if share == NOLIMA_SHARE else ""
    need = found.definition.min_samples
    interval = "" if need is None else f", given from {need} samples at the base and at each candidate length"
    return (f"{base_rule(found)}; effective length: the longest length from {found.candidates[0]} tokens whose score "
            f"keeps at least {share:.0%}{whose} of the base, \"<{found.candidates[0]}\" when none does; not measurable "
            f"under a base of {found.definition.floor:g}; 95% interval from {RESAMPLES} draws of every length's score "
            f"(a pass/fail rate from its Jeffreys posterior, any other score by bootstrap){interval}")


def curve_table(found: EffectiveLength) -> str:
    """Markdown: each length's part in the rule, its score, its share of the base, whether it keeps it, n."""
    lines = [f"| length | part | {found.metric} | share of the base | keeps {found.definition.share:.0%} | n |",
             "|---|---|---|---|---|---|"]
    for length, score, n in zip(found.lengths, found.scores, found.counts):
        part = ", ".join(name for name, yes in (("base", length in found.base_lengths),
                                                ("candidate", length in found.candidates)) if yes)
        share = score / found.base if found.base > 0 else math.nan
        measured = found.value is not None and length in found.candidates
        keeps = ("yes" if score >= found.definition.share * found.base - 1e-12 else "no") if measured else ""
        lines.append(f"| {length} | {part} | {score:.3f} | {'n/a' if math.isnan(share) else f'{share:.2f}'} | "
                     f"{keeps} | {n} |")
    return "\n".join(lines)


def report_markdown(model: str, found: EffectiveLength) -> str:
    """`evalsuite report`'s section for one run."""
    return "\n".join([f"### Effective length: {model}: {found.line()}", "", f"- {rule(found)}", "",
                      curve_table(found)])


def _p(row: dict[str, Any]) -> str:
    return row["test"] if math.isnan(row["p_value"]) else f"{row['p_value']:.3g} ({row['test']})"


def _difference(row: dict[str, Any]) -> str:
    if math.isnan(row["diff"]):
        return "n/a"
    interval = "" if math.isnan(row["low"]) else f" [{row['low']:+.3f}, {row['high']:+.3f}]"
    return f"{row['diff']:+.3f}{interval}"


def per_length_table(names: tuple[str, str], paired: PairedEffectiveLength) -> str:
    """Markdown: the paired difference of the base scores and of each length's scores, a minus b."""
    base = paired.base_test
    rows = [f"| base ({words(paired.a.base_lengths)}) | {base['mean_a']:.3f} | {base['mean_b']:.3f} | "
            f"{_difference(base)} | {_p(base)} | {base['n']} |"]
    rows += [f"| {row['length']} | {row['mean_a']:.3f} | {row['mean_b']:.3f} | {_difference(row)} | {_p(row)} | "
             f"{row['n']} |" for row in paired.per_length]
    return "\n".join([f"| length | {names[0]} | {names[1]} | {names[0]} minus {names[1]} (95% CI) | p | n |",
                      "|---|---|---|---|---|---|", *rows])


def bases_line(names: tuple[str, str], paired: PairedEffectiveLength, alpha: float) -> str:
    """Whether the two base scores differ, and what that means for the difference of lengths."""
    said = {None: "not testable", False: f"no difference at {alpha:g}",
            True: f"they differ at {alpha:g}: the difference of effective lengths is partly one of accuracy"}
    said_here = said[paired.bases_differ(alpha)]
    return (f"the base scores: {names[0]} {paired.a.base_text()}, {names[1]} {paired.b.base_text()}; "
            f"{names[0]} minus {names[1]} {paired.base_difference()}: {said_here}")


def paired_markdown(names: tuple[str, str], paired: PairedEffectiveLength, alpha: float = 0.05) -> str:
    """`evalsuite compare`'s section: both models, their difference, their bases and each length."""
    rows = [f"| {names[0]} | {paired.a.text()} | {paired.a.base_text()} |",
            f"| {names[1]} | {paired.b.text()} | {paired.b.base_text()} |",
            f"| {names[0]} minus {names[1]} | {paired.text()} | {paired.base_difference()} |"]
    return "\n".join(["## Effective length", "", f"- {rule(paired.a)}",
                      f"- the difference: over the {paired.n} samples both runs scored, paired (each length's joint "
                      "outcomes drawn together, or the same sample ids for both models)",
                      f"- {bases_line(names, paired, alpha)}", "",
                      "| model | effective length (95% CI) | base score (n) |", "|---|---|---|", *rows, "",
                      f"Per length ({paired.a.metric}; paired tests as in the tables above):", "",
                      per_length_table(names, paired)])


def _json(found: EffectiveLength) -> dict[str, object]:
    return {"value": found.value, "low": found.low, "high": found.high, "text": found.text(),
            "base": found.base, "base_n": found.base_n, "base_lengths": list(found.base_lengths),
            "declared_base": found.declared, "first_candidate": found.candidates[0],
            "lengths": list(found.lengths), "scores": list(found.scores), "n": list(found.counts),
            "undefined_share": found.undefined_share}


def paired_json(paired: PairedEffectiveLength) -> dict[str, object]:
    """comparison.json's effective_length: a value of 0 is a length below the first candidate."""
    declared = paired.a.definition
    return {"metric": paired.a.metric, "share": declared.share, "base": list(declared.base), "floor": declared.floor,
            "a": _json(paired.a), "b": _json(paired.b), "diff": paired.diff, "low": paired.low, "high": paired.high,
            "text": paired.text(), "n": paired.n, "undefined_share": paired.undefined_share,
            "base_test": paired.base_test, "per_length": list(paired.per_length)}
