"""Issue 10, the inspector side: cases where amp_inspect answered wrongly without a word (sparse gradients, runs
without an enabled GradScaler, parameters added after attach, two inspectors on one scaler, check() from two
threads, torch.compile'd models, meta tensors, a broken loss scale, complex parameters, attach options).
Each test failed before its fix."""

from __future__ import annotations

import math
import threading
import warnings

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect._ops import tensor_stats_op, unscale_stats_op
from amp_inspect.history import StepRecord, summarize

# ---------------------------------------------------------------- models


class SparseNet(nn.Module):
    """A sparse embedding (nn.Embedding(sparse=True)) feeding a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens)).sum()


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


TOKENS = torch.tensor([1, 2, 1, 5])  # token 1 twice: an uncoalesced sparse gradient with a duplicate index
STORED = 3 * 4  # values stored by the coalesced gradient: three distinct tokens, four features


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _sparse_backward(model: SparseNet, scaler: torch.amp.GradScaler | None, poison: bool) -> None:
    loss = model(TOKENS.to(model.head.weight.device))
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if poison:
        model.emb.weight.grad._values()[0, 0] = math.nan


# ---------------------------------------------------------------- case 1: sparse gradients


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_gradient_nan_is_found_named_and_counted_by_stored_values(device: str) -> None:
    torch.manual_seed(0)
    model = SparseNet().to(device)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    _sparse_backward(model, scaler, poison=True)
    report = insp.check()
    assert report.found_inf and report.skipped
    assert report.offenders == ["emb"]
    assert report.sparse_modules == ["emb"]
    assert report.by_module["emb"]["numel"] == model.emb.weight.grad.coalesce()._values().numel() == STORED
    assert report.by_module["emb"]["nan"] == 1
    assert "sparse gradients (numel counts their stored values): emb" in str(report)
    scaler.step(opt)
    skipped = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
    assert skipped == 1  # GradScaler skipped it: the report agrees
    scaler.update()
    assert insp.summary().skipped == 1
    assert insp.history[-1].offenders == ["emb"]


def test_sparse_gradient_after_unscale_is_judged_at_the_scale() -> None:
    torch.manual_seed(0)
    model = SparseNet()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    _sparse_backward(model, scaler, poison=False)
    before = insp.check()
    before_amax = before.by_module["emb"]["amax"]
    scaler.unscale_(opt)
    insp.step -= 1  # the same step, looked at again after unscale_
    after = insp.check()
    assert not after.found_inf
    assert after.by_module["emb"]["amax"] == pytest.approx(before_amax, rel=1e-6)
    assert after.by_module["emb"]["numel"] == STORED


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("poison", [False, True])
def test_inspecting_scaler_inspects_sparse_gradients_and_stays_bitwise_equal(poison: bool, device: str) -> None:
    torch.manual_seed(0)
    mine, theirs = SparseNet().to(device), SparseNet().to(device)
    theirs.load_state_dict(mine.state_dict())
    scalers = (
        amp_inspect.InspectingGradScaler(device, init_scale=2.0**8),
        torch.amp.GradScaler(device, init_scale=2.0**8),
    )
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (mine, theirs)]
    insp = amp_inspect.attach(mine, scalers[0])
    for model, scaler, opt in zip((mine, theirs), scalers, opts, strict=True):
        _sparse_backward(model, scaler, poison)
        scaler.step(opt)
        scaler.update()
    report = scalers[0].last_report
    assert report.found_inf is poison
    assert report.sparse_modules == ["emb"]
    assert report.by_module["emb"]["numel"] == STORED
    assert report.offenders == (["emb"] if poison else [])
    assert insp.summary().skipped == int(poison)
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b) or (poison and torch.equal(a.isnan(), b.isnan()))
    assert scalers[0].get_scale() == scalers[1].get_scale()


def test_ddp_comm_hook_refuses_sparse_gradients_with_a_clear_error() -> None:
    # The refusal attach() makes for a DDP model with ddp_hook=True (the hook cannot count sparse buckets).
    from amp_inspect.wrappers import refuse_sparse_with_comm_hook

    with pytest.raises(ValueError, match=r"sparse gradients \(emb use sparse=True\): attach with ddp_hook=False"):
        refuse_sparse_with_comm_hook(SparseNet())
    refuse_sparse_with_comm_hook(TwoLayer())  # dense: fine


def test_ddp_with_sparse_gradients_refuses_the_hook_and_inspects_them_without_it(tmp_path) -> None:
    from tests.test_distributed import run_scenario

    run_scenario("ddp_sparse", 2, tmp_path)


# ---------------------------------------------------------------- case 2: no enabled scaler: poisoned steps


@pytest.mark.parametrize("scaler", [None, "disabled", "inspecting-disabled"])
def test_nan_without_an_enabled_scaler_is_a_poisoned_step_not_a_skip(scaler, tmp_path) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    kinds = {"disabled": torch.amp.GradScaler, "inspecting-disabled": amp_inspect.InspectingGradScaler}
    gs = kinds[scaler]("cpu", enabled=False) if scaler in kinds else None
    log = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, gs, log=log, activations="off")
    for step in range(4):
        model(torch.randn(2, 4)).sum().backward()
        if step in (1, 2):
            model.a.weight.grad[0, 0] = math.inf
        report = insp.check()
        if gs is not None:
            gs.update()  # a disabled scaler: no-op (its step() would only call optimizer.step())
        model.zero_grad()
        if step == 1:
            assert report.poisoned and not report.skipped
            text = str(report)
            assert "GradScaler skips" not in text
            assert "optimizer applies them (step poisoned)" in text
    summary = insp.summary()
    assert (summary.skipped, summary.poisoned) == (0, 2)
    assert summary.poisoned_offenders == {"a": 2}
    text = str(summary)
    assert "0 skipped" in text and "2 poisoned" in text
    assert "backoff_factor" not in text and "init_scale" not in text
    # An fp32 forward (autocast off) judged against fp16: no "bf16 needs no loss scale" (it is not a bf16 run).
    assert any("no enabled GradScaler to skip them" in a and "Find the source" in a for a in summary.advice)
    assert [r.poisoned for r in insp.history] == [False, True, True, False]
    assert not any(r.skipped for r in insp.history)
    insp.detach()
    records = amp_inspect.read_log(log)
    assert [r["poisoned"] for r in records] == [False, True, True, False]
    assert not any(r["skipped"] for r in records)
    from_log = summarize([StepRecord.from_log_record(r) for r in records])
    assert (from_log.skipped, from_log.poisoned) == (0, 2)


def test_old_logs_no_scaler_skips_read_as_poisoned() -> None:
    # Written before "poisoned" existed: a no-scaler NaN step was called "skipped".
    old = {"step": 3, "scale": None, "skipped": True, "offenders": ["a"], "total_norm": "nan"}
    record = StepRecord.from_log_record(old)
    assert record.poisoned and not record.skipped
    scaled = StepRecord.from_log_record({**old, "scale": 1024.0})
    assert scaled.skipped and not scaled.poisoned


def test_poisoned_steps_in_plots_html_and_console(tmp_path, capsys) -> None:
    from amp_inspect import console, html_report, plots

    records = [
        {"step": s, "scale": None, "skipped": False, "poisoned": s == 2, "offenders": ["a"] if s == 2 else []}
        for s in range(4)
    ]
    series = plots.RunSeries.from_records(records)
    assert series.poisoned.tolist() == [False, False, True, False] and not series.skipped.any()
    fig = plots.loss_scale(series)
    assert "1 poisoned" in fig.axes[0].get_title(loc="left")
    summary = summarize([StepRecord.from_log_record(r) for r in records])
    page = html_report.render_html(series, summary, {}, source="run.jsonl")
    assert "poisoned steps" in page.lower() and "Poisoned steps: modules" in page
    console.print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap a long title
    assert "1 poisoned" in out and "gradients on poisoned steps" in out


# ---------------------------------------------------------------- case 3: parameters added after attach


def test_a_parameter_added_after_attach_is_inspected_and_named() -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    insp.check()
    model.extra = nn.Linear(4, 1)  # a new head after attach
    (model(torch.randn(2, 4)).sum() + model.extra(torch.randn(2, 4)).sum()).backward()
    model.extra.weight.grad[0, 0] = math.inf
    with pytest.warns(RuntimeWarning, match=r"parameters changed since attach \(added extra.weight, extra.bias\)"):
        report = insp.check()
    assert report.found_inf and report.offenders == ["extra"]
    del model.a  # model surgery: a layer removed
    model.zero_grad()
    with pytest.warns(RuntimeWarning, match=r"removed a.weight, a.bias"):
        report = insp.check()
    assert "a" not in report.by_module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        insp.check()  # unchanged since: no second warning


# ---------------------------------------------------------------- case 4: two inspectors on one scaler


def test_detaching_one_of_two_inspectors_leaves_the_others_patches_and_skip_record() -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = amp_inspect.attach(model, scaler, every=2, activations="off")
    second = amp_inspect.attach(model, scaler, every=2, activations="off")
    first.detach()
    for step in range(2):
        model.zero_grad()
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        if step == 1:  # a step every=2 does not inspect: the scaler's skip must still reach `second`
            model.b.weight.grad[0, 0] = math.nan
        second.check()
        scaler.unscale_(opt)
        assert id(opt) in second._scaler_patches.unscaled_params  # second's unscale_ record still runs
        scaler.step(opt)
        scaler.update()
    assert [(r.step, r.skipped) for r in second.history] == [(0, False), (1, True)]
    assert second.history[-1].offenders == ["b"]
    second.detach()
    assert "unscale_" not in vars(scaler) and "_maybe_opt_step" not in vars(scaler)


def test_detach_in_attach_order_removes_every_patch() -> None:
    scaler = torch.amp.GradScaler("cpu")
    first = amp_inspect.attach(TwoLayer(), scaler, every=2, activations="off")
    second = amp_inspect.attach(TwoLayer(), scaler, every=2, activations="off")
    second.detach()
    assert vars(scaler)["unscale_"] is first._scaler_patches._patched[0][2]
    first.detach()
    assert "unscale_" not in vars(scaler) and "_maybe_opt_step" not in vars(scaler)


def test_a_second_inspector_on_an_inspecting_scaler_is_refused() -> None:
    scaler = amp_inspect.InspectingGradScaler("cpu")
    first = amp_inspect.attach(TwoLayer(), scaler)
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        amp_inspect.attach(TwoLayer(), scaler)
    other = amp_inspect.attach(TwoLayer())
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        other.check(scaler)
    assert scaler.listener is first
    first.detach()
    amp_inspect.attach(TwoLayer(), scaler)  # free again


# ---------------------------------------------------------------- case 5: check() from two threads


def test_check_from_a_second_thread_at_once_is_refused_and_records_nothing_twice() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    inside, release = threading.Event(), threading.Event()
    refresh = insp._refresh_params

    def slow_refresh() -> None:  # holds the first check() inside, deterministically
        inside.set()
        release.wait(timeout=30)
        refresh()

    insp._refresh_params = slow_refresh
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(insp.check()))
    worker.start()
    assert inside.wait(timeout=30)
    try:
        with pytest.raises(RuntimeError, match="check\\(\\) is already running in another thread"):
            insp.check()
    finally:
        release.set()
        worker.join(timeout=30)
    assert len(results) == 1 and results[0] is not None
    assert [r.step for r in insp.history] == [0]
    assert insp.step == 1


def test_history_read_from_another_thread_while_checking_finalizes_each_report_once() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    stop = threading.Event()
    reader = threading.Thread(target=lambda: [insp.history for _ in iter(stop.is_set, True)])
    reader.start()
    try:
        for _ in range(200):
            insp.check()
    finally:
        stop.set()
        reader.join(timeout=30)
    assert [r.step for r in insp.history] == list(range(200))


# ---------------------------------------------------------------- case 6: torch.compile


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_run(model: nn.Module, insp, steps: int, bad: set[int], call=None) -> list:
    reports = []
    call = model if call is None else call
    for step in range(steps):
        x = torch.randn(2, 4)
        if step in bad:
            x[0, 0] = math.inf
        call(x).sum().backward()
        reports.append(insp.check())
        for p in model.parameters():
            p.grad = None
    return reports


@pytest.mark.parametrize("backend", ["eager", "inductor"])  # inductor: the default, a real compile (seconds)
def test_producer_search_works_on_a_compiled_model(fresh_dynamo, backend: str) -> None:
    torch.manual_seed(0)
    compiled = torch.compile(TwoLayer(), backend=backend)
    insp = amp_inspect.attach(compiled, torch.amp.GradScaler("cpu"))
    reports = _compiled_run(compiled, insp, 5, bad={1, 2, 3})
    assert reports[1].found_inf and reports[2].found_inf
    # Armed after step 1's skip: step 2 ran eagerly with the hooks.
    assert reports[2].first_nonfinite is not None and reports[2].first_nonfinite.startswith("a: forward output")
    insp.detach()
    assert torch._dynamo.eval_frame._stance.stance == "default"  # the stance is restored


def test_activations_always_on_a_compiled_model_does_not_recompile_to_the_limit(fresh_dynamo) -> None:
    torch.manual_seed(0)
    compiled = torch.compile(TwoLayer(), backend="eager")
    with pytest.warns(RuntimeWarning, match="runs every step eagerly"):
        insp = amp_inspect.attach(compiled, activations="always")
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        reports = _compiled_run(compiled, insp, 12, bad={3, 7})
    assert [r.first_nonfinite is not None for r in reports] == [s in (3, 7) for s in range(12)]
    insp.detach()
    assert torch._dynamo.eval_frame._stance.stance == "default"


def test_hooks_bypassed_by_a_compiled_wrapper_are_reported_not_silent(fresh_dynamo) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    compiled = torch.compile(model, backend="eager")
    insp = amp_inspect.attach(model)  # the plain model, while the loop calls the compiled wrapper
    with pytest.warns(RuntimeWarning, match="saw no forward pass"):
        reports = _compiled_run(model, insp, 4, bad={1, 2}, call=compiled)
    assert reports[2].found_inf
    assert reports[2].first_nonfinite is not None and "not searched" in reports[2].first_nonfinite
    assert "torch.compile" in str(reports[2])


# ---------------------------------------------------------------- case 7: meta tensors


def test_meta_tensor_in_tensor_stats_is_one_clear_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "built without it" warning first
        with pytest.raises(ValueError, match="tensor 1 is on the meta device"):
            amp_inspect.tensor_stats([torch.ones(3), torch.ones(3, device="meta")])
        with pytest.raises(ValueError, match="scale tensor is on the meta device"):
            amp_inspect.tensor_stats([torch.ones(3)], scale=torch.ones((), device="meta"))


def test_the_op_refuses_mixed_and_meta_devices_instead_of_running_the_fake_kernel() -> None:
    grads = [torch.full((4,), 8.0), torch.full((2,), 8.0, device="meta")]
    found = torch.zeros(())
    with pytest.raises(ValueError, match="tensor 1 is on the meta device"):
        unscale_stats_op(grads, torch.full((), 0.5), found, ["fp16"])
    cpu = [torch.full((4,), 8.0)]
    with pytest.raises(ValueError, match="inv_scale is on the meta device"):
        unscale_stats_op(cpu, torch.full((), 0.5, device="meta"), found, ["fp16"])
    assert torch.equal(cpu[0], torch.full((4,), 8.0))  # not silently left "unscaled" by a fake kernel
    with pytest.raises(ValueError, match="scale is on the meta device"):
        tensor_stats_op(cpu, torch.ones((), device="meta"), None, ["fp16"])
    outputs = unscale_stats_op(cpu, torch.full((), 0.5), found, ["fp16"])
    assert torch.equal(cpu[0], torch.full((4,), 4.0)) and int(outputs[0][0, 0]) == 4


def test_meta_gradients_in_check_name_the_parameter() -> None:
    model = nn.Linear(2, 2, device="meta")
    model.weight.grad = torch.zeros(2, 2, device="meta")
    insp = amp_inspect.attach(model, activations="off")
    with pytest.raises(TypeError, match="parameter 'weight' is on the meta device"):
        insp.check()


# ---------------------------------------------------------------- case 16


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1024.0])
@pytest.mark.parametrize("unscaled", [False, True])
def test_a_broken_loss_scale_is_named_not_a_math_error(bad: float, unscaled: bool) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, activations="off")
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler._scale.fill_(bad)
    if unscaled:
        scaler.unscale_(opt)
    with pytest.warns(RuntimeWarning, match="not a finite positive number: the scaler's state is broken"):
        report = insp.check()  # said at once, also to a loop that never prints its reports
    assert report.scale_problem is not None and "not a finite positive number" in report.scale_problem
    assert report.recommended_scale is None
    assert "WARNING: the loss scale is" in str(report)
    assert report.to_record()["scale_problem"] == report.scale_problem
    summary = insp.summary()
    assert any("not a finite positive number" in w for w in summary.warnings), summary.warnings


def test_complex_parameters_are_inspected_and_named() -> None:
    class Complex(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rot = nn.Linear(2, 2).to(torch.complex64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rot(x.to(torch.complex64)).abs().sum()

    model = Complex()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(3, 2)).backward()
    model.rot.weight.grad[0, 0] = complex(math.nan, 0.0)
    report = insp.check()
    assert report.found_inf and report.offenders == ["rot"]
    assert report.by_module["rot"]["numel"] == 2 * (4 + 2)  # real and imaginary parts
    scaler = amp_inspect.InspectingGradScaler("cpu")
    scaler.scale(model(torch.randn(3, 2))).backward()
    with pytest.raises(TypeError, match=r"the gradient of param_groups\[0\]\.params\[0\] is torch.complex64"):
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"hist_every": "x"}, ValueError, "hist_every must be an int"),
        ({"hist_every": 2.5}, ValueError, "hist_every must be an int"),
        ({"watch_clipping": "yes", "scaler": torch.amp.GradScaler("cpu")}, TypeError, "watch_clipping must be True"),
        ({"ddp_hook": 1}, TypeError, "ddp_hook must be True or False"),
        ({"log_all_ranks": None}, TypeError, "log_all_ranks must be True or False"),
        ({"log": 3}, TypeError, "log must be a path"),
    ],
)
def test_attach_options_are_checked_at_attach(kwargs, error, match, tmp_path) -> None:
    scaler = kwargs.pop("scaler", None)
    with pytest.raises(error, match=match):
        amp_inspect.attach(TwoLayer(), scaler, **kwargs)


@pytest.mark.parametrize(("name", "value"), [("arm_steps", 0), ("collapse_skips", "5")])
def test_inspector_only_options_are_checked_too(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        amp_inspect.Inspector(TwoLayer(), **{name: value})


@pytest.mark.parametrize("inspecting", [False, True])
def test_sparse_gradient_norms_count_a_repeated_index_once_as_torch_does(inspecting: bool) -> None:
    torch.manual_seed(0)
    model, twin = SparseNet(), SparseNet()
    twin.load_state_dict(model.state_dict())
    scaler = amp_inspect.InspectingGradScaler("cpu") if inspecting else torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, activations="off")
    _sparse_backward(model, scaler, poison=False)
    twin(TOKENS).backward()
    scaler.unscale_(opt)
    report = insp.check()
    emb_norm = twin.emb.weight.grad.coalesce()._values().norm().item()
    assert emb_norm != pytest.approx(twin.emb.weight.grad._values().norm().item())  # the repeat matters here
    expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)  # torch coalesces: the true gradient's norm
    assert report.total_norm == pytest.approx(float(expected), rel=1e-6)
    assert report.by_module["emb"]["grad_norm"] == pytest.approx(emb_norm, rel=1e-6)
    if not inspecting:
        total = insp.clip_grad_norm_(0.5)
        assert float(total) == pytest.approx(float(expected), rel=1e-6)
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            ga = a.grad.coalesce().to_dense() if a.grad.is_sparse else a.grad
            gb = b.grad.coalesce().to_dense() if b.grad.is_sparse else b.grad
            torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-7)


def test_check_from_a_second_thread_one_after_the_other_is_refused_too() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    errors: list[BaseException] = []
    go, done = threading.Event(), threading.Event()

    def loop() -> None:  # the training loop's thread: checks, then waits while the main thread tries
        insp.check()
        go.set()
        done.wait(timeout=30)
        insp.check()

    trainer = threading.Thread(target=loop, name="trainer")
    trainer.start()
    assert go.wait(timeout=30)
    try:
        insp.check()  # a monitor thread's call in between would count the same step twice
    except RuntimeError as error:
        errors.append(error)
    done.set()
    trainer.join(timeout=30)
    assert len(errors) == 1 and "thread 'trainer' calls it" in str(errors[0])
    assert [r.step for r in insp.history] == [0, 1]
    insp.check()  # the trainer thread has ended: another thread may take over
    assert [r.step for r in insp.history] == [0, 1, 2]
