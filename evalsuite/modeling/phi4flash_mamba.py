"""The recurrent half of Phi-4-mini-flash (SambaY): Mamba-1 mixers and gated memory units, in plain torch.

`Phi4FlashMamba` is a Mamba-1 block (in_proj to x and z, a depthwise causal conv1d over x, SiLU,
x_proj to (dt, B, C), dt_proj with its bias then softplus, A = -exp(A_log), the skip D, the
output gated by SiLU(z), out_proj), with the checkpoint's parameter names (`in_proj`, `conv1d`,
`x_proj`, `dt_proj`, `A_log`, `D`, `out_proj`). The block at layer L/2 (`yoco_kv`) also hands on
its scan output before the gate, y: the memory that the cross-decoder's gated memory units read.

`Phi4FlashGMU` is a gated memory unit (the Mamba slots of the cross-decoder, layers L/2 + 2,
L/2 + 4, ...): `out_proj(memory * silu(in_proj(x)))`. The model's own code computes it as
`swiglu(in_proj(x), memory)` with `swiglu(x, y) = x * sigmoid(x) * y`
(microsoft/Phi-4-mini-flash-reasoning, modeling_phi4flash.py, `_Phi3Mamba.forward` and its
`swiglu_fwd` jiterator kernel); vLLM's former port writes the same product as
`memory * silu(in_proj(x))`. The form `in_proj(x) * sigmoid(memory)` is not the model's.

The scan runs a token at a time over a (batch, d_inner, d_state) float32 state, a chunk of
`SCAN_CHUNK` tokens' decays precomputed at once, so memory stays linear in the chunk and the state
continues exactly from one forward to the next (`MambaState`): a prompt fed in slices gives the
numbers of the prompt fed whole. Left padding is exact as in the model's own code: padded
positions' inputs are zeroed before and after the convolution, so the state stays zero until a
row's first real token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SCAN_CHUNK = 256  # tokens whose decays are held at once: chunk x d_inner x d_state float32


@dataclass
class MambaState:
    """What a Mamba layer carries from one forward to the next: the last d_conv - 1 inputs of the
    convolution (batch, d_inner, d_conv - 1) and the scan's state (batch, d_inner, d_state), float32."""

    conv: torch.Tensor
    ssm: torch.Tensor

    def select(self, rows: torch.Tensor) -> MambaState:
        return MambaState(self.conv[rows], self.ssm[rows])


def dt_rank_of(config: Any) -> int:
    """`mamba_dt_rank`: an integer, or "auto" = ceil(hidden_size / 16) (the model's own rule)."""
    rank = getattr(config, "mamba_dt_rank", "auto")
    return math.ceil(config.hidden_size / 16) if rank == "auto" else int(rank)


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1's recurrence, float32: h_t = exp(dt_t A) h_(t-1) + dt_t x_t B_t, y_t = C_t h_t + D x_t.
    x, dt: (batch, time, d_inner); A: (d_inner, d_state); B, C: (batch, time, d_state); state
    (batch, d_inner, d_state). Returns y (batch, time, d_inner) and the state after the last token."""
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    outputs = []
    for start in range(0, x.shape[1], SCAN_CHUNK):
        end = min(start + SCAN_CHUNK, x.shape[1])
        decay = torch.exp(dt[:, start:end, :, None] * A)  # (batch, chunk, d_inner, d_state)
        drive = (dt[:, start:end] * x[:, start:end])[..., None] * B[:, start:end, None, :]
        for t in range(end - start):
            state = decay[:, t] * state + drive[:, t]
            outputs.append(torch.einsum("bdn,bn->bd", state, C[:, start + t]))
    y = torch.stack(outputs, dim=1) if outputs else x.new_zeros(x.shape)
    return y + D.float() * x, state


class Phi4FlashMamba(nn.Module):
    """A Mamba-1 mixer; with `yoco_kv` it also returns its pre-gate output as the YOCO memory."""

    def __init__(self, config: Any, layer_idx: int, yoco_kv: bool = False):
        super().__init__()
        self.layer_idx = layer_idx
        self.yoco_kv = yoco_kv
        width = config.hidden_size
        self.d_inner = int(config.mamba_expand * width)
        self.d_state = config.mamba_d_state
        self.d_conv = config.mamba_d_conv
        self.dt_rank = dt_rank_of(config)
        bias = getattr(config, "mamba_proj_bias", False)
        self.in_proj = nn.Linear(width, 2 * self.d_inner, bias=bias)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, kernel_size=self.d_conv, groups=self.d_inner,
                                padding=self.d_conv - 1, bias=getattr(config, "mamba_conv_bias", True))
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * self.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        # S4D-real initialisation (A = -[1..d_state] per channel), as the model's own code starts it
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.d_state + 1, dtype=torch.float32)
                                            ).repeat(self.d_inner, 1))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, width, bias=bias)

    def empty_state(self, batch: int, like: torch.Tensor) -> MambaState:
        return MambaState(like.new_zeros((batch, self.d_inner, self.d_conv - 1)),
                          torch.zeros((batch, self.d_inner, self.d_state), dtype=torch.float32, device=like.device))

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None, state: MambaState | None
                ) -> tuple[torch.Tensor, torch.Tensor | None, MambaState]:
        """(output, memory or None, the state after these tokens). `mask` (batch, time): 1 on real tokens."""
        batch, time, _ = hidden_states.shape
        state = state if state is not None else self.empty_state(batch, hidden_states)
        x, z = self.in_proj(hidden_states).chunk(2, dim=-1)
        x = x.transpose(1, 2)  # (batch, d_inner, time): the convolution runs along time
        keep = mask[:, None, :].to(x.dtype) if mask is not None else None
        if keep is not None:
            x = x * keep
        window = torch.cat([state.conv.to(x.dtype), x], dim=-1)
        conv = F.conv1d(window, self.conv1d.weight, self.conv1d.bias, groups=self.d_inner)
        x = F.silu(conv)
        if keep is not None:
            x = x * keep
        x = x.transpose(1, 2)  # (batch, time, d_inner)
        dt, B, C = torch.split(self.x_proj(x), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt).float())
        y, ssm = selective_scan(x, dt, -torch.exp(self.A_log.float()), B, C, self.D, state.ssm)
        y = y.to(hidden_states.dtype)
        memory = y if self.yoco_kv else None
        out = self.out_proj(y * F.silu(z))
        return out, memory, MambaState(window[..., window.shape[-1] - (self.d_conv - 1):], ssm)


class Phi4FlashGMU(nn.Module):
    """A gated memory unit of the cross-decoder: out_proj(memory * silu(in_proj(x))), no state."""

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        d_inner = int(config.mamba_expand * config.hidden_size)
        bias = getattr(config, "mamba_proj_bias", False)
        self.in_proj = nn.Linear(config.hidden_size, d_inner, bias=bias)
        self.out_proj = nn.Linear(d_inner, config.hidden_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.out_proj(memory * F.silu(self.in_proj(hidden_states)))
