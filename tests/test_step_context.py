"""step_context.StepContext: the formats follow the autocast dtype the forward ran under (formats= left to its
default, no enabled GradScaler), and the report gets the backward order and that dtype."""

from __future__ import annotations

import torch
from torch import nn

from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.gradients.step_context import StepContext
from amp_inspect.gradients.step_report import StepReport


def _seen_bf16(follow: bool) -> tuple[nn.Module, StepContext]:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    context = StepContext(model, follow_autocast=follow)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(3, 2)).float().sum().backward()
    return model, context


def test_formats_follow_the_autocast_dtype_unless_told_or_scaled() -> None:
    _, context = _seen_bf16(follow=True)
    assert context.formats_to_judge(("fp16", "fp8_e4m3"), None) == ("bf16", "fp16", "fp8_e4m3")
    assert context.formats_to_judge(("bf16",), None) is None  # already first
    assert context.formats_to_judge(("fp16",), torch.amp.GradScaler("cpu")) is None  # a loss scale: fp16's tool
    assert context.formats_to_judge(("fp16",), torch.amp.GradScaler("cpu", enabled=False)) == ("bf16", "fp16")
    _, told = _seen_bf16(follow=False)
    assert told.formats_to_judge(("fp16",), None) is None  # formats= given: kept


def test_the_report_gets_the_backward_order_and_the_autocast_seen() -> None:
    model, context = _seen_bf16(follow=True)
    report = StepReport(0, tensor_stats([p.grad for p in model.parameters()]), ["0", "0", "1", "1"], None)
    report.annotate(context.annotate(report))
    assert report.autocast == "bf16"
    assert list(report.backward_order) == ["1", "0"]  # closest to the output first
    context.close()


def _seen_off(dtype: torch.dtype, follow: bool = True) -> StepContext:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)).to(dtype)
    context = StepContext(model, follow_autocast=follow)
    model(torch.randn(3, 2, dtype=dtype)).float().sum().backward()  # no autocast
    return context


def test_a_model_cast_to_bf16_is_judged_against_bf16_without_autocast() -> None:
    assert _seen_off(torch.bfloat16).formats_to_judge(("fp16",), None) == ("bf16", "fp16")
    assert _seen_off(torch.bfloat16).formats_to_judge(("fp16",), torch.amp.GradScaler("cpu")) is None
    assert _seen_off(torch.bfloat16, follow=False).formats_to_judge(("fp16",), None) is None
    assert _seen_off(torch.float32).formats_to_judge(("fp16",), None) is None  # fp32 weights: the default stays
    assert _seen_off(torch.float16).formats_to_judge(("fp16",), None) is None  # already fp16


def test_attach_on_a_bf16_model_reports_against_bf16() -> None:
    import amp_inspect

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8)).to(torch.bfloat16)
    insp = amp_inspect.attach(model)
    (model(torch.randn(16, 64, dtype=torch.bfloat16)).float().pow(2).mean() * 1e-7).backward()
    report = insp.check()
    assert insp.formats[0] == "bf16" and report.formats[0] == "bf16"
    assert "fp16 underflow" not in str(report) and "headroom (bf16)" in str(report)
    insp.detach()
