"""Readable errors and things left behind (issue 18, cases 10, 13, 15, 16).

- ``amp-inspect report`` of a missing log says "no such file", even where report outputs exist, and its
  advice for existing outputs is one that works.
- A nested tensor given to ``tensor_stats``, ``format_readiness`` or ``update_stats`` is the same one-line TypeError.
- A submodule wrapped in place after attach is reported under its new name.
- An inspector dropped without ``detach()`` leaves no forward hooks on the model.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.cli import commands as cli
from amp_inspect.runlog.log import RunLog

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.skipif(not HAVE_MPL, reason="the report needs matplotlib")
def test_report_of_a_missing_log_says_no_such_file_even_beside_old_outputs(tmp_path: Path, capsys, monkeypatch):
    """Case 10: before, "loss_scale.png ... already exist" and the advice "-o NEW.html", which could not help then.
    Since issue 31, item 9, a report's figures are named after it (x_loss_scale.png): other PNGs are no outputs."""
    from amp_inspect.render.plots import FIGURES

    monkeypatch.chdir(tmp_path)
    for name in FIGURES:
        (tmp_path / f"{name}.png").write_bytes(b"old")
    assert cli.main(["report", str(tmp_path / "nonexistent"), "-o", "x.html"]) == 2
    err = capsys.readouterr().err
    assert "nonexistent: no such file" in err and "already exist" not in err

    log = tmp_path / "run.jsonl"
    with RunLog(log) as writer:
        writer.write({"step": 0, "scale": 1.0, "skipped": False, "total_norm": 1.0, "offenders": []})
    assert cli.main(["report", str(log), "-o", "x.html"]) == 0
    assert all((tmp_path / f"x_{name}.png").exists() for name in FIGURES)
    assert cli.main(["report", str(log), "-o", "x.html"]) == 2  # its own outputs: --force, or another name
    err = capsys.readouterr().err
    assert "already exist" in err and "-o x-2.html" in err
    assert cli.main(["report", str(log), "-o", "x-2.html"]) == 0  # the advice works
    assert all((tmp_path / f"{name}.png").read_bytes() == b"old" for name in FIGURES)


def test_a_nested_tensor_is_refused_in_one_line() -> None:
    """Case 13: before, NotImplementedError from the dispatcher ('AutogradNestedTensor' backend)."""
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match=r"tensor 1 is a nested tensor; pass its components instead"):
        amp_inspect.tensor_stats([torch.ones(2), nested])
    stats = amp_inspect.tensor_stats(list(nested.unbind()))  # what the message says to do works
    assert int(stats.numel.sum()) == 5


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_every_op_refuses_a_nested_tensor_in_the_same_sentence(layout: torch.layout) -> None:
    """Issue 31, item 16: only tensor_stats had the refusal. Before, format_readiness gave the dispatcher's
    "Could not run 'amp_inspect::format_readiness' with arguments from the 'AutogradNestedTensor' backend" and
    update_stats "Internal error: NestedTensorImpl doesn't support sizes" (a strided nested tensor); a jagged one got
    "is a torch.jagged tensor; ... takes dense tensors", which does not say what to do."""
    nested = torch.nested.nested_tensor([torch.ones(4, 2), torch.full((3, 2), 2.0)], layout=layout)
    dense = torch.tensor([1.0, -2.0, 0.5, 0.0])
    said = "is a nested tensor; pass its components instead (list(t.unbind()))"
    with pytest.raises(TypeError) as fr:
        amp_inspect.format_readiness([dense, nested], ["mxfp8_e4m3"])
    assert str(fr.value) == f"amp_inspect.format_readiness: tensors[1] {said}"
    with pytest.raises(TypeError) as us:
        amp_inspect.update_stats([dense, nested], [dense, nested], [dense, nested])
    assert str(us.value) == f"amp_inspect.update_stats: before[1] {said}"
    with pytest.raises(TypeError, match=r"^amp_inspect.update_stats: grads\[0\] is a nested tensor; pass its"):
        amp_inspect.update_stats([dense], [dense], [nested])
    with pytest.raises(TypeError) as ts:  # the refusal tensor_stats had, now naming the op as the others do
        amp_inspect.tensor_stats([dense, nested])
    assert str(ts.value) == f"amp_inspect.tensor_stats: tensor 1 {said}"

    # The valid neighbour: the dense tensor alone, and the components the message points to.
    assert amp_inspect.tensor_stats([dense]).numel.tolist() == [4]
    parts = list(nested.unbind())
    readiness = amp_inspect.format_readiness([dense, *parts], ["mxfp8_e4m3"])
    assert readiness.numel[:, 0].tolist() == [4, 8, 6] and readiness.amax.tolist() == [2.0, 1.0, 2.0]
    update = amp_inspect.update_stats([dense, *parts], [dense * 2, *parts], [dense, *parts])
    assert update.numel.tolist() == [4, 8, 6] and update.changed.tolist() == [3, 0, 0]


class _Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_submodule_wrapped_in_place_is_reported_by_its_new_name() -> None:
    """Case 15: before, the parameters were unchanged, so the names never refreshed: "b", not "b.inner"."""
    net = nn.Sequential()
    net.add_module("a", nn.Linear(4, 4))
    net.add_module("b", nn.Linear(4, 4))
    insp = amp_inspect.attach(net)

    def step() -> amp_inspect.StepReport:
        net(torch.randn(2, 4)).sum().backward()
        for p in net.b.parameters():
            p.grad.fill_(math.inf)
        report = insp.check()
        net.zero_grad()
        return report

    assert step().offenders == ["b"]
    net.b = _Wrap(net.b)
    assert step().offenders == ["b.inner"]
    insp.detach()


def _forward_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_an_inspector_dropped_without_detach_leaves_no_hooks() -> None:
    """Case 16: before, its forward hooks (one per module) stayed on the model for good."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(50)])
    insp = amp_inspect.attach(model, activations="always")
    model(torch.randn(2, 4)).sum().backward()
    insp.check()
    assert _forward_hooks(model) >= 50
    del insp
    gc.collect()
    assert _forward_hooks(model) == 0
    kept = amp_inspect.attach(model, activations="always")  # one still referenced keeps its hooks
    gc.collect()
    assert _forward_hooks(model) >= 50
    kept.detach()
    assert _forward_hooks(model) == 0


def test_the_docs_and_the_kernel_agree_on_float64_casts() -> None:
    """Case 17: tensor_stats.md said "cast means v.to(dtype)", which float64 inputs do not follow."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    below = math.nextafter(65520.0, 0.0)
    x = torch.tensor([below], dtype=torch.float64)
    assert torch.isinf(x.to(torch.float16)).item()  # torch's cast rounds through float32: Inf
    assert int(amp_inspect.tensor_stats([x]).overflow.sum()) == 0  # one rounding: finite, no overflow
    for page in ("tensor_stats.md", "numerics.md"):
        text = " ".join((docs / page).read_text(encoding="utf-8").split())
        assert "nextafter(65520.0, 0.0)" in text and "through float32" in text, page
    assert "means `v.to(dtype)`: round" not in (docs / "tensor_stats.md").read_text(encoding="utf-8")


# ---- tensor-subclass parameters (issue 31, item 12) ----


def _train(model: nn.Module, steps: int, nan_step: int | None = None, **options: object) -> tuple[Any, list, list[str]]:
    """``steps`` SGD steps of ``model`` under an inspector attached with ``options`` (update_every gets the
    optimizer); the NaN step scales the input by NaN. Returns the inspector, its reports and its warnings' texts."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    if "update_every" in options:
        options["optimizer"] = opt
    gen = torch.Generator().manual_seed(3)
    reports = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        insp = amp_inspect.attach(model, **options)
        for step in range(steps):
            x = torch.randn(8, 16, generator=gen) * (math.nan if step == nan_step else 1.0)
            model(x).sum().backward()
            reports.append(insp.check())
            opt.step()
            opt.zero_grad()
    return insp, reports, [str(w.message) for w in caught if "amp_inspect" in str(w.message)]


def test_a_quantized_weight_is_left_out_with_one_warning_and_check_never_raises() -> None:
    """torchao's int8 quantized-training weight (tests/subclasses.py): no plain tensor holds its values. Before,
    readiness_every raised from check() "Int8Weight dispatch: attempting to run unimplemented operator/function:
    amp_inspect.format_readiness.default", and the weight check after a NaN step the same for tensor_stats."""
    from tests.subclasses import Int8Weight, int8_model

    model = int8_model()
    weight = model[0].weight
    int_data = weight.int_data
    insp, reports, said = _train(model, 4, nan_step=2, readiness_every=1, update_every=1)
    assert type(model[0].weight) is Int8Weight and model[0].weight is weight and weight.int_data is int_data
    readiness = [s for s in said if "readiness_every does not measure" in s]
    assert readiness == [
        "amp_inspect: readiness_every does not measure W of 0 (Int8Weight): a tensor subclass whose values no plain "
        "tensor holds (its own dequantization makes them); the modules' other operands are measured"
    ]  # once, not once per step
    assert sum("update_every leaves out 0 and every other parameter held in a tensor subclass" in s for s in said) == 1
    assert "(Int8Weight)" in next(s for s in said if "update_every leaves out" in s)
    # Its gradient is a plain tensor: measured, as the bias's and the other layer's.
    assert {m: r["numel"] for m, r in reports[0].by_module.items()} == {"0": 32 * 16 + 32, "2": 4 * 32 + 4}
    assert [r.found_inf for r in reports] == [False, False, True, True]
    table = insp.readiness()
    assert set(table.modules["0"]) == {"X", "dY", "dW"}  # W not measured
    assert set(table.modules["2"]) == {"X", "W", "dY", "dW"}
    assert insp.last_update.by_module["0"]["numel"] == 32  # the bias; the int8 weight left out
    assert insp.weights_poisoned() is not None  # the weight check after the NaN step read the plain weights


def test_a_subclass_holding_its_values_is_measured_exactly_as_a_plain_parameter() -> None:
    """A wrapper whose one inner tensor holds the values (torchao's float8 / bitnet training weights): its
    gradients are wrappers too. Before, check() raised ".numpy() is not supported for tensor subclasses" (the op's
    outputs came back wrapped). The plain model, the same numbers, is the neighbour: unchanged, no warning."""
    from tests.subclasses import MasterWeight, master_model

    wrapped, wrapped_reports, wrapped_said = _train(master_model(), 3, nan_step=2, readiness_every=1, update_every=1)
    plain, plain_reports, plain_said = _train(TwoLinear(), 3, nan_step=2, readiness_every=1, update_every=1)
    assert wrapped_said == plain_said == []
    for a, b in zip(wrapped_reports, plain_reports, strict=True):
        assert a.by_module.keys() == b.by_module.keys()
        for module, row in a.by_module.items():
            # The same gradients; the wrapper's backward lays them out transposed, and the op's float32 partial sums
            # of squares then add in another order (core/statistics.py: relative error below 2e-6).
            other = b.by_module[module]
            assert {k: v for k, v in row.items() if k != "grad_norm"} == {
                k: v for k, v in other.items() if k != "grad_norm"
            }
            assert row["grad_norm"] == pytest.approx(other["grad_norm"], rel=2e-6, nan_ok=True)
    assert wrapped_reports[2].found_inf and wrapped_reports[0].by_module["0"]["numel"] == 32 * 16 + 32
    assert set(wrapped.readiness().modules["0"]) == {"X", "W", "dY", "dW"}
    assert wrapped.readiness().modules == plain.readiness().modules
    assert wrapped.last_update.by_module == plain.last_update.by_module
    assert wrapped.last_update.by_module["0"]["numel"] == 32 * 16 + 32
    assert type(wrapped.model[0].weight) is MasterWeight


class TwoLinear(nn.Sequential):
    """tests/subclasses.py's model with plain parameters."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_a_gradient_no_plain_tensor_holds_is_left_out_with_one_warning() -> None:
    from tests.subclasses import Int8Weight

    model = TwoLinear()
    model(torch.randn(8, 16)).sum().backward()
    model[0].weight.grad = Int8Weight.from_float(model[0].weight.grad)
    insp = amp_inspect.attach(model)
    with pytest.warns(RuntimeWarning) as caught:
        reports = [insp.check(), insp.check()]
    said = [str(w.message) for w in caught if "not measured" in str(w.message)]
    assert said == [
        "amp_inspect: the gradient of 0.weight (Int8Weight) is not measured: a tensor subclass whose values no plain "
        "tensor holds (its own dequantization makes them); check() reports the other gradients"
    ]
    assert [r.by_module["0"]["numel"] for r in reports] == [32, 32]  # its bias
    assert reports[0].by_module["2"]["numel"] == 4 * 32 + 4
