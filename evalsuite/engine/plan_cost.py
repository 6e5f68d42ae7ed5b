"""What a run would cost, without running it: `evalsuite run ... --dry-run`.

The plan is the task's own (`plan(state)`, cut at `--limit`): samples per cell, prompt tokens
in total and per context length, and the new tokens generation may ask for at most. Prompt
tokens are counted with the model's own tokenizer on prompts the task builds (`requests`),
within a budget of time: up to SAMPLES_PER_GROUP samples, spread over the group, are built
for each group (a group: one context length, or the whole plan when samples have none), the
shortest lengths first, and their mean stands for the group. A group reached when the budget
is spent is counted from the plan: a sample of context length L holds
L tokens less the new tokens of the group that was built (the task builds a prompt to fill
its length with the answer budget, as the needle task does), so a 64K plan is counted
without building a 64K prompt.

The time is an estimate from a short calibration on the loaded model: after one call of two
new tokens (a backend's first call pays for its lazy set-up), a prefill of CALIBRATION_TOKENS
tokens gives seconds per prompt token, and the same prompt with CALIBRATION_STEPS more new
tokens gives seconds per new token (the difference over the tokens it really generated: a
model may stop early). Each is the faster of two timings when the first took under
REPEAT_UNDER_S (a slow model is timed once). Where the difference is lost in the machine's
noise, a new token is taken to cost what a prompt token does (a step runs at least one token
through the model), and the printed basis says so. The plan's tokens are scaled by the two
costs. It counts one sample at a time, so batching makes a GPU run faster than said, and
attention's growth with length (quadratic in the prompt) is left out, so at long contexts the
estimate is a floor. Nothing is written.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.contracts import ModelAdapter
from evalsuite.errors import UserError
from evalsuite.params import option_text
from evalsuite.types import GenerationRequest, LoglikelihoodRequest, Sample

from .run_steps import STEP_FLAG, declared, given_as

BUILD_BUDGET_S = 1.5  # seconds spent building prompts to count their tokens before counting from the plan
SAMPLES_PER_GROUP = 3  # samples built per context length (their mean stands for the group)
SAMPLES_WITHOUT_LENGTH = 32  # samples built, within the budget, of a plan whose samples have no context length
CALIBRATION_TOKENS = 256
CALIBRATION_STEPS = 16  # new tokens timed beyond the prefill's first: enough to stand out of the timing's noise
REPEAT_UNDER_S = 1.0  # a timing shorter than this is taken twice (the faster counts); a longer one once
HOUR = 3600.0


@dataclass(frozen=True)
class Calibration:
    prefill_s_per_token: float
    decode_s_per_token: float
    basis: str = ""  # what was timed, in words, for the printed estimate


@dataclass(frozen=True)
class GroupCost:
    """The samples of one context length (None: samples without one)."""

    length: int | None
    samples: int
    prompt_tokens: int
    new_tokens: int
    counted: str  # "built" (prompts built and tokenized) or "from length" (the plan's length)


@dataclass(frozen=True)
class PlanCost:
    task: str
    model: str
    cells: tuple[tuple[str, int], ...]  # (cell label, samples), in plan order
    groups: tuple[GroupCost, ...]
    calibration: Calibration

    @property
    def samples(self) -> int:
        return sum(group.samples for group in self.groups)

    @property
    def prompt_tokens(self) -> int:
        return sum(group.prompt_tokens for group in self.groups)

    @property
    def new_tokens(self) -> int:
        return sum(group.new_tokens for group in self.groups)

    @property
    def seconds(self) -> float:
        return (self.prompt_tokens * self.calibration.prefill_s_per_token
                + self.new_tokens * self.calibration.decode_s_per_token)


def plan_cost(task: Any, model: ModelAdapter, samples: Sequence[Sample], state: Any,
              calibration: Calibration | None = None) -> PlanCost:
    """The cost of running `samples` (the plan, already cut at --limit) of `task` on `model`."""
    cells = Counter(_cell_label(sample, task.group_by) for sample in samples)
    groups: dict[int | None, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(_length(sample), []).append(sample)
    deadline = time.perf_counter() + BUILD_BUDGET_S
    costs: list[GroupCost] = []
    for length in sorted(groups, key=lambda key: (key is None, key or 0)):
        members = groups[length]
        must_build = not costs or length is None  # the first group, and samples without a length, are built
        built = _built(task, model, state, length, members, deadline, must_build)
        costs.append(built if built is not None else _from_length(length or 0, members, costs))
    return PlanCost(task.name, model.name, tuple(cells.items()), tuple(costs), calibration or calibrate(model))


def _cell_label(sample: Sample, group_by: Iterable[str]) -> str:
    return ", ".join(f"{axis}={sample.axes[axis]}" for axis in group_by if axis in sample.axes) or "all"


def _length(sample: Sample) -> int | None:
    value = sample.axes.get("context_length")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _built(task: Any, model: ModelAdapter, state: Any, length: int | None, members: Sequence[Sample],
           deadline: float, at_least_one: bool) -> GroupCost | None:
    """Build a few of the group's samples (spread over it) until the `deadline` (perf_counter
    seconds) and scale their mean to the group; None when none was built. Samples without a
    length may differ in size by any axis (shots, documents): more of them are built."""
    wanted = SAMPLES_PER_GROUP if length is not None else SAMPLES_WITHOUT_LENGTH
    step = max(1, len(members) // wanted)
    prompt = new = built = 0
    for sample in list(members[::step])[:wanted]:
        if time.perf_counter() >= deadline and (built or not at_least_one):
            break
        requests, _ = task.requests(sample, model, state)
        prompt += sum(request_tokens(model, request) for request in requests)
        new += sum(r.max_new_tokens for r in requests if isinstance(r, GenerationRequest))
        built += 1
    if not built:
        return None
    scale = len(members) / built
    return GroupCost(length, len(members), round(prompt * scale), round(new * scale), "built")


def _from_length(length: int, members: Sequence[Sample], built: Sequence[GroupCost]) -> GroupCost:
    """Each sample holds its length less the new tokens per sample of the groups built so far."""
    new_per_sample = sum(g.new_tokens for g in built) / max(1, sum(g.samples for g in built))
    prompt = max(0.0, length - new_per_sample) * len(members)
    return GroupCost(length, len(members), round(prompt), round(new_per_sample * len(members)), "from length")


def request_tokens(model: ModelAdapter, request: Any) -> int:
    """The tokens a request puts through the model: its text, or its token ids (a probe's window)."""
    if isinstance(request, GenerationRequest):
        return model.count_tokens(request.prefix + request.prompt)
    if isinstance(request, LoglikelihoodRequest):
        return model.count_tokens(request.prefix + request.context + request.continuation)
    for name in ("ids", "window"):
        if hasattr(request, name):
            return len(getattr(request, name))
    if hasattr(request, "windows"):
        return sum(len(window) for window in request.windows)
    text = getattr(request, "prompt", None)
    return model.count_tokens(text) if isinstance(text, str) else 0


def calibrate(model: ModelAdapter) -> Calibration:
    """Seconds per prompt token and per new token, from a short prefill and decode on `model`
    (after one small warm-up call: a backend's first call pays for its lazy set-up)."""
    sentence = "The quick brown fox jumps over the lazy dog. "
    filler = sentence * max(1, CALIBRATION_TOKENS // max(1, model.count_tokens(sentence)))
    tokens = max(1, model.count_tokens(filler))
    model.generate([GenerationRequest(prompt=sentence, max_new_tokens=2)])
    prefill, _ = _fastest(model, GenerationRequest(prompt=filler, max_new_tokens=1))
    decode, answer = _fastest(model, GenerationRequest(prompt=filler, max_new_tokens=1 + CALIBRATION_STEPS))
    steps = model.count_tokens(filler + answer) - tokens - 1  # new tokens past the prefill's first
    basis = (f"timed on this model: a {tokens:,}-token prefill {prefill * 1e3:.1f} ms, "
             f"{max(steps, 0)} more new tokens {(decode - prefill) * 1e3:+.1f} ms")
    prefill_per_token = prefill / tokens
    if steps < 1 or decode - prefill <= prefill_per_token * steps:  # no decode measured above the noise
        return Calibration(prefill_per_token, prefill_per_token,
                           basis + "; within the timing's noise, a new token is taken to cost a prompt token's time")
    return Calibration(prefill_per_token, (decode - prefill) / steps, basis)


def _fastest(model: ModelAdapter, request: GenerationRequest) -> tuple[float, str]:
    """The faster of two timings (the slower one is the machine's noise, not the model's cost),
    or the one timing when it took REPEAT_UNDER_S or more; and the answer."""
    best, answer = float("inf"), ""
    for _ in range(2):
        started = time.perf_counter()
        (answer,) = model.generate([request])
        took = time.perf_counter() - started
        best = min(best, took)
        if took >= REPEAT_UNDER_S:
            break
    return best, answer


# ---- the printed plan --------------------------------------------------------------------------


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def describe(costs: Sequence[PlanCost]) -> str:
    """The dry run's text; its first line says when the whole estimate exceeds an hour."""
    total = sum(cost.seconds for cost in costs)
    first = f"dry run: about {duration(total)} estimated" + (" (more than an hour)" if total > HOUR else "")
    lines = [first + "; nothing was run or written"]
    for cost in costs:
        lines += ["", *_describe_one(cost)]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    """A per-token cost in milliseconds, with three significant digits however small it is."""
    return f"{seconds * 1e3:.3g} ms"


def _describe_one(cost: PlanCost) -> list[str]:
    per_cell = sorted({n for _, n in cost.cells})
    spread = f"{per_cell[0]}" if len(per_cell) == 1 else f"{per_cell[0]}-{per_cell[-1]}"
    lines = [f"{cost.task} on {cost.model}: {cost.samples:,} samples in {len(cost.cells):,} cells "
             f"({spread} per cell); prompt tokens {cost.prompt_tokens:,}; new tokens at most {cost.new_tokens:,}",
             "  | context length | samples | prompt tokens | new tokens at most | counted |",
             "  |---|---|---|---|---|"]
    for group in cost.groups:
        length = "-" if group.length is None else f"{group.length:,}"
        lines.append(f"  | {length} | {group.samples:,} | {group.prompt_tokens:,} | {group.new_tokens:,} | "
                     f"{group.counted} |")
    calibration = cost.calibration
    basis = calibration.basis or "given, not measured"
    lines.append(f"  estimate {duration(cost.seconds)}: {_ms(calibration.prefill_s_per_token)} per prompt token, "
                 f"{_ms(calibration.decode_s_per_token)} per new token ({basis}; one sample at a time, "
                 "attention's growth with length left out)")
    if len(cost.cells) <= 12:
        lines += [f"  cell {label}: {n} sample{'' if n == 1 else 's'}" for label, n in cost.cells]
    return lines



def dry_run(task_name: str | None, specs: Sequence[str], *, suite: str | Path | None, limit: int | None,
            device: str, batch_size: int, seed: int | None, model_options: Mapping[str, str],
            params: Mapping[str, str], scale: str | None = None, data_dir: Path | None = None,
            step: Mapping[str, Any] | None = None) -> str:
    """The plan of one task (or of each entry of a suite, at `scale`, its {data_dir} paths filled)
    on each model (loaded one at a time, checked as a run would check it, calibrated once),
    described; nothing is written. Suite entries are clipped to each model's context as a run
    clips them, and optional entries that cannot run are left out with their line."""
    from .runner import make_task

    if suite is not None and (task_name is not None or params):
        raise UserError("--suite sets the tasks and their parameters: drop --task and -T, or edit the suite file")
    if suite is None and (scale is not None or data_dir is not None):
        raise UserError("--scale and --data-dir are for --suite; with --task give its parameters with -T")
    entries: list[tuple[Any, int | None, Any]]  # (task, limit, its suite entry or None)
    if suite is not None:
        from .suite_run import check_needs
        from .suites import SuiteSettings, load_suite

        if data_dir is not None and not data_dir.is_dir():
            raise UserError(f"--data-dir {data_dir} is not a folder")
        settings = SuiteSettings(scale=scale, data_dir=data_dir, step=dict(step or {}))
        loaded = check_needs(load_suite(suite, seed, settings))
        if not loaded.entries:
            raise UserError(f"suite {loaded.name}: every entry was skipped; provide what the lines above ask for")
        entries = [(entry.task, limit if limit is not None else entry.limit, entry) for entry in loaded.entries]
    elif task_name is not None:
        entries = [(make_task(task_name, params, seed), limit, None)]
        _refuse_undeclared(entries[0][0], step or {})
    else:
        raise UserError("give --task NAME (see `evalsuite list`) or --suite FILE")
    text = describe(_costs(entries, specs, model_options, device, batch_size))
    if step:  # what comes after the model's outputs (a judge) is named, though not estimated
        options = ", ".join(_given(key, value) for key, value in step.items())
        text += f"\n\nthen the run step of the tasks that take it: {options} (its time is not in the estimate)"
    return text


def _refuse_undeclared(task: Any, step: Mapping[str, Any]) -> None:
    """A run-step option (--judge) that the task does not take, refused as `run` refuses it."""
    mine = declared(task)
    for key in step:
        if key not in mine:
            raise UserError(f"task {task.name} has no judging step; drop {given_as(key)}")


def _given(key: str, value: Any) -> str:
    """A step option as it was given: `--judge lexical`, or `-J key=value` for one with no flag."""
    flag = given_as(key)
    return f"{flag}={option_text(value)}" if flag.startswith(STEP_FLAG) else f"{flag} {option_text(value)}"


def _costs(entries: Sequence[tuple[Any, int | None, Any]], specs: Sequence[str],
           model_options: Mapping[str, str], device: str, batch_size: int) -> list[PlanCost]:
    import gc

    from evalsuite.backends import check_model, load_model

    from .runner import check_task, planned_samples
    from .suite_run import clipped, refused_on
    from .thinking import split_options

    model_options, thinking = split_options(model_options)  # -M thinking(_budget): the engine's, not the backend's
    budget = thinking.thinking_budget if thinking is not None else 0
    for spec in specs[1:]:
        check_model(spec, model_options)
    costs = []
    for spec in specs:
        model = load_model(spec, model_options, device=device, batch_size=batch_size)
        calibration = calibrate(model)
        for entry_task, limit, entry in entries:  # entry: the suite entry (None for --task)
            task, note = clipped(entry_task, entry.clip if entry else None, model.max_context, budget)  # as the run clips
            if note is not None and refused_on(entry, task, model):
                continue  # an optional entry this model cannot run: skipped with its line, as the run skips it
            state = check_task(task, model)
            samples = planned_samples(task, state, limit)
            if not samples:
                raise UserError(f"task {task.name} planned no samples with these parameters")
            costs.append(plan_cost(task, model, samples, state, calibration))
        del model
        gc.collect()
    return costs
