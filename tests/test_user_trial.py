"""A user's trial of the merged issues 16 and 18 (the demo, a bf16 GPT-2 without a scaler, fp16 with a child-module
loss and the headroom policy): each verdict that read wrong, on a run where it must appear and one where it must
not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.diagnosis.doctor import doctor
from amp_inspect.diagnosis.history import StepRecord, summarize
from amp_inspect.diagnosis.setup_checks import split_advice
from amp_inspect.evidence.attribution import FROM_BACKWARD_ORDER, FROM_EVERY_MODULE, LOSS_OR_FORWARD
from amp_inspect.evidence.headroom import Headroom
from amp_inspect.evidence.spikes import find_spikes
from tests.models import cli_output

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _bf16_nan_run(log: Path, where: str, activations: str = "off", steps: int = 6) -> amp_inspect.Inspector:
    """bf16 autocast, no scaler, a NaN planted on steps 2 and 3: ``where="forward"`` in the middle layer's output
    (the loss is NaN, so every module's gradients are), ``where="last_backward"`` in the last layer's weight
    gradient only (its backward made it; nothing upstream of a weight gradient receives it). The step is guarded,
    as a careful user does, so the weights stay finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    state = {"step": 0}

    def forward_nan(module, inputs, out):
        if where == "forward" and state["step"] in (2, 3):
            out = out.clone()
            out[0, 0] = float("nan")
            return out
        return None

    def grad_nan(grad):
        if where == "last_backward" and state["step"] in (2, 3):
            grad = grad.clone()
            grad[0, 0] = float("nan")
            return grad
        return None

    model[2].register_forward_hook(forward_nan)
    model[4].weight.register_hook(grad_nan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, log=log, activations=activations)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        state["step"] = step
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        report = insp.check()
        if not report.found_inf:
            opt.step()
        opt.zero_grad()
    insp.close()
    return insp


def _log_summary(log: Path):
    return summarize([StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)])


# ---- a NaN from the forward pass reaches every gradient: the module closest to the output did not start it ----


def test_nan_in_every_modules_gradients_is_not_blamed_on_the_module_closest_to_the_output(tmp_path: Path) -> None:
    log = tmp_path / "forward.jsonl"
    insp = _bf16_nan_run(log, "forward")
    for blame in (insp.summary().poisoned_blame, _log_summary(log).poisoned_blame):
        assert blame.top == LOSS_OR_FORWARD and blame.evidence[LOSS_OR_FORWARD] == FROM_EVERY_MODULE
        assert "4" not in blame.origins  # the last Linear, first in backward order, is no origin
    text = str(insp.summary())
    assert "the forward pass or the loss (2 of 2 poisoned steps; every module's gradients held NaN/Inf" in text
    assert "closest to the output in backward order" not in text
    out = cli_output("summary", str(log))
    assert "where the NaN/Inf of poisoned steps started" in out and "the forward pass or the loss" in out
    assert "modules behind poisoned steps" not in out  # counts are not blame
    # With the activation hooks armed, the finding names the module that made it.
    armed = _bf16_nan_run(tmp_path / "armed.jsonl", "forward", activations="always").summary().poisoned_blame
    assert armed.top == "2" and LOSS_OR_FORWARD not in armed.origins


def test_nan_made_in_the_last_modules_backward_is_still_traced_to_it(tmp_path: Path) -> None:
    log = tmp_path / "backward.jsonl"
    insp = _bf16_nan_run(log, "last_backward")
    for blame in (insp.summary().poisoned_blame, _log_summary(log).poisoned_blame):
        assert blame.top == "4" and blame.evidence["4"] == FROM_BACKWARD_ORDER
        assert LOSS_OR_FORWARD not in blame.origins


def test_a_step_report_says_the_same(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    insp = amp_inspect.attach(model, activations="off")
    model(torch.full((2, 4), float("nan"))).sum().backward()
    text = str(insp.check())
    assert f"NaN/Inf started in: {LOSS_OR_FORWARD}" in text and "closest to the output" not in text


# ---- spikes: "rose most" against the recent median, never a module whose norm fell ----


def test_a_spike_right_after_a_spike_names_modules_that_rose_not_fell() -> None:
    norms = [1.0, 1.0, 1.0, 1.0, 1000.0, 20.0]
    modules = [{"a": 1.0, "b": 0.1}] * 4 + [{"a": 1000.0, "b": 100.0}, {"a": 20.0, "b": 0.05}]
    spikes = find_spikes(list(range(6)), norms, modules)
    assert [s.step for s in spikes] == [4, 5]
    after = spikes[1]
    assert after.rose == [("a", 20.0)]  # against its median 1.0; "b" fell below its own median, so it did not rise
    assert all(ratio > 1 for s in spikes for _, ratio in s.rose)
    assert {m: round(r) for m, r in spikes[0].rose} == {"a": 1000, "b": 1000}


# ---- the doctor: no "train in bfloat16" to a bf16 run; an advice line split where it says what to do ----


def test_the_doctor_does_not_tell_a_bf16_run_to_train_in_bf16(tmp_path: Path) -> None:
    log = tmp_path / "armed.jsonl"
    _bf16_nan_run(log, "forward", activations="always")
    history = [StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)]
    fixes = [f.fix or "" for f in doctor(history=history).findings if f.code == "first-nonfinite"]
    assert fixes and not any("bfloat16" in fix for fix in fixes)
    fp16 = [StepRecord(**{**r.__dict__, "autocast": "fp16"}) for r in history]
    assert any("train in bfloat16" in (f.fix or "") for f in doctor(history=fp16).findings)


def test_an_advice_line_is_split_after_its_parentheses(tmp_path: Path) -> None:
    assert split_advice("3 steps (first: step 8) had NaN: guard the step") == (
        "3 steps (first: step 8) had NaN",
        "guard the step",
    )
    assert split_advice("no action here") == ("no action here", "")
    log = tmp_path / "forward.jsonl"
    _bf16_nan_run(log, "forward")
    history = [StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)]
    messages = [f.message for f in doctor(history=history).findings if f.code == "poisoned-steps"]
    assert any(m.startswith("2 steps (first: step 2) had NaN/Inf gradients") for m in messages), messages
    assert not any(m.endswith("(first") for m in messages)


# ---- the scale bouncing off one ceiling: the advice is growth_interval, not an init_scale that grows back ----


def _bouncing(hits: int) -> list[StepRecord]:
    """GradScaler at growth_interval 3: it grows from 2^20 to 2^21, overflows there and backs off, ``hits`` times."""
    history, step = [], 0
    for _ in range(hits):
        for _ in range(3):
            history.append(_step(step, 2.0**20, False))
            step += 1
        history.append(_step(step, 2.0**21, True))
        step += 1
    history.append(_step(step, 2.0**20, False))
    return history


def _step(step: int, scale: float, skipped: bool) -> StepRecord:
    return StepRecord(
        step, scale, skipped, ["head"] if skipped else [], float("nan") if skipped else 1.0, Headroom(None, None), None
    )


def test_a_scale_bouncing_off_one_ceiling_is_told_growth_interval_not_init_scale() -> None:
    advice = [a for a in summarize(_bouncing(4), growth_interval=3).advice if "keeps growing" in a]
    assert advice and "raise growth_interval (now 3)" in advice[0]
    assert "start at init_scale" not in advice[0]
    assert not [a for a in summarize(_bouncing(2), growth_interval=3).advice if "keeps growing" in a]


# ---- a clean run without a loss scaler: the report calls no loss scale healthy ----


def test_a_clean_run_without_a_scaler_is_not_told_its_loss_scale_looks_healthy() -> None:
    from amp_inspect.render import html_report, plots

    def page(scale: float | None) -> str:
        records = [{"step": s, "scale": scale, "skipped": False, "offenders": [], "total_norm": 1.0} for s in range(4)]
        summary = summarize([StepRecord.from_log_record(r) for r in records])
        return html_report.render_html(plots.RunSeries.from_records(records), summary, {}, source="run.jsonl")

    clean = page(None)
    assert "loss scale looks healthy" not in clean and "no NaN/Inf gradients and no gradient spikes" in clean
    assert "loss scale looks healthy" in page(65536.0)


def test_a_single_module_is_named_not_called_the_forward_pass() -> None:
    from amp_inspect.evidence.attribution import every_module

    counts = {"numel": 4, "nan": 4}
    assert not every_module(["only"], {"only": counts})  # one module: it is named
    assert every_module(["a", "b"], {"a": counts, "b": counts})
    assert not every_module(["a"], {"a": counts, "b": {"numel": 4, "nan": 0}})
    assert not every_module(["a"], {"a": counts, "b": {"numel": 0}}) and not every_module(["a", "b"], None)


def test_rose_most_takes_the_same_window_as_the_total_norm_past_nan_steps() -> None:
    # Steps 0-5 calm, 6-7 NaN (module norm unknown), 8-11 elevated; step 12 is a spike against the calm median.
    norms = [1.0] * 6 + [float("nan")] * 2 + [30.0] * 4 + [30.0]
    modules = [{"a": 1.0}] * 6 + [{"a": None}] * 2 + [{"a": 30.0}] * 5
    spike = next(s for s in find_spikes(list(range(13)), norms, modules) if s.step == 12)
    assert spike.median == 1.0 and spike.rose == [("a", 30.0)]  # both against the calm steps, not a half-window


# ---- the poisoned-step advice says what the tool can know; the doctor files it apart from loss-scaler advice ----


def _records(scale: float | None, poisoned: tuple[int, ...] = (), skipped: tuple[int, ...] = (), spike: int = -1):
    """12 log records: total norm 1.0, ``spike`` at 1000x; NaN/Inf gradients in "head" on the listed steps."""
    out = []
    for s in range(12):
        bad = s in poisoned or s in skipped
        norm = float("nan") if bad else 1000.0 if s == spike else 1.0
        out.append(
            {"step": s, "scale": scale, "skipped": s in skipped, "poisoned": s in poisoned, "total_norm": norm}
            | {"offenders": ["head"] if bad else []}
        )
    return [StepRecord.from_log_record(r) for r in out]


def test_poisoned_advice_does_not_claim_the_optimizer_applied_what_the_loop_may_skip(tmp_path: Path) -> None:
    log = tmp_path / "guarded.jsonl"
    _bf16_nan_run(log, "forward")  # the loop guards its steps: the tool cannot see that
    (line,) = [a for a in _log_summary(log).advice if "had NaN/Inf gradients" in a]
    assert "unless your loop skips them, the optimizer applied them" in line
    assert "skip them: the optimizer applied them" not in line
    assert "bf16 needs no loss scale, so find the source" in line  # a bf16 run (an fp32 one is told "Find")
    scaled = summarize(_records(65536.0, skipped=(4, 5)))  # a GradScaler skipped them: no poisoned-step advice
    assert scaled.poisoned == 0 and not scaled.poisoned_advice
    assert not any("optimizer applied" in a for a in scaled.advice)


def test_the_doctor_files_poisoned_steps_as_a_warning_and_spikes_apart_from_scaler_advice() -> None:
    poisoned = doctor(history=_records(None, poisoned=(4, 5))).findings
    (warning,) = [f for f in poisoned if f.code == "poisoned-steps"]
    assert warning.severity == "warning" and "2 steps (first: step 4) had NaN/Inf gradients" in warning.message
    assert "the weights may be NaN" in warning.fix and not any(f.code == "scaler-advice" for f in poisoned)
    assert not doctor(history=_records(None, poisoned=(4, 5))).ok  # a warning: the weights may be NaN
    # Typed where it rests on steps and modules (issue 29: filed by the advice's own fields, not its text).
    assert warning.steps == (4, 5) and warning.modules == ("head",)
    assert warning.to_json()["steps"] == [4, 5]

    spiked = doctor(history=_records(None, spike=10)).findings
    (spike,) = [f for f in spiked if f.code == "gradient-spikes"]
    assert spike.severity == "info" and "1 gradient spike" in spike.message and "step 10" in spike.message
    assert spike.steps == (10,)
    assert not any(f.code in ("scaler-advice", "poisoned-steps") for f in spiked)

    clean = codes_of(doctor(history=_records(None)).findings)
    assert not clean & {"poisoned-steps", "gradient-spikes", "scaler-advice"}
    # With a GradScaler: skipped steps and a spike are the scaler's to handle, filed as scaler advice if at all.
    scaled = codes_of(doctor(history=_records(65536.0, skipped=(4, 5), spike=10)).findings)
    assert not scaled & {"poisoned-steps", "gradient-spikes"}


def codes_of(findings) -> set[str]:
    return {f.code for f in findings}


# ---- the loss-scale plot's caption: the saw-tooth only where there is a loss scale ----


def test_the_loss_scale_caption_explains_a_saw_tooth_only_where_a_loss_scale_exists() -> None:
    from amp_inspect.render import html_report, plots

    def caption(scale: float | None, poisoned: tuple[int, ...] = ()) -> str:
        records = [
            {"step": s, "scale": scale, "skipped": False, "poisoned": s in poisoned, "total_norm": 1.0}
            | {"offenders": ["head"] if s in poisoned else []}
            for s in range(4)
        ]
        summary = summarize([StepRecord.from_log_record(r) for r in records])
        page = html_report.render_html(
            plots.RunSeries.from_records(records), summary, {"loss_scale": b"png"}, source="run.jsonl"
        )
        section = page.split('<section id="loss_scale">', 1)[1].split("</section>", 1)[0]
        return section.split("<figcaption>", 1)[1].split("</figcaption>", 1)[0]

    for without in (caption(None), caption(None, poisoned=(2,))):
        assert "saw-tooth" not in without and without.startswith("This run has no loss scale")
    assert "poisoned" in caption(None, poisoned=(2,)) and "poisoned" not in caption(None)
    scaled = caption(65536.0)
    assert "saw-tooth" in scaled and "no loss scale" not in scaled
