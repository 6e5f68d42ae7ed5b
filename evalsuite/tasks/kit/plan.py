"""The depth x length grid of a length-swept task's plan.

    cells(lengths, depths, samples, by_sample=False)   (length, depth, index) of every sample

By default the cells come length by length, then depth by depth, with a cell's samples together.
`by_sample=True` puts sample i's cells together instead (index, then length, then depth): a task
whose sample i shares one haystack across lengths and depths then sends prompts that begin alike
in one model call, so prefix sharing prefills their common start once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def cells(lengths: Sequence[int], depths: Sequence[float], samples: int, by_sample: bool = False
          ) -> Iterator[tuple[int, float, int]]:
    if by_sample:
        return ((length, depth, index) for index in range(samples) for length in lengths for depth in depths)
    return ((length, depth, index) for length in lengths for depth in depths for index in range(samples))
