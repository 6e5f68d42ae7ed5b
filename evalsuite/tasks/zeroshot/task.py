"""Zero-shot benchmarks through lm-evaluation-harness (paper Table 1 / Table 8),
and the quantized-attention HellaSwag sweep of §3.7.

What it measures: ARC-Challenge, ARC-Easy, BoolQ, HellaSwag, OpenBookQA, PIQA and
WinoGrande as lm-eval defines them (its task YAML: dataset, split, prompt,
choices, metrics). Every benchmark reports lm-eval's `acc` and, where defined,
`acc_norm`; `score` is the paper's metric: `acc_norm` for HellaSwag, `acc`
for the others. Means come with lm-eval's own standard errors.

lm-eval is the benchmark engine and evalsuite the runner:
- `prepare(model)`: lm-eval's task of every benchmark, loaded with its
  instances built (`ZeroShotState`), the same with or without a model;
- `plan(state)`: one sample per (bit width, benchmark, document), the documents
  being those of lm-eval's task (its evaluation split after its `process_docs`),
  the first `limit` of each;
- `requests()`: lm-eval's own instances for that document
  (`task.build_all_requests`: few-shot context, then `construct_requests`)
  become evalsuite log-likelihood requests with lm-eval's text conventions;
- `score()`: lm-eval's filters, then `task.process_results(doc, results)`;
- `summary()`: lm-eval's aggregation and stderr functions per benchmark and bits.
Why not `lm_eval.simple_evaluate` on the wrapped model (which
`evalsuite.integrations.lmeval` also offers, for any lm-eval task): going through the
runner gives per-sample records that resume after a kill, one batched model call
across benchmarks, and the bit-width axis inside one run. Tests check that both
routes give the accuracy of lm-eval's own `hf` backend.

Offline: `-T data_dir=DIR` runs the same task definitions on DIR/<benchmark>.jsonl
(one JSON object per line with the hub dataset's fields), read by datasets'
`json` builder as the split lm-eval evaluates; few-shot examples, when asked
for, come from DIR/<benchmark>.train.jsonl. Without it the hub datasets are used.

Quantized attention: `-T bits=16,8,6,4` evaluates every document at each bit
width of absmax-quantized attention logits (`evalsuite.backends.hf.quant`; granularity from
`-M attn_quant_granularity`), one model load for the whole sweep; 16 is the
unquantized model. Without `-T bits` the model runs as loaded (so
`-M attn_quant=absmax:8` alone also works; the two cannot be combined).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.backends.hf.quant import FULL_BITS, check_bits
from evalsuite.contracts import ATTENTION_QUANTIZATION, ModelAdapter, TaskBase
from evalsuite.errors import UserError, first_line, unknown
from evalsuite.modeling import lmeval_compat
from evalsuite.params import PathText
from evalsuite.registry import register_task
from evalsuite.types import LoglikelihoodRequest, Sample

from .view import PAPER_BENCHMARKS, PAPER_METRIC, ZeroShotView, aggregate_rows, paper_table

# lm-eval task folders of the paper's benchmarks: indexing only these takes a second, the whole catalogue ~15
TASK_FOLDERS = {"arc_challenge": "arc", "arc_easy": "arc", "boolq": "super_glue/boolq", "hellaswag": "hellaswag",
                "openbookqa": "openbookqa", "piqa": "piqa", "winogrande": "winogrande"}


def lm_eval_available() -> None:
    if not lmeval_compat.installed():
        raise UserError("the zeroshot task needs lm-evaluation-harness: pip install 'evalsuite[lmeval]'")


def task_manager(benchmarks: tuple[str, ...]) -> Any:
    if not set(benchmarks) <= set(TASK_FOLDERS):
        return lmeval_compat.task_manager()  # a benchmark beyond the paper's: the whole catalogue
    return lmeval_compat.task_manager([TASK_FOLDERS[b] for b in benchmarks])


def local_data_overrides(name: str, config: dict[str, Any], data_dir: str, fewshot: int) -> dict[str, Any]:
    """Task-config overrides that read the evaluation split from DIR/<name>.jsonl."""
    folder = Path(data_dir).expanduser()
    split = config.get("test_split") or config.get("validation_split")
    if not split:
        raise UserError(f"lm-eval task {name} has no test or validation split to read from {data_dir}")
    files = {split: folder / f"{name}.jsonl", "train": folder / f"{name}.train.jsonl"}
    if not files[split].is_file():
        raise UserError(f"-T data_dir: {files[split]} not found (one JSON object per line with {name}'s fields)")
    if fewshot and not files["train"].is_file():
        raise UserError(f"-T fewshot={fewshot} with -T data_dir needs few-shot examples in {files['train']}")
    has_train = files["train"].is_file()
    test = config.get("test_split")
    return {
        "dataset_path": "json", "dataset_name": None,
        "dataset_kwargs": {"data_files": {s: str(p) for s, p in files.items() if s == split or has_train}},
        "test_split": split if test else None, "validation_split": None if test else split,
        "training_split": "train" if has_train else None, "fewshot_split": "train" if has_train else None,
    }


def load_benchmark(name: str, manager: Any, data_dir: str, fewshot: int, seed: int) -> Any:
    """lm-eval's task object for `name`, on local files when `data_dir` is set."""
    import datasets

    datasets.disable_progress_bars()  # evalsuite's own progress bar is the one that matters
    if name not in manager.all_subtasks:
        raise unknown("lm-eval benchmark", name, manager.all_subtasks)
    overrides = local_data_overrides(name, manager.task_index[name].cfg, data_dir, fewshot) if data_dir else {}
    # a group entry is lm-eval's way to apply overrides to a registered task definition
    spec = {"group": f"evalsuite_{name}", "task": [{"task": name, **overrides}]}
    try:
        loaded = lmeval_compat.load_tasks(manager, spec)
    except Exception as exc:  # datasets and lm-eval raise many types for a missing or malformed dataset
        hint = "" if data_dir else " (offline? use -T data_dir=DIR with local jsonl files)"
        raise UserError(f"cannot load lm-eval benchmark {name}: {first_line(exc)}{hint}") from None
    task = next(t for t in _leaves(loaded) if isinstance(t, lmeval_compat.task_class()))
    task.set_config(key="num_fewshot", value=fewshot)
    task.set_fewshot_seed(seed=seed)
    return task


def _leaves(tree: Any) -> Iterator[Any]:
    for value in tree.values():
        yield from _leaves(value) if isinstance(value, dict) else (value,)


@dataclass(frozen=True)
class Benchmark:
    """One lm-eval task with its instances built, grouped by document."""

    name: str
    task: Any
    docs: dict[int, Any]
    instances: dict[int, list[Any]]


def build_benchmark(name: str, manager: Any, data_dir: str, fewshot: int, seed: int, limit: int) -> Benchmark:
    task = load_benchmark(name, manager, data_dir, fewshot, seed)
    try:
        task.build_all_requests(limit=limit or None)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        where = f"{Path(data_dir) / (name + '.jsonl')}" if data_dir else f"the {name} dataset"
        raise UserError(f"lm-eval's {name} cannot read {where}: {type(exc).__name__} {exc}") from None
    instances: dict[int, list[Any]] = {}
    docs: dict[int, Any] = {}
    for instance in task.instances:
        if instance.request_type not in ("loglikelihood", "multiple_choice"):
            raise UserError(f"lm-eval benchmark {name} asks for {instance.request_type}; the zeroshot task scores "
                            "log-likelihood benchmarks (run others through evalsuite.integrations.lmeval)")
        instances.setdefault(instance.doc_id, []).append(instance)
        docs[instance.doc_id] = instance.doc
    for group in instances.values():
        group.sort(key=lambda inst: inst.idx)
    return Benchmark(name, task, docs, instances)


def lm_eval_scores(benchmark: Benchmark, doc_id: int, results: list[tuple[float, bool]]) -> dict[str, Any]:
    """lm-eval's filters and process_results for one document: its metrics, as lm-eval computes them."""
    instances = [dataclasses.replace(inst, resps=[result], filtered_resps={})
                 for inst, result in zip(benchmark.instances[doc_id], results)]
    ensembles = lmeval_compat.task_filters(benchmark.task)
    for ensemble in ensembles:
        ensemble.apply(instances)
    keys = [e.name for e in ensembles] or ["none"]
    scores: dict[str, Any] = {}
    for key in keys:
        filtered = [inst.filtered_resps.get(key, inst.resps[0]) for inst in instances]
        for metric, value in benchmark.task.process_results(benchmark.docs[doc_id], filtered).items():
            scores[metric if key == "none" else f"{metric},{key}"] = value
    return scores


@dataclass(frozen=True)
class ZeroShotState:
    """What `prepare` loads for a run: lm-eval's task of each benchmark, its instances built."""

    benchmarks: dict[str, Benchmark]


@register_task
@dataclass(frozen=True)
class ZeroShot(TaskBase, name="zeroshot", view=ZeroShotView, group_by=("benchmark", "bits"),
               metrics=("score", "acc", "acc_norm"), primary_metric="acc",
               gating_axes=("bits",),  # check gates acc per attention bit width
               cluster_key="document",  # one document, across attention bit widths
               smoke_plan={"benchmarks": "hellaswag", "data_dir": "{data}/zeroshot", "limit": "2", "bits": "16,8"}):
    """Zero-shot benchmarks (ARC, BoolQ, HellaSwag, OBQA, PIQA, WinoGrande) via lm-eval; attention-bits sweep."""

    benchmarks: tuple[str, ...] = PAPER_BENCHMARKS
    fewshot: int = 0
    limit: int = 0  # documents per benchmark; 0 = all
    bits: tuple[int, ...] = ()  # attention-logit bit widths to sweep; () = the model as loaded
    data_dir: PathText = PathText()  # held as its absolute path: one run folder however it is written
    seed: int = 1234  # lm-eval's few-shot sampling seed (its default)

    def __post_init__(self) -> None:
        if not self.benchmarks:
            raise ValueError("-T benchmarks needs at least one lm-eval task name, e.g. benchmarks=hellaswag")
        if len(set(self.benchmarks)) != len(self.benchmarks) or len(set(self.bits)) != len(self.bits):
            raise ValueError("-T benchmarks and -T bits must not repeat a value")
        if self.fewshot < 0 or self.limit < 0:
            raise ValueError("-T fewshot and -T limit must be >= 0 (limit 0 = every document)")
        for bits in self.bits:
            check_bits(bits)
        if self.data_dir and not Path(self.data_dir).expanduser().is_dir():
            raise ValueError(f"-T data_dir {self.data_dir} is not a folder")

    # ---- per-run state: lm-eval's tasks --------------------------------------------------

    def prepare(self, model: ModelAdapter | None) -> ZeroShotState:
        """Refuse a model quantized at load time when sweeping bits, then load every benchmark."""
        if model is not None:
            loaded = (model.fingerprint().get("quantization") or {}).get("attn_logits")
            if self.required_capabilities() and loaded:
                raise UserError("-T bits sweeps the attention quantization itself; drop -M attn_quant")
        lm_eval_available()
        manager = task_manager(self.benchmarks)
        return ZeroShotState({b: build_benchmark(b, manager, self.data_dir, self.fewshot, self.seed, self.limit)
                              for b in self.benchmarks})

    # ---- plan ----------------------------------------------------------------------------

    def plan(self, state: ZeroShotState) -> Iterator[Sample]:
        for bits in self.bits or (None,):
            for benchmark in state.benchmarks.values():
                for doc_id in sorted(benchmark.docs):
                    yield self._sample(benchmark, doc_id, bits)

    def _sample(self, benchmark: Benchmark, doc_id: int, bits: int | None) -> Sample:
        sweep = "" if bits is None else f"-b{bits}"
        axes: dict[str, Any] = {"benchmark": benchmark.name, "fewshot": self.fewshot,
                                "document": f"{benchmark.name}/{doc_id}"}
        if bits is not None:
            axes["bits"] = bits
        target = benchmark.task.doc_to_target(benchmark.docs[doc_id])
        # lm-eval's task rides with the sample: scoring runs its filters and process_results
        return Sample(id=f"zeroshot-{benchmark.name}-{self.fewshot}shot{sweep}-{doc_id:06d}", task=self.name,
                      axes=axes, target=(str(target),), data={"doc_id": doc_id, "benchmark": benchmark})

    # ---- the bit-width sweep -------------------------------------------------------------

    def required_capabilities(self) -> tuple[str, ...]:
        sweeping = bool(self.bits) and self.bits != (FULL_BITS,)
        return (ATTENTION_QUANTIZATION,) if sweeping else ()

    def model_setting(self, sample: Sample) -> int | None:
        return sample.axes.get("bits")

    def apply_model_setting(self, model: Any, bits: Any) -> contextlib.AbstractContextManager[Any]:
        if bits is None or bits == FULL_BITS:
            return contextlib.nullcontext()
        return model.quantized_attention(bits)  # the adapter's ATTENTION_QUANTIZATION capability

    # ---- requests and scores -------------------------------------------------------------

    def requests(self, sample: Sample, model: ModelAdapter, state: ZeroShotState
                 ) -> tuple[list[LoglikelihoodRequest], dict[str, Any]]:
        from evalsuite.tasks.lmeval_requests import loglikelihood_request

        benchmark = state.benchmarks[sample.axes["benchmark"]]
        doc_id = sample.data["doc_id"]
        instances = benchmark.instances[doc_id]
        doc_json = json.dumps(benchmark.docs[doc_id], indent=2, default=lmeval_compat.json_default, ensure_ascii=False)
        info = {  # the identifying fields of lm-eval's own per-sample log
            "doc_id": doc_id,
            "doc_hash": lmeval_compat.hash_text(doc_json),
            "prompt_hash": lmeval_compat.hash_text(instances[0].arguments[0]),
            "target_hash": lmeval_compat.hash_text(sample.target[0]),
            "continuations": [inst.arguments[1] for inst in instances],
        }
        return [loglikelihood_request(*inst.arguments) for inst in instances], info

    def score(self, sample: Sample, outputs: Sequence[Any]) -> dict[str, Any]:
        benchmark = sample.data["benchmark"]
        results = [(out.logprob, out.is_greedy) for out in outputs]
        scores = lm_eval_scores(benchmark, sample.data["doc_id"], results)
        scores["score"] = scores.get(PAPER_METRIC.get(benchmark.name, "acc"))
        return scores

    def summary(self, frame: Any, run: Any) -> dict[str, Any]:
        rows = aggregate_rows(frame)
        return {"lm_eval": rows, "table": paper_table(rows)}
