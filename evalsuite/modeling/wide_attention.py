"""How an attention call runs whose value is twice as wide as its query and key (2d against d): the
call every DIFF head of width 2d makes (DiffLlama's one pass, Motif), and which attention
implementations take it as it is.

It sits below the backends so that evalsuite's own model classes (`motif.py`) attend through it;
the hf backend's DIFF seam (`backends/hf/diff_attention.py`) re-exports these names and registers
its attention wrappers here (`register_wrapper`), so a wrapper (the quantizer, the row reader)
is known by the implementation it finally runs.
"""

from __future__ import annotations

from typing import Any

import torch

from evalsuite.modeling import compat

# attention implementations whose kernels need the value as wide as the query (or run a wider
# one on an n x n fallback): DiffLlama keeps transformers' two calls under them
EQUAL_WIDTH_KERNELS = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention")
# devices whose SDPA runs the zero-widened query and key on a fused kernel
PADDED_DEVICES = ("cpu", "cuda")
_wrappers: dict[str, str] = {}  # an evalsuite wrapper's implementation name -> the one it delegates to


def register_wrapper(name: str, delegate: str) -> None:
    """An attention function `name` that hands the attention to `delegate` after its own work."""
    _wrappers[name] = delegate


def delegate_of(implementation: str) -> str:
    """The attention implementation that finally runs under `implementation` (past wrappers)."""
    while implementation in _wrappers:
        implementation = _wrappers[implementation]
    return implementation


def scores_once(implementation: str) -> bool:
    """Whether a DiffLlama layer under `implementation` attends once with the wide value."""
    return delegate_of(implementation) not in EQUAL_WIDTH_KERNELS


def pads_query(implementation: str, device: torch.device) -> bool:
    """Whether a DiffLlama layer attends once by widening query and key with zeros to the value's
    width: SDPA on a CPU or a CUDA device, whose flash kernels need equal widths. The zeros add
    nothing to any score, so each map's scores are transformers' own; the multiply-adds of the
    scores are those of the two calls, but every score is exponentiated once, not twice, and the
    kernel is launched once (on a CPU 0.93x the two calls' time at 8K tokens; docs/attention.md).
    Other devices keep the two calls: their SDPA kernels are not known here."""
    return delegate_of(implementation) == "sdpa" and device.type in PADDED_DEVICES


def attend_wide(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, scaling: float, default: Any,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Component heads (B, H, T, d) against values of width 2d (B, KV, T, 2d) under the module's
    attention implementation: one call where the kernel takes the wider value, one call with query
    and key widened by zeros where `pads_query` says so, else two calls, one per half of the value
    (the same scores twice). Output (B, T, H, 2d), as the attention functions return it. Models of
    evalsuite's own whose DIFF heads read a 2d-wide value (Motif) attend through this."""
    implementation = compat.attention_implementation(module.config)
    attend = compat.attention_function(implementation, default)
    if pads_query(implementation, query.device):  # the scale is passed, not read from the padded width
        width = value.shape[-1] - query.shape[-1]
        query, key = (torch.nn.functional.pad(t, (0, width)) for t in (query, key))
    elif not scores_once(implementation):
        halves = torch.chunk(value, 2, dim=-1)
        first, weights = attend(module, query, key, halves[0].contiguous(), attention_mask, dropout=0.0,
                                scaling=scaling, **kwargs)
        second, _ = attend(module, query, key, halves[1].contiguous(), attention_mask, dropout=0.0,
                           scaling=scaling, **kwargs)
        return torch.cat([first, second], dim=-1), weights
    output, weights = attend(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
    return output, weights
