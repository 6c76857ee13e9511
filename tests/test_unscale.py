"""unscale_stats_, the fused pass of InspectingGradScaler: statistics of the tensors as stored, then the
tensors unscaled in place exactly as torch._amp_foreach_non_finite_check_and_unscale_ does it."""

from __future__ import annotations

import pytest
import torch

import amp_inspect
from amp_inspect.core.ops import unscale_stats_op
from amp_inspect.core.references.tensor_stats import tensor_stats_reference
from tests import oracles

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _grads(dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = [1, 15, 16, 2049, 70_000]
    out = [(torch.randn(n, generator=g) * 1e3).to(dtype) for n in sizes]
    out.append((torch.randn(40, 30, generator=g) * 1e3).to(dtype).t())  # non-contiguous
    out.append(torch.empty(0, dtype=dtype))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inv_scale", [2.0**-16, 1.0, 1 / 3.0, 4.0])
@pytest.mark.parametrize("inject", [None, "nan", "inf", "-inf"])
def test_matches_torch_unscale_and_tensor_stats(dtype: torch.dtype, inv_scale: float, inject: str | None) -> None:
    ours = _grads(dtype, 0)
    if inject is not None:
        ours[4][1234] = float(inject)
    theirs = [t.clone() for t in ours]
    before = [t.clone() for t in ours]
    inv = torch.tensor(inv_scale, dtype=torch.float32)
    found_ours, found_theirs = torch.zeros(()), torch.zeros(())

    outputs = unscale_stats_op(ours, inv, found_ours, ["fp16", "bf16"])
    torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)

    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        # Bitwise equal, except the payload of NaNs: torch's own bf16 kernel writes 0xFFFF for NaN in its
        # vectorised body and 0x7FC0 in its scalar tail, so no fixed choice could match it everywhere.
        nan = a.isnan()
        assert torch.equal(nan, b.isnan()), f"tensor {i} ({dtype}): NaN positions differ"
        assert oracles.bits_equal(a[~nan], b[~nan]), f"tensor {i} ({dtype}) differs from torch's unscale"
    assert float(found_ours) == float(found_theirs) == (0.0 if inject is None else 1.0)
    # The statistics are those of the values as they were before the unscale (as stored, scaled).
    oracles.assert_outputs_equal(outputs, tensor_stats_reference(before, None, None, ["fp16", "bf16"]))


def test_found_inf_is_only_ever_set() -> None:
    found = torch.ones(())
    unscale_stats_op([torch.ones(10)], torch.tensor(0.5), found, ["fp16"])
    assert float(found) == 1.0  # a clean group never clears another group's finding


def test_rejects_overlapping_and_bad_scalars() -> None:
    expanded = torch.ones(3, 1).expand(3, 4)
    with pytest.raises(RuntimeError, match="overlapping"):
        torch.ops.amp_inspect.unscale_stats_([expanded], torch.tensor(0.5), torch.zeros(()), ["fp16"])
    with pytest.raises(RuntimeError, match="float32 tensors of one element"):
        torch.ops.amp_inspect.unscale_stats_([torch.ones(3)], torch.tensor(0.5).double(), torch.zeros(()), ["fp16"])


def test_opcheck() -> None:
    ts = [torch.randn(100) * 1e5, torch.randn(7, 3).half()]
    torch.library.opcheck(
        torch.ops.amp_inspect.unscale_stats_.default, (ts, torch.tensor(0.25), torch.zeros(()), ["fp16"])
    )


def test_public_package_still_imports() -> None:
    assert amp_inspect.tensor_stats([torch.ones(3)]).numel.tolist() == [3]
