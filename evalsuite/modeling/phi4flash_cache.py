"""What Phi-4-mini-flash carries from one forward to the next (`Phi4FlashCache`), and its layer kinds."""

from __future__ import annotations

from typing import Any

import torch

from evalsuite.modeling.phi4flash_mamba import MambaState

MAMBA, GMU, SLIDING, FULL, CROSS = "mamba", "gmu", "sliding_attention", "full_attention", "cross_attention"


class KVLayer:
    """Keys and values of one attention layer (batch, kv heads, columns, d): all of them, or the last
    window - 1 for a sliding-window layer; `seen` counts every column the layer was fed."""

    def __init__(self, window: int | None):
        self.window = window
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.seen = 0

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The keys and values to attend to (the kept ones, then these) and the absolute column of the first."""
        first = self.seen - (0 if self.keys is None else self.keys.shape[2])
        self.seen += keys.shape[2]
        if self.keys is not None and self.values is not None:
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
        kept = keys.shape[2] if self.window is None else min(keys.shape[2], self.window - 1)
        self.keys, self.values = keys[:, :, keys.shape[2] - kept:], values[:, :, values.shape[2] - kept:]
        return keys, values, first

    def select(self, rows: torch.Tensor) -> None:
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]


class RecurrentLayer:
    """A Mamba layer's convolution inputs and scan state."""

    def __init__(self) -> None:
        self.state: MambaState | None = None
        self.seen = 0

    def select(self, rows: torch.Tensor) -> None:
        if self.state is not None:
            self.state = self.state.select(rows)


class StatelessLayer:
    """A cross-decoder layer: it keeps nothing (GMUs read this pass's memory, attention the shared K/V)."""

    seen = 0

    def select(self, rows: torch.Tensor) -> None:
        pass


class Phi4FlashCache:
    """What Phi-4-mini-flash carries between forwards, one entry per layer: Mamba states (constant
    size), sliding-window keys and values (at most window - 1 columns), the full keys and values of
    layer L/2 + 1 (growing), nothing for the cross-decoder. Not a plain growing cache, so evalsuite's
    prefix reuse and continuous batching, which slice and stack caches, leave it alone."""

    def __init__(self, config: Any):
        self.layers: list[KVLayer | RecurrentLayer | StatelessLayer] = []
        for i in range(config.num_hidden_layers):
            kind = config.layer_kind(i)
            if kind == MAMBA:
                self.layers.append(RecurrentLayer())
            elif kind in (SLIDING, FULL):
                self.layers.append(KVLayer(config.window(i)))
            else:
                self.layers.append(StatelessLayer())

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(layer.seen for layer in self.layers)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows."""
        for layer in self.layers:
            layer.select(rows)
