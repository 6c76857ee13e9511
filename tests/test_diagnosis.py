"""Issue 16: a diagnosis a user can act on. Each numbered case of the issue has a test here that failed before the
fix; each verdict is tested on a run where it must appear and on one where it must not.

Small models and few steps (CPU, one thread); transformers' GPT-2 from a tiny config (no download) and peft where
the case came from them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.diagnosis.doctor import doctor
from amp_inspect.diagnosis.history import StepRecord, collapse_warning, stable_recommended_scale, summarize
from amp_inspect.evidence.attribution import FROM_ACTIVATIONS, FROM_BACKWARD_ORDER, blame, origin_in_order
from amp_inspect.evidence.headroom import Headroom
from amp_inspect.evidence.spikes import SPIKE_FACTOR, find_spikes
from amp_inspect.scaling.policies import NONFINITE_NOT_FROM_SCALE, ScaleDecision
from tests.models import cli_output

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def record(step: int, scale: float | None, skipped: bool, offenders=(), **kw) -> StepRecord:
    defaults = {"total_norm": math.nan if skipped else 1.0, "headroom": Headroom(None, None)}
    defaults["recommended_scale"] = None
    return StepRecord(step, scale, skipped, list(offenders), **{**defaults, **kw})


# ---- case 1 and 2: the NaN started in transformer.h.1.mlp.c_fc (GPT-2), not in the first module listed ----


def _gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    config.bos_token_id = config.eos_token_id = 0
    return transformers.GPT2LMHeadModel(config)


def _gpt2_run(tmp_path: Path, activations: str, steps: int = 6):
    """GPT-2 whose h.1.mlp.c_fc weight is x1e4: GELU's cube overflows in fp16's backward, NaN from there on."""
    model = _gpt2()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(1e4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    log = tmp_path / f"{activations}.jsonl"
    insp = amp_inspect.attach(model, scaler, activations=activations, log=log)
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the collapse warning, tested below
        for _ in range(steps):
            x = torch.randint(0, 64, (2, 16), generator=g)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x, labels=x).loss
            scaler.scale(loss).backward()
            insp.check()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    insp.close()
    return insp, log


@pytest.fixture(scope="module")
def gpt2_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt2")
    return {mode: _gpt2_run(tmp, mode) for mode in ("off", "on_skip")}


def test_case1_blame_names_the_module_closest_to_the_output_not_the_first_listed(gpt2_runs) -> None:
    insp, log = gpt2_runs["off"]
    history = insp.history
    assert all(r.skipped for r in history)
    # Every module upstream holds as many NaN as the source: the count order cannot tell them apart.
    assert history[-1].offenders[0] == "transformer.h.0.mlp.c_fc"
    summary = insp.summary()
    assert summary.top_offender == "transformer.h.1.mlp.c_fc"
    assert summary.blame.evidence["transformer.h.1.mlp.c_fc"] == FROM_BACKWARD_ORDER
    text = str(summary)
    assert "where the NaN/Inf started: transformer.h.1.mlp.c_fc" in text
    assert "upstream received the NaN/Inf" in text
    assert "skipped steps with NaN/Inf in these modules' gradients" in text  # the counts say what they count
    warning = collapse_warning(history, insp.collapse_skips)
    assert warning is not None and "started in transformer.h.1.mlp.c_fc" in warning
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["nonfinite_origin"] for r in records} == {"transformer.h.1.mlp.c_fc"}
    out = cli_output("summary", str(log))
    assert "where the NaN/Inf started: transformer.h.1.mlp.c_fc" in out
    assert "skipped steps with NaN/Inf in this module's gradients" in out


def test_case1_html_and_plots_take_the_same_top_offender(gpt2_runs, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from amp_inspect.render.series import RunSeries

    _, log = gpt2_runs["off"]
    records = amp_inspect.read_log(log)
    series = RunSeries.from_records(records)
    assert series.blame().top == "transformer.h.1.mlp.c_fc"
    assert series.origin(0) == ("transformer.h.1.mlp.c_fc", FROM_BACKWARD_ORDER)
    from amp_inspect.render.html_report import write_report

    page = write_report(log, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Where the NaN/Inf of skipped steps started" in page
    assert "skipped steps it caused" not in page
    assert "skipped steps with NaN/Inf in this module&#39;s gradients" in page


def test_case2_first_nonfinite_leads_the_summary_and_the_doctor(gpt2_runs) -> None:
    insp, log = gpt2_runs["on_skip"]
    summary = insp.summary()
    assert summary.first_nonfinite, "the hooks armed after the first skip found the producer"
    lines = str(summary).splitlines()
    assert lines[1].startswith("first non-finite producer (activation hooks): transformer.h.1.mlp.c_fc")
    assert summary.blame.evidence["transformer.h.1.mlp.c_fc"] == FROM_ACTIVATIONS
    history = [StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)]
    report = doctor(history=history)
    assert report.findings[0].code in ("first-nonfinite", "scale-collapse")
    assert any(f.code == "first-nonfinite" and "transformer.h.1.mlp.c_fc" in f.message for f in report.findings)
    assert not any("activations='always'" in (f.fix or "") for f in report.findings)  # the log holds the answer
    out = cli_output("summary", str(log))
    assert out.splitlines()[1].startswith("first non-finite producer (activation hooks)")


def test_case2_without_a_finding_the_doctor_says_how_to_get_one(gpt2_runs) -> None:
    _, log = gpt2_runs["off"]
    history = [StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)]
    report = doctor(history=history)
    assert not any(f.code == "first-nonfinite" for f in report.findings)
    assert any("activations='always'" in (f.fix or "") for f in report.findings)


def test_blame_ties_and_order_are_said() -> None:
    assert origin_in_order(["a", "b", "c"], ["c", "b", "a"]) == "c"
    assert origin_in_order(["a", "x"], ["b", "a"]) == "a"  # modules missing from the order come after
    tied = blame([(["a", "b"], None, "a"), (["a", "b"], None, "b")])
    assert tied.tied() == ["a", "b"] and "2 modules tied" in tied.describe()
    single = blame([(["a", "b", "c"], None, "a")])
    assert "2 more modules upstream received" in single.describe() and "tied" not in single.describe()


# ---- case 3: peft LoRA: the adapter that made the NaN is named ----


def test_case3_peft_lora_finding_names_the_adapter_that_made_it() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=4, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True))
    with torch.no_grad():
        model.base_model.model.transformer.h[0].attn.c_proj.lora_B["default"].weight.fill_(30.0)
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler, activations="always")
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    found = []
    for _ in range(3):
        x = torch.randint(0, 64, (2, 16), generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(input_ids=x, labels=x).loss
        scaler.scale(loss).backward()
        report = insp.check()
        found.append(report.first_nonfinite)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    insp.detach()
    findings = [f for f in found if f]
    assert findings, found
    assert all("made in the backward of transformer.h.0.attn.c_proj.lora_B.default" in f for f in findings)


# ---- case 4: the loss gradient is not an activation ----


class LossInside(nn.Module):
    """A wrapper that computes the loss in a child module (as a LightningModule or an HF model with labels= do)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        self.loss = _Loss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.net(x), y)


class _Loss(nn.Module):
    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out.float(), y)


def test_case4_the_loss_scale_reaching_a_child_module_is_not_an_fp16_overflow() -> None:
    torch.manual_seed(0)
    model = LossInside()
    scaler = torch.amp.GradScaler("cpu")  # init_scale 65536 >= 65520: fp16 cannot hold it
    insp = amp_inspect.attach(model, scaler, activations="always")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    reports = []
    for _ in range(3):
        # A mean over 256 values: the gradient reaching the fp16 output is the scale / 128, inside fp16's range.
        x, y = torch.randn(256, 8), torch.randn(256, 1)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)
        scaler.scale(loss).backward()
        reports.append(insp.check())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    insp.detach()
    assert not any(r.skipped for r in reports)
    assert [r.first_nonfinite for r in reports] == [None, None, None]


def test_case4_an_fp16_output_gradient_that_overflows_is_still_found() -> None:
    from amp_inspect.probes.activations import ActivationWatcher

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).half()
    with torch.no_grad():
        model[1].weight.fill_(3e4)
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(0):
        (model(torch.randn(2, 4, dtype=torch.float16)).float().sum() * 4.0).backward()
    finding = watcher.first_finding()
    assert finding is not None and finding.module == "0" and finding.made_by == "1"


# ---- case 5: "collapse" only when the scale fell and stayed down ----


def _decision(scale: float, previous: float, reason: str = "headroom", skip: str | None = None) -> ScaleDecision:
    return ScaleDecision(scale, previous, reason, skip, 2, None, None)


def test_case5_skips_in_a_row_at_a_held_scale_are_not_a_collapse() -> None:
    held = [record(i, 65536.0, True, ["fc"], scale_decision=_decision(65536.0, 65536.0)) for i in range(6)]
    message = collapse_warning(held, 5)
    assert message is not None and not message.startswith("loss scale collapse")
    assert "6 skipped steps in a row" in message and "at loss scale 65536" in message
    assert "loss scale collapse" not in str(summarize(held))
    falling = [record(i, 65536.0 / 2**i, True, ["fc"]) for i in range(6)]
    message = collapse_warning(falling, 5)
    assert message is not None and message.startswith("loss scale collapse") and "stayed down" in message


def test_case5_a_policys_own_scale_below_1_is_not_a_collapse() -> None:
    chosen = [record(i, 2.0**-6, False, scale_decision=_decision(2.0**-6, 2.0**-6)) for i in range(4)]
    assert collapse_warning(chosen, 5) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not summarize(chosen).warnings
    under_gradscaler = [record(i, 2.0**-i, False) for i in range(4)]  # GradScaler only gets there by falling
    assert collapse_warning(under_gradscaler, 5).startswith("loss scale collapse")


# ---- case 6: no backoff advice for NaN that the scale did not cause ----


def test_case6_nan_that_did_not_follow_the_scale_gets_no_backoff_advice() -> None:
    stuck = [record(i, 65536.0 / 2**i, True, ["fc"]) for i in range(16)]  # 65536 down to 2, NaN throughout
    advice = summarize(stuck, backoff_factor=0.5).advice
    assert not any("backoff_factor" in a for a in advice), advice
    assert any("did not follow the loss scale" in a for a in advice)
    report = doctor(history=stuck)
    assert not any("backoff_factor" in f.message + (f.fix or "") for f in report.findings if f.code == "scaler-advice")
    cured = [record(0, 1024.0, False)] + [record(i, 1024.0 / 2**i, True, ["fc"]) for i in range(1, 5)]
    cured += [record(5, 32.0, False)]
    advice = summarize(cured, backoff_factor=0.5).advice
    assert any("backoff_factor" in a for a in advice) and not any("did not follow" in a for a in advice)


# ---- case 7: a bf16 run with no scaler gets no loss-scale advice, and formats follows bf16 ----


def _bf16_run(steps: int = 20, spike_at: int | None = None, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    insp = amp_inspect.attach(model, **options)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        if step == spike_at:
            loss = loss * 1e5
        loss.backward()
        insp.check()
        opt.step()
        opt.zero_grad()
    return insp


GRADSCALER_WORDS = ("init_scale", "growth_interval", "backoff_factor", "balance overflow", "halvings from underflow")


def test_case7_bf16_without_a_scaler_gets_no_loss_scale_advice_and_judges_bf16(tmp_path: Path) -> None:
    insp = _bf16_run(log=tmp_path / "bf16.jsonl")
    insp.close()
    assert insp.formats[0] == "bf16"
    summary = insp.summary()
    assert summary.autocast == "bf16" and not summary.scaler
    assert not [a for a in summary.advice if any(w in a for w in GRADSCALER_WORDS)], summary.advice
    assert "autocast bf16, loss scaler: none" in str(summary)
    records = amp_inspect.read_log(tmp_path / "bf16.jsonl")
    assert {r["autocast"] for r in records} == {"bf16"} and {r["formats"][0] for r in records} == {"bf16"}
    explicit = _bf16_run(steps=2, formats=("fp16",))
    assert explicit.formats == ("fp16",)  # formats given by the user stay


def test_case7_an_fp16_run_with_a_scaler_still_gets_the_balance_line() -> None:
    history = [
        record(i, 1024.0, False, headroom=Headroom(6, 8), recommended_scale=2.0**11, fmt="fp16", autocast="fp16")
        for i in range(5)
    ]
    advice = summarize(history).advice
    assert any("balance overflow and underflow margins at a scale of 2^11" in a for a in advice)
    bf16 = [StepRecord(**{**r.__dict__, "autocast": "bf16", "fmt": "bf16"}) for r in history]
    assert not any("balance" in a or "underflow" in a for a in summarize(bf16).advice)


# ---- case 8: spikes, and advice that points only at findings that exist ----


def test_case8_a_bf16_loss_spike_is_reported_with_its_modules() -> None:
    insp = _bf16_run(spike_at=15)
    summary = insp.summary()
    # The spike itself; steps after it may be spikes too (the optimizer took the whole step: no scaler skips it).
    assert summary.spikes and summary.spikes[0].step == 15
    spike = summary.spikes[0]
    assert spike.factor > SPIKE_FACTOR and spike.rose  # the modules whose norm rose most are named
    assert "gradient spike at step 15" in str(summary)
    assert not _bf16_run().summary().spikes


def test_spikes_follow_the_recent_median_not_one_earlier_spike() -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 50.0, 1.0, 60.0, 1.1]
    assert [s.step for s in find_spikes(list(range(8)), norms)] == [4, 6]
    assert not find_spikes(list(range(6)), [1.0, 2.0, 3.0, 2.5, 5.0, 4.0])  # noise of a few x is none


def test_case8_innocent_nan_advice_points_at_a_finding_only_when_there_is_one() -> None:
    decision = _decision(65536.0, 65536.0, NONFINITE_NOT_FROM_SCALE, "nonfinite")
    history = [record(i, 65536.0, False, scale_decision=_decision(65536.0, 65536.0)) for i in range(5)]
    history.insert(3, record(3, 65536.0, True, ["fc"], scale_decision=decision))
    history = [StepRecord(**{**r.__dict__, "step": i}) for i, r in enumerate(history)]
    (advice,) = [a for a in summarize(history).advice if "do not explain" in a]
    assert "first_nonfinite finding" not in advice and "activations='on_skip'" in advice
    assert "one-off" in advice  # a single step, clean after it at the same scale
    found = [
        StepRecord(**{**r.__dict__, "first_nonfinite": "fc: forward output went non-finite (3 NaN/Inf), step 3"})
        if r.skipped
        else r
        for r in history
    ]
    (advice,) = [a for a in summarize(found).advice if "do not explain" in a]
    assert "the activation hooks name it: fc: forward output went non-finite" in advice


# ---- case 9: one recommendation, stable ----


def test_case9_the_recommended_scale_is_a_median_not_one_steps_smallest_gradient() -> None:
    jumping = [record(i, 1024.0, False, recommended_scale=2.0 ** (14 if i % 2 else 17)) for i in range(9)]
    median, n = stable_recommended_scale(jumping)
    assert n == 9 and median == 2.0**17
    steady = [record(i, 1024.0, False, recommended_scale=2.0**14) for i in range(4)]
    assert stable_recommended_scale(steady) == (2.0**14, 4)


def test_case9_a_report_under_a_policy_shows_only_the_policys_next_scale() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    insp = amp_inspect.attach(model, scaler)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(2, 4)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    report = insp.last_report
    insp.detach()
    text = str(report)
    assert "next loss scale" in text and "recommended scale" not in text
    plain = amp_inspect.attach(nn.Linear(4, 4), torch.amp.GradScaler("cpu"))
    layer = plain.model
    with torch.autocast("cpu", dtype=torch.float16):
        layer(torch.randn(2, 4)).float().sum().backward()
    assert "recommended scale 2^" in str(plain.check())
    plain.detach()


# ---- case 13: unknown is unknown; the doctor's lines ----


def test_case13_an_all_nan_module_shows_unknown_amax_and_norm() -> None:
    from amp_inspect.render.console import module_rows

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    insp = amp_inspect.attach(model, torch.amp.GradScaler("cpu"))
    model(torch.randn(2, 4)).sum().backward()
    model[0].weight.grad.fill_(math.nan)
    model[0].bias.grad.fill_(math.nan)
    report = insp.check()
    insp.detach()
    m = report.by_module["0"]
    assert math.isnan(m["amax"]) and math.isnan(m["grad_norm"])
    assert not math.isnan(report.by_module["1"]["amax"])
    line = next(line for line in str(report).splitlines() if line.startswith("0 "))
    assert line.split()[-2:] == ["unknown", "unknown"]
    shown = module_rows(report.by_module)[0][-2:]
    assert all(math.isnan(x) for x in shown)  # rendered "unknown" (console._fmt)


def test_case13_the_cpu_line_does_not_say_cpu_autocast_is_bf16_only() -> None:
    from amp_inspect.diagnosis.environment_checks import gpus

    for finding in gpus():
        if finding.code == "no-gpu":
            assert "fp16 when asked" in finding.message


def test_case13_a_run_log_left_open_is_closed_at_exit(tmp_path: Path) -> None:
    script = (
        "import torch, amp_inspect\n"
        "m = torch.nn.Linear(2, 2)\n"
        f"insp = amp_inspect.attach(m, log={str(tmp_path / 'run.jsonl')!r})\n"
        "m(torch.ones(1, 2)).sum().backward()\n"
        "insp.check()\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "ResourceWarning" not in result.stderr
    assert (tmp_path / "run.jsonl").read_text().count("\n") >= 1


def test_case4_lightning_loss_module_output_gradient_is_not_judged_against_fp16(tmp_path: Path) -> None:
    """Lightning with fp16 AMP on the CPU (GradScaler at its default init_scale 65536) and the loss computed by a
    child module: its output gradient is the loss scale, in fp32. Before the fix every clean step reported
    "loss: output gradient overflowed fp16, amax 6.6e+04"."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.plugins.precision import MixedPrecision

    from amp_inspect.integrations.lightning import AmpInspectCallback

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
            self.loss = _Loss()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=256)
    cb = AmpInspectCallback(activations="always")
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=3,
        callbacks=[cb],
        plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=tmp_path,
    )
    torch.manual_seed(0)
    module = Lit()
    trainer.fit(module, data)
    history = cb.inspector.history
    assert len(history) == 3 and not any(r.skipped for r in history)
    found = [r.first_nonfinite for r in history]
    assert found == [None, None, None], found
