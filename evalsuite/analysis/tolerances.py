"""How much of a drop the regression gate tolerates: `--max-drop`, per metric or for all, in each
metric's own units (accuracy points, nats, attention mass). One default for `check`, `trend` and
`watch`, and for the command line's help; no heavy import, so the command line can read it.
It also holds the effective length's defaults (analysis/effective_length.py), for the same reason."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from evalsuite.errors import UserError

# the tolerated drop when none is given: two points of accuracy (a metric's own units)
DEFAULT_MAX_DROP = 0.02
# the effective length (NoLiMa, Modarressi et al., 2025): the share of the base score a length must keep
# (NoLiMa's 85%) and the short lengths, in tokens, whose score is the base (NoLiMa's 250, 500 and 1K)
EFFECTIVE_SHARE = 0.85
EFFECTIVE_BASE = (250, 500, 1000)
# a base score under this says the model mostly fails even short contexts: its drop over lengths would
# measure its accuracy, not its context, so no length is given (every model in NoLiMa's table has 0.736 or more)
EFFECTIVE_FLOOR = 0.5


@dataclass(frozen=True)
class Tolerances:
    """The tolerated drop of each metric, in its own units (accuracy points, nats, attention mass)."""

    default: float = DEFAULT_MAX_DROP
    by_metric: Mapping[str, float] = field(default_factory=dict)

    def of(self, metric: str) -> float:
        return self.by_metric.get(metric, self.default)

    def text(self) -> str:
        own = ", ".join(f"{m} {v:g}" for m, v in self.by_metric.items())
        return f"{self.default:g}" + (f"; {own}" if own else "")


def parse_max_drop(values: Sequence[str]) -> Tolerances:
    """`--max-drop` values: a bare number is every metric's default, `metric=value` one metric's own."""
    default, by_metric = DEFAULT_MAX_DROP, {}
    for text in values:
        metric, _, number = text.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            raise UserError(f"--max-drop takes a number or metric=number, got {text!r}") from None
        if metric:
            by_metric[metric.strip()] = value
        else:
            default = value
    return Tolerances(default, by_metric)


def parse_effective_base(text: str) -> tuple[int, ...]:
    """`--effective-base`: token counts separated by commas, e.g. 250,500,1000."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--effective-base takes token counts separated by commas, e.g. 250,500,1000, got {text!r}"
                        ) from None
