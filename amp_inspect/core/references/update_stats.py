"""The pure-torch reference of the update_stats op: what ``optimizer.step()`` did to each parameter.

``update_stats_reference(before, after, grads, exp_avg_sq)`` returns ``(counts, sums, amax)`` exactly as
``amp_inspect::update_stats`` does (shapes and terms: core/statistics.py ``UPDATE``), on the tensors' device. It is
the oracle the compiled kernels are tested against and the fallback where the op has no kernel; it reads no
kernel and no bit helper, only torch's comparisons, so it is an independent account of the definitions:

- ``counts`` int64 [T, 8]: numel, with_grad, lost, changed, weight_nonfinite, weight_subnormal, state_underflow,
  made_nonfinite;
- ``sums`` float64 [T, 2]: sq_change (every difference and square in float64, where before and after are both
  finite), sq_weight (before^2 over finite before);
- ``amax`` float32 [T]: max |after| over finite after, 0 when there is none.

Subnormals are judged on float64 copies (|x| below the dtype's smallest normal, ``torch.finfo(dtype).tiny``),
which holds every float32 / bfloat16 / float16 value exactly, whatever the CPU's flush-to-zero mode.

Cost: about 15 torch ops per tensor and float64 temporaries of 3 x 8 bytes per element at the peak. It calls no
``.item()`` and sizes everything from the shapes, so it does not sync the host on a device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from amp_inspect.core.statistics import UPDATE, UPDATE_OUTPUTS, new_update_outputs

COUNT_NAMES = tuple(s.name for s in UPDATE if s.output == "counts")  # the counts output's columns, in order


def _subnormal_or_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|x| < the smallest normal of ``dtype`` (zero included), judged in float64 (exact for every input dtype)."""
    return x.double().abs() < torch.finfo(dtype).tiny


def _one_tensor(
    before: torch.Tensor, after: torch.Tensor, grad: torch.Tensor, state: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    before, after, grad = before.detach().reshape(-1), after.detach().reshape(-1), grad.detach().reshape(-1)
    with_grad = torch.isfinite(grad) & (grad != 0)
    same = after == before  # values: +0 == -0, NaN != NaN
    finite_before, finite_after = torch.isfinite(before), torch.isfinite(after)
    subnormal = _subnormal_or_zero(after, after.dtype) & (after != 0)
    if state is None:
        underflow = torch.zeros((), dtype=torch.int64, device=after.device)
    else:
        underflow = (with_grad & _subnormal_or_zero(state.detach().reshape(-1), state.dtype)).sum()
    counts = {  # by name, put in the schema's column order below
        "numel": torch.full((), after.numel(), dtype=torch.int64, device=after.device),  # a fill, not a host copy
        "with_grad": with_grad.sum(),
        "lost": (with_grad & same).sum(),
        "changed": (~same).sum(),
        "weight_nonfinite": (~finite_after).sum(),
        "weight_subnormal": subnormal.sum(),
        "state_underflow": underflow,
        "made_nonfinite": (finite_before & torch.isfinite(grad) & ~finite_after).sum(),
    }
    b64, a64 = before.double(), after.double()
    both = finite_before & finite_after
    zero = torch.zeros((), dtype=torch.float64, device=after.device)
    sums = [
        torch.where(both, (a64 - b64).square(), zero).sum(),
        torch.where(finite_before, b64.square(), zero).sum(),
    ]
    magnitudes = torch.where(finite_after, after.abs().float(), torch.zeros((), device=after.device))
    amax = magnitudes.amax() if after.numel() else torch.zeros((), dtype=torch.float32, device=after.device)
    return [counts[name].to(torch.int64) for name in COUNT_NAMES], sums, amax


def update_stats_reference(
    before: Sequence[torch.Tensor],
    after: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avg_sq: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's ``(counts, sums, amax)`` for T parameter tensors (inputs as the op takes them, checked by the
    caller: update_stats.py); ``exp_avg_sq`` empty or None: no state, state_underflow 0."""
    states = list(exp_avg_sq) if exp_avg_sq else [None] * len(before)
    if not before:
        return new_update_outputs(0, torch.device("cpu"), filled=True)
    rows = [_one_tensor(b, a, g, s) for b, a, g, s in zip(before, after, grads, states, strict=True)]
    counts = torch.stack([torch.stack(c) for c, _, _ in rows])
    sums = torch.stack([torch.stack(s) for _, s, _ in rows])
    amax = torch.stack([m for _, _, m in rows])
    outputs = (counts, sums, amax)
    assert tuple(o.shape[1] if o.dim() > 1 else 1 for o in outputs) == tuple(o.columns(0) for o in UPDATE_OUTPUTS), (
        "reference_update's columns differ from the schema's UPDATE"
    )
    return outputs
