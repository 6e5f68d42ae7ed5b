"""Key-value retrieval: find the value of one key among `pairs` random key-value lines."""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from evalsuite import GenerationRequest, Sample, TaskBase, TaskView, register_task


class KeyValueView(TaskView):
    """The task's presentation: a bar of accuracy per number of pairs."""

    def plots(self, frame, run, folder: Path, title: str) -> list[Path]:
        from evalsuite.analysis.plots import save  # writes the figure to a file and closes it
        ax = frame.groupby("pairs")["correct"].mean().plot.bar(ylim=(0, 1), title=title)
        return [save(ax.figure, folder / "kv-accuracy.png")]


@register_task
@dataclass(frozen=True)
class KeyValue(TaskBase):
    """Key-value retrieval: recall the value of one key among many (an outside plugin)."""

    name: ClassVar[str] = "kv"
    metrics: ClassVar[tuple[str, ...]] = ("correct",)
    group_by: ClassVar[tuple[str, ...]] = ("pairs", "position")
    view: ClassVar[type[TaskView]] = KeyValueView

    pairs: tuple[int, ...] = (4, 16)
    samples: int = 10
    seed: int = 0

    def plan(self, state: None) -> list[Sample]:
        return [self._sample(n, i) for n in self.pairs for i in range(self.samples)]

    def _sample(self, n: int, index: int) -> Sample:
        sample_id = f"kv-{n}-s{self.seed}-{index:03d}"
        rng = random.Random(sample_id)
        keys = rng.sample(range(10_000, 100_000), n)
        values = [str(rng.randrange(100, 1000)) for _ in keys]
        asked = rng.randrange(n)
        axes = {"pairs": n, "position": "first half" if asked < n / 2 else "second half"}
        data = {"keys": keys, "values": values, "asked": asked}
        return Sample(id=sample_id, task=self.name, axes=axes, target=(values[asked],), data=data)

    def requests(self, sample: Sample, model, state: None) -> tuple[list[GenerationRequest], dict]:
        lines = [f"{k}: {v}" for k, v in zip(sample.data["keys"], sample.data["values"])]
        asked = sample.data["keys"][sample.data["asked"]]
        prompt = "\n".join(lines) + f"\nWhat is the value of {asked}? Answer:"
        info = {"prompt_tokens": model.count_tokens(prompt)}
        return [GenerationRequest(prompt=prompt, max_new_tokens=8, stop=("\n",))], info

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        return {"correct": outputs[0].strip() == sample.target[0]}
