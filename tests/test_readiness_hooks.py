"""readiness/hooks.py: attach(..., readiness_every=N) measures X, W, dY and dW of every Linear / Conv1D on every N-th
step only, names them by module, leaves no hook behind, and runs compiled models eagerly on those steps."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.core.format_readiness import format_readiness
from amp_inspect.core.recipes import RECIPE_NAMES
from amp_inspect.readiness import hooks as readiness_hooks
from amp_inspect.readiness.hooks import ReadinessHooks, gemm_modules, is_gemm_module
from amp_inspect.readiness.report import OperandStats


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))


def _step(model: nn.Module, insp: amp_inspect.Inspector, batch: int = 4):
    model(torch.randn(batch, 16)).square().mean().backward()
    report = insp.check()
    model.zero_grad()
    return report


def _pre_hooks(model: nn.Module) -> int:
    """The readiness hooks on the model's modules (the inspector has others: autocast watch, backward order)."""
    hooks = [h for m in model.modules() for h in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())]
    return sum(type(h).__module__ == readiness_hooks.__name__ for h in hooks)


def _host(stats: object, row: int) -> OperandStats:
    """Row ``row`` of a ReadinessStats as host values, in readiness_report's terms."""
    r = readiness_hooks._rows(stats)[row]
    return OperandStats.from_row(r.counts.tolist(), r.sums.tolist(), float(r.amax), len(RECIPE_NAMES))


def test_off_by_default_registers_nothing() -> None:
    model = _model()
    insp = amp_inspect.attach(model)
    assert _pre_hooks(model) == 0
    report = _step(model, insp)
    assert report.readiness is None and insp.readiness() is None
    insp.detach()


def test_hooks_exist_and_measure_only_on_every_nth_step() -> None:
    model = _model()
    insp = amp_inspect.attach(model, readiness_every=3)
    hooked = []
    for _ in range(7):
        hooked.append(_pre_hooks(model) > 0)
        report = _step(model, insp)
        assert (report.readiness is not None) == (report.step % 3 == 0)
    assert hooked == [True, False, False, True, False, False, True]
    assert insp.readiness().step == 6
    assert _pre_hooks(model) == 0  # step 7 is not a readiness step
    insp.detach()


def test_modules_named_as_the_model_names_them_with_every_operand() -> None:
    model = _model()
    insp = amp_inspect.attach(model, readiness_every=1)
    report = _step(model, insp)
    assert list(report.readiness.modules) == ["0", "2"]
    for ops in report.readiness.modules.values():
        assert list(ops) == ["X", "W", "dY", "dW"]
    insp.detach()


def test_operands_are_what_a_manual_call_on_the_same_tensors_gives() -> None:
    model = _model()
    first = model[0]
    seen: dict[str, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        seen["X"] = args[0].detach().clone()
        output.register_hook(lambda g: seen.__setitem__("dY", g.detach().clone()))

    handle = first.register_forward_hook(keep)
    insp = amp_inspect.attach(model, readiness_every=1)
    model(torch.randn(5, 3, 16)).square().mean().backward()  # 3-d X: blocks along the last dimension as given
    seen["W"], seen["dW"] = first.weight.detach().clone(), first.weight.grad.detach().clone()
    report = insp.check()
    handle.remove()
    ops = report.readiness.modules["0"]
    manual = format_readiness([seen[k] for k in ("X", "W", "dY", "dW")])
    for row, operand in enumerate(("X", "W", "dY", "dW")):
        got, want = ops[operand], _host(manual, row)
        assert got.numel == seen[operand].numel()
        assert (got.numel, got.nonzero, got.flushed, got.saturated, got.blocks) == (
            want.numel,
            want.nonzero,
            want.flushed,
            want.saturated,
            want.blocks,
        ), operand
        assert got.sq_signal == pytest.approx(want.sq_signal, rel=1e-12)
        assert got.sq_error == pytest.approx(want.sq_error, rel=1e-12)
        assert got.amax == want.amax
    insp.detach()


def test_a_module_called_twice_adds_its_statistics() -> None:
    lin = nn.Linear(8, 8)
    model = nn.Sequential(lin)
    hooks = ReadinessHooks(model, 1, model, 0)
    a, b = torch.randn(4, 8), torch.randn(6, 8)
    (lin(a).sum() + lin(b).sum()).backward()
    hooks.end_step(1, None)
    x = hooks.last.modules["0"]["X"]
    calls = format_readiness([a, b])  # each call is its own tensor (a tensor scale per GEMM, as current scaling has)
    both = _host(calls, 0).merged(_host(calls, 1))
    assert (x.numel, x.nonzero, x.flushed, x.blocks) == (both.numel, both.nonzero, both.flushed, both.blocks)
    assert x.sq_error == pytest.approx(both.sq_error, rel=1e-12)
    assert x.amax == max(a.abs().max(), b.abs().max())
    assert hooks.last.modules["0"]["W"].numel == 2 * 64  # the weight, measured at each call
    hooks.close()


def test_evaluation_forwards_are_left_out() -> None:
    model = _model()
    hooks = ReadinessHooks(model, 1, model, 0)
    with torch.no_grad():
        model(torch.randn(2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the hooks saw a forward: no "saw no forward pass"
        hooks.end_step(1, None)
    assert hooks.last is None  # nothing trained in the step: no table
    hooks.close()


def test_transformers_conv1d_is_hooked_with_its_weight_transposed() -> None:
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D
    torch.manual_seed(0)
    layer = conv1d(12, 20)  # nx=20 inputs, nf=12 outputs: weight [20, 12]
    model = nn.Sequential(layer)
    assert is_gemm_module(layer) and gemm_modules(model) == {layer: "0"}
    hooks = ReadinessHooks(model, 1, model, 0)
    layer(torch.randn(3, 20)).sum().backward()
    hooks.end_step(1, None)
    w = hooks.last.modules["0"]["W"]
    want = _host(format_readiness([layer.weight.detach().t().contiguous()]), 0)
    assert (w.numel, w.blocks, w.flushed) == (want.numel, want.blocks, want.flushed)
    assert w.sq_error == pytest.approx(want.sq_error, rel=1e-12)
    hooks.close()


def test_a_class_named_conv1d_elsewhere_is_not_a_gemm() -> None:
    class Conv1D(nn.Module):  # a user's own class of that name, not transformers'
        pass

    assert not is_gemm_module(Conv1D())


def test_no_hook_is_left_after_detach_even_mid_step() -> None:
    model = _model()
    insp = amp_inspect.attach(model, readiness_every=1)
    out = model(torch.randn(2, 16))  # the forward of a readiness step: hooks on, a gradient hook pending
    assert _pre_hooks(model) > 0
    insp.detach()
    assert _pre_hooks(model) == 0
    out.sum().backward()  # the pending output-gradient hooks were removed too: nothing recorded, no error
    assert insp.readiness() is None


def test_an_inspector_dropped_without_detach_leaves_no_hook() -> None:
    model = _model()
    insp = amp_inspect.attach(model, readiness_every=1)
    assert _pre_hooks(model) > 0
    del insp
    gc.collect()
    assert _pre_hooks(model) == 0


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_bad_readiness_every_is_one_sentence(bad: object) -> None:
    with pytest.raises(ValueError, match="readiness_every must be a positive int"):
        amp_inspect.attach(_model(), readiness_every=bad)


def test_readiness_every_must_be_a_multiple_of_every() -> None:
    with pytest.raises(ValueError, match="multiple of every"):
        amp_inspect.attach(_model(), every=2, readiness_every=3)
    insp = amp_inspect.attach(_model(), every=2, readiness_every=4)
    insp.detach()


def _stance() -> str:
    from torch._dynamo import eval_frame  # the test reads torch's current stance: no public getter

    return eval_frame._stance.stance


def test_a_compiled_model_runs_eagerly_on_readiness_steps_and_is_measured() -> None:
    model = _model()
    compiled = torch.compile(model, backend="eager")
    before = _stance()
    insp = amp_inspect.attach(compiled, readiness_every=2, activations="off")
    assert _stance() == "force_eager"  # step 0 is a readiness step
    compiled(torch.randn(2, 16)).sum().backward()
    report = insp.check()
    assert list(report.readiness.modules) == ["0", "2"]  # the hooks were called
    assert _stance() == before  # step 1 is not: compiled again
    insp.detach()
    assert _stance() == before


def test_the_eager_stance_is_put_back_whichever_holder_lets_go_first() -> None:
    from amp_inspect.probes._activation_arming import ActivationArming

    compiled = torch.compile(_model(), backend="eager")
    before = _stance()
    owner = type("Owner", (), {})()
    arming = ActivationArming(compiled, "on_skip", 5, ("fp16",), owner, 0)
    hooks = ReadinessHooks(compiled, 1, owner, 0)  # holds the stance from step 0
    arming.after_skip(1)  # the activation hooks hold it too
    hooks.close()  # readiness lets go first: the activation hooks still need it
    assert _stance() == "force_eager"
    arming.close()
    assert _stance() == before


def test_a_readiness_step_without_a_forward_says_so_once() -> None:
    model = _model()
    hooks = ReadinessHooks(model, 1, model, 0)
    with pytest.warns(RuntimeWarning, match="saw no forward pass on step 0"):
        hooks.end_step(1, None)
    hooks.end_step(2, None)  # said once
    assert hooks.last is None
    hooks.close()


def test_ddp_ranks_merge_into_one_table(tmp_path) -> None:
    from tests.test_distributed import run_scenario

    run_scenario("ddp_readiness", 2, tmp_path, module="tests.readiness_dist")


def test_a_measurement_failing_on_one_rank_keeps_the_ranks_rows_in_step(tmp_path) -> None:
    # Before, the failing rank left its rows out while the others added theirs: the merge's buffers differed.
    from tests.test_distributed import run_scenario

    run_scenario("readiness_fails_on_one_rank", 2, tmp_path, module="tests.readiness_dist")


def test_tensor_parallel_weights_are_measured_by_their_local_pieces(tmp_path) -> None:
    # DTensor weights of parallelize_module: format_readiness on the DTensor raised NotImplementedError from
    # inside the user's forward pass (issue 31, item 11).
    from tests.test_distributed import run_scenario

    run_scenario("tp_readiness", 2, tmp_path, module="tests.readiness_dist")


def test_with_an_inspecting_grad_scaler_and_no_check_the_step_ends_at_update() -> None:
    model = _model()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    insp = amp_inspect.attach(model, scaler, readiness_every=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        scaler.scale(model(torch.randn(4, 16)).square().mean()).backward()
        scaler.step(opt)
        scaler.update()  # the step's end: the readiness table of steps 0 and 2
        opt.zero_grad()
    assert insp.readiness().step == 2
    assert scaler.last_report.step == 2 and scaler.last_report.readiness is insp.readiness()
    assert list(insp.readiness().modules["2"]) == ["X", "W", "dY", "dW"]
    insp.detach()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_a_model_with_no_measurable_operand_gets_one_warning_not_a_traceback(dtype: torch.dtype) -> None:
    """Issue 31, item 10: readiness_every on a float64 or complex model raised "stack expects a non-empty
    TensorList" from check(); now the step has no readiness table and one warning says why. A float32 model, its
    neighbour, still gets its table."""
    import warnings

    import amp_inspect

    def run(model_dtype: torch.dtype):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)).to(model_dtype)
        insp = amp_inspect.attach(model, readiness_every=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                model(torch.randn(4, 8).to(model_dtype)).abs().sum().backward()
                report = insp.check()
        insp.detach()
        return report, [str(w.message) for w in caught if "no operand they can measure" in str(w.message)]

    report, said = run(dtype)
    assert report.readiness is None and len(said) == 1
    report, said = run(torch.float32)
    assert report.readiness is not None and said == []


def test_a_measurement_that_raises_is_said_once_and_never_breaks_the_forward(monkeypatch) -> None:
    model = _model()
    insp = amp_inspect.attach(model, readiness_every=1)
    real = readiness_hooks.format_readiness
    calls = []

    def failing(tensors, recipes=None):
        calls.append(len(tensors))
        if len(calls) == 1:  # the first module's X and W
            raise NotImplementedError("no sharding strategy")
        return real(tensors, recipes)

    monkeypatch.setattr(readiness_hooks, "format_readiness", failing)
    with pytest.warns(RuntimeWarning, match=r"could not measure X, W of .* \(NotImplementedError: no sharding"):
        model(torch.randn(4, 16)).square().mean().backward()
        report = insp.check()
    rows = report.readiness.modules
    left_out = [name for name, ops in rows.items() if "X" not in ops]
    assert len(left_out) == 1 and "W" not in rows[left_out[0]] and "dY" in rows[left_out[0]]  # left out, once
    assert all({"X", "W", "dY", "dW"} <= set(ops) for name, ops in rows.items() if name not in left_out)
    insp.detach()
