"""Key-value retrieval: find the value of one key among `pairs` random key-value lines."""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from evalsuite import GenerationRequest, Sample, register_task


@register_task
@dataclass(frozen=True)
class KeyValue:
    """Key-value retrieval: recall the value of one key among many (an outside plugin)."""

    name: ClassVar[str] = "kv"
    metrics: ClassVar[tuple[str, ...]] = ("correct",)
    group_by: ClassVar[tuple[str, ...]] = ("pairs", "position")

    pairs: tuple[int, ...] = (4, 16)
    samples: int = 10
    seed: int = 0

    def plan(self) -> list[Sample]:
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

    def requests(self, sample: Sample, model) -> tuple[list[GenerationRequest], dict]:
        lines = [f"{k}: {v}" for k, v in zip(sample.data["keys"], sample.data["values"])]
        asked = sample.data["keys"][sample.data["asked"]]
        prompt = "\n".join(lines) + f"\nWhat is the value of {asked}? Answer:"
        info = {"prompt_tokens": model.count_tokens(prompt)}
        return [GenerationRequest(prompt=prompt, max_new_tokens=8, stop=("\n",))], info

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        return {"correct": outputs[0].strip() == sample.target[0]}

    def plots(self, frame, folder: Path, title: str) -> list[Path]:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ax = frame.groupby("pairs")["correct"].mean().plot.bar(ylim=(0, 1), title=title)
        path = folder / "kv-accuracy.png"
        ax.figure.savefig(path)
        plt.close(ax.figure)
        return [path]
