"""What the task tests hold a task to, as functions that return what is wrong, so that a bad task or a
throwaway task folder can be shown to fail each check with the line a contributor reads:

- its smoke plan (`smoke_plan` in its header: small -T values; "{data}" is tests/paper_data.py's layout);
- its golden prompt hash, in golden.json beside its module, written per task by `python
  tests/test_prompt_versions.py NAME` (tests/test_prompt_versions.py);
- the conformance checks (tests/test_task_conformance.py): a deterministic plan, no answer in any
  request, scores covering the declared metrics, a run whose view draws.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from evalsuite.runs.records import prompt_fields
from evalsuite.types import GenerationRequest, LoglikelihoodRequest, Sample

LIMIT = 4  # samples whose requests and scores are checked
REGENERATE = "python tests/test_prompt_versions.py {name}"


# ---- the task's folder: its smoke plan and its golden prompt hash ---------------------------------------


def smoke_params(cls: type, data: Path) -> dict[str, str]:
    """The task's smoke plan as -T values, "{data}" filled in (none declared: its defaults)."""
    return {k: v.replace("{data}", str(data)) for k, v in (getattr(cls, "smoke_plan", None) or {}).items()}


def smoke_plan_problem(cls: Any) -> str | None:
    """A task of evalsuite's own tree runs its conformance and prompt checks on a smoke plan it declares."""
    if cls.smoke_plan is not None:
        return None
    return (f"task {cls.name} declares no smoke plan: add smoke_plan={{...}} (small -T values the fake byte-"
            f"tokenized model can hold, e.g. {{\"lengths\": \"2000,3000\", \"samples\": \"1\"}}) to the header of "
            f"{cls.__qualname__} in {inspect.getfile(cls)}")


def golden_path(cls: type) -> Path:
    """golden.json in the task's own folder: task name -> {plan_version, sha256}."""
    return Path(inspect.getfile(cls)).parent / "golden.json"


def golden_entries(path: Path) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else {}


def golden_problem(cls: Any, digest: Callable[[], str]) -> str | None:
    """The task's prompts must be those its golden hash records for its plan version (`digest`: today's)."""
    path = golden_path(cls)
    command = REGENERATE.format(name=cls.name)
    entry = golden_entries(path).get(cls.name)
    if entry is None:
        return f"task {cls.name} has no golden prompt hash in {path}: run `{command}`"
    if entry["plan_version"] != cls.plan_version:
        return (f"task {cls.name} is at plan version {cls.plan_version}, its golden hash in {path} at "
                f"{entry['plan_version']}: run `{command}`")
    if digest() != entry["sha256"]:
        return (f"task {cls.name}'s prompts changed under plan version {cls.plan_version}: bump its plan_version, "
                f"then run `{command}`")
    return None


def write_golden(cls: Any, digest: str) -> Path:
    """Rewrite this task's entry of its folder's golden.json, the others as they were."""
    path = golden_path(cls)
    entries = golden_entries(path)
    entries[cls.name] = {"plan_version": cls.plan_version, "sha256": digest}
    path.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return path


def _request_text(request: Any) -> str:
    """What a record's prompt hash covers (engine.runner._prompt_text)."""
    return str(getattr(request, "prefix", "")) + str(getattr(request, "prompt", None) or getattr(request, "context", ""))


def prompts_digest(task: Any, model: Any) -> str:
    """sha256 over the plan's (sample id, prompt hash) pairs, in plan order (no request is run)."""
    state = task.prepare(model)
    digest = hashlib.sha256()
    for sample in task.plan(state):
        requests, _ = task.requests(sample, model, state)
        sha = prompt_fields([_request_text(r) for r in requests], keep_text=False)["sha256"]
        digest.update(f"{sample.id} {sha}\n".encode())
    return digest.hexdigest()


# ---- the conformance checks ------------------------------------------------------------------------------


@cache
def model(spec: str) -> Any:
    from evalsuite.backends import load_model

    return load_model(spec, {}, device="cpu")


def models_for(task: Any) -> tuple[Any, Any]:
    """Two models for the task: the toy pair when it needs a capability, else two scripted fakes."""
    pair = ("toy-base", "toy-diff") if task.required_capabilities() else ("fake:target", "fake:wrong")
    return model(pair[0]), model(pair[1])


def plain(sample: Sample) -> tuple[Any, ...]:
    """A sample as plain values: objects in its data (a loaded benchmark) stand for their type."""
    data = json.dumps(dict(sample.data), sort_keys=True, default=lambda o: type(o).__name__)
    return sample.id, sample.task, json.dumps(dict(sample.axes), sort_keys=True), sample.target, data


def plan_problems(make_task: Any, model: Any) -> list[str]:
    """The plans of two fresh tasks of the same parameters, and of one state read twice, must agree."""
    task, again = make_task(), make_task()
    state = task.prepare(model)
    plans = [list(task.plan(state)), list(task.plan(state)), list(again.plan(again.prepare(model)))]
    problems = [] if plans[0] else ["the plan holds no sample"]
    ids = [s.id for s in plans[0]]
    if len(set(ids)) != len(ids):
        problems.append("sample ids repeat")
    if [plain(s) for s in plans[0]] != [plain(s) for s in plans[1]]:
        problems.append("the same state gives another plan when read again")
    if [plain(s) for s in plans[0]] != [plain(s) for s in plans[2]]:
        problems.append("the same parameters and seed give another plan")
    return problems


def _text_fields(request: Any) -> list[str]:
    fields = [getattr(request, k, "") for k in ("prompt", "prefix", "context", "continuation")]
    return [str(f) for f in fields] + [*getattr(request, "stop", ()), *(getattr(request, "choices", None) or ())]


def answer_problems(task: Any, model: Any, state: Any, samples: Sequence[Sample]) -> list[str]:
    """A text request must not change when its sample's targets do, and must not show the stand-ins."""
    problems = []
    for sample in samples:
        requests, _ = task.requests(sample, model, state)
        stand_ins = tuple(f"[answer {i} withheld]" for i in range(max(1, len(sample.target))))
        swapped, _ = task.requests(dataclasses.replace(sample, target=stand_ins), model, state)
        for request, other in zip(requests, swapped):
            if not isinstance(request, (GenerationRequest, LoglikelihoodRequest)):
                continue  # a probe measures the model itself and is scored against no target
            if request != other or any(s in text for s in stand_ins for text in _text_fields(other)):
                problems.append(f"{sample.id}: a request shows its sample's target")
    return problems


def score_problems(task: Any, records: Sequence[Any]) -> list[str]:
    problems = []
    for record in records:
        if record.error:
            problems.append(f"{record.id}: scoring failed: {record.error}")
        missing = [m for m in task.metrics if m not in record.scores]
        odd = [m for m in task.metrics if not isinstance(record.scores.get(m), (bool, int, float, type(None)))]
        if missing or odd:
            problems.append(f"{record.id}: metrics {missing or odd} missing or not numbers")
        json.loads(record.to_json())  # a record is JSON as it is written
    return problems


def write_run(task: Any, model: Any, state: Any, samples: Sequence[Sample], out: Path) -> Any:
    """A finished run folder of `samples` on `model`: config, the records this test computes, summary."""
    from evalsuite.engine.runner import RunOptions, evaluate, finish, run_config, run_folder_for

    options = RunOptions(out=out, progress=False)
    config = run_config(task, model, options)
    run = run_folder_for(config, options)
    run.create(config)
    run.append(evaluate(task, model, state, samples, log_prompts=True, run_hash=config["hash"]))
    finish(task, run)
    return run
