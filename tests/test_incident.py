"""Issue 29: one incident story across steps. A NaN applied once poisons the weights; the weight watch reads them
after NaN/Inf gradients (probes/weight_watch.py) and the timeline (diagnosis/incident.py) tells the poisoning once:
when, by which step, from where; the later steps are consequences, never new origins. Each verdict is tested on a
run where it must appear and on its healthy neighbour, on transformers' GPT-2 (a tiny config, no download)."""

from __future__ import annotations

import importlib.util
import math
import re
import warnings
from pathlib import Path

import pytest
import torch

import amp_inspect
from amp_inspect.diagnosis.history import StepRecord, summarize
from amp_inspect.diagnosis.incident import APPLIED_NONFINITE, OPTIMIZER_STEP, UNKNOWN, weight_poisoning
from amp_inspect.evidence.headroom import Headroom
from amp_inspect.evidence.weights import WeightsSeen
from tests.models import cli_output

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PLANTED_AT = 10
STEPS = 14
SOURCE = "transformer.h.1.mlp.c_fc"


def _gpt2(dtype: torch.dtype = torch.float32):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(config).to(dtype)


def _bf16_run(tmp_path: Path, plant: bool, **options):
    """bf16 autocast, no scaler (the 2026 default), AdamW; with ``plant``, one NaN in h.1.mlp.c_fc's weight
    gradient on step PLANTED_AT only: the optimizer applies it and the weights are NaN from step PLANTED_AT + 1."""
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log = tmp_path / f"bf16-{plant}.jsonl"
    insp = amp_inspect.attach(model, log=log, **options)
    reports = []
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        x = torch.randint(0, 64, (2, 16), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        if plant and step == PLANTED_AT:
            model.transformer.h[1].mlp.c_fc.weight.grad[0, 0] = math.nan
        reports.append(insp.check())
        opt.step()
        opt.zero_grad()
    insp.close()
    return insp, reports, log


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("incident")
    return {plant: _bf16_run(tmp, plant) for plant in (True, False)}


def test_the_poisoned_bf16_run_names_the_source_and_the_poisoning_on_the_summary(bf16_runs) -> None:
    insp, _, _ = bf16_runs[True]
    poisoning = insp.weights_poisoned()
    assert poisoning is not None
    assert (poisoning.cause, poisoning.by_step, poisoning.since) == (APPLIED_NONFINITE, PLANTED_AT, PLANTED_AT + 1)
    assert poisoning.exact and poisoning.origin == SOURCE
    assert list(poisoning.first_read.nonfinite) == [SOURCE]  # one planted element: one module's weights at first
    assert poisoning.consequences == tuple(range(PLANTED_AT + 1, STEPS))
    summary = insp.summary()
    text = str(summary)
    assert f"the weights became NaN/Inf at step {PLANTED_AT + 1}" in text
    assert f"step {PLANTED_AT}'s NaN/Inf gradients" in text and SOURCE in text
    # The consequences name no origin of their own: not the embedding, not "the forward pass or the loss".
    assert summary.top_offender == SOURCE
    assert "transformer.wte" not in text and "the forward pass or the loss" not in text
    assert summary.first_nonfinite == {}  # the hooks' findings of steps 11+ are consequences too


def test_every_surface_tells_the_same_poisoning(bf16_runs, tmp_path: Path) -> None:
    insp, _, log = bf16_runs[True]
    live = insp.doctor()
    assert live.findings[0].code == "weights-poisoned" and live.findings[0].severity == "error"
    assert not live.ok and "transformer.wte" not in str(live)
    from_log = cli_output("doctor", "--log", str(log))
    assert "[weights-poisoned]" in from_log and f"at step {PLANTED_AT + 1}" in from_log
    assert "transformer.wte" not in from_log
    summary = cli_output("summary", str(log))
    assert f"the weights became NaN/Inf at step {PLANTED_AT + 1}" in summary and SOURCE in summary
    assert "started in transformer.wte" not in summary
    logged = summarize([StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)])
    assert logged.weights == insp.summary().weights  # the log tells the live run's story, field for field
    if importlib.util.find_spec("matplotlib") is not None:
        from amp_inspect.render.html_report import write_report

        page = write_report(log, tmp_path / "report.html").read_text(encoding="utf-8")
        assert f"the weights became NaN/Inf at step {PLANTED_AT + 1}" in page
        assert "transformer.wte" not in page.split("Offenders")[0]  # no origin of its own before the counts


def test_a_poisoned_step_report_says_its_nan_comes_from_the_weights_once(bf16_runs) -> None:
    _, reports, _ = bf16_runs[True]
    planted = str(reports[PLANTED_AT])
    assert f"weights going into step {PLANTED_AT}: all finite" in planted
    assert planted.count("NaN/Inf started in:") == 1 and f"NaN/Inf started in: {SOURCE} (" in planted
    after = str(reports[PLANTED_AT + 1])
    assert after.count("NaN/Inf started in:") == 1
    assert "NaN/Inf started in: the weights, NaN/Inf before this step's forward pass" in after
    assert f"in the parameters of 1 module ({SOURCE})" in after
    assert "its weights were NaN/Inf going into this step" in after  # the hooks' finding, explained
    assert "recommended scale" not in after and "recommended scale" not in str(reports[0])  # no scaler acts


def test_the_healthy_neighbour_reads_no_weights_and_finds_nothing(bf16_runs) -> None:
    insp, reports, log = bf16_runs[False]
    assert all(r.weights is None for r in reports)  # healthy steps never pay for the read
    assert insp.weights_poisoned() is None and insp.checkpoint_warning() is None
    assert insp.summary().weights is None and "became NaN/Inf" not in str(insp.summary())
    assert "weights-poisoned" not in insp.doctor().codes
    assert all("weights" not in r for r in amp_inspect.read_log(log))


def test_an_fp16_adam_step_that_overflowed_is_the_cause_not_the_embedding() -> None:
    """model.half() with Adam (eps 1e-8 is 0 in fp16): step 0's gradients are finite and its optimizer step makes
    weights Inf; every later step is NaN. The story names that optimizer step."""
    model = _gpt2(torch.float16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randint(0, 64, (2, 16), generator=g)
        model(x, labels=x).loss.backward()
        insp.check()
        opt.step()
        opt.zero_grad()
    poisoning = insp.weights_poisoned()
    assert poisoning is not None and (poisoning.cause, poisoning.by_step, poisoning.since) == (OPTIMIZER_STEP, 0, 1)
    text = str(insp.summary())
    assert "step 0's gradients were finite, so its optimizer step itself made them" in text
    assert "started in transformer.wte" not in text and "the forward pass or the loss" not in text
    codes = insp.doctor().codes
    assert {"weights-poisoned", "optimizer-made-nonfinite"} <= set(codes)
    assert "update-ratio" not in codes  # LayerNorm weights gone to NaN/Inf are not "not training"


def test_a_checkpoint_of_poisoned_weights_is_warned_about(bf16_runs) -> None:
    from types import SimpleNamespace

    from amp_inspect.integrations._common import PoisonedCheckpointWarning
    from amp_inspect.integrations.hf import AmpInspectTrainerCallback

    insp, _, _ = bf16_runs[True]
    message = insp.checkpoint_warning()
    assert message is not None and f"at step {PLANTED_AT + 1}" in message and SOURCE in message
    callback = AmpInspectTrainerCallback()
    callback.inspector = insp
    with pytest.warns(PoisonedCheckpointWarning, match=f"the checkpoint of step 13: .*NaN/Inf.*{SOURCE}"):
        callback.on_save(None, SimpleNamespace(global_step=13), None)
    healthy, _, _ = _bf16_run_short()
    callback.inspector = healthy
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoisonedCheckpointWarning)
        callback.on_save(None, SimpleNamespace(global_step=2), None)


def _bf16_run_short():
    model = _gpt2()
    insp = amp_inspect.attach(model)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, labels=x).loss.backward()
    insp.check()
    return insp, None, None


def test_callbacks_follow_the_trainers_autocast_unless_formats_are_given() -> None:
    from amp_inspect.inspection.options import AttachOptions
    from amp_inspect.integrations._common import attach_kwargs

    assert "formats" not in attach_kwargs(AttachOptions(), None, given=())
    assert attach_kwargs(AttachOptions(formats=("fp16",)), None, given={"formats"})["formats"] == ("fp16",)


# ---- the timeline on hand-made histories: what it knows and what it does not ----


def _record(step: int, *, bad: bool = False, skipped: bool = False, weights: WeightsSeen | None = None) -> StepRecord:
    return StepRecord(
        step,
        None,
        skipped,
        ["a", "b"] if bad else [],
        total_norm=math.nan if bad else 1.0,
        headroom=Headroom(None, None),
        recommended_scale=None,
        poisoned=bad and not skipped,
        nonfinite_origin="a" if bad else None,
        weights=weights,
    )


def test_the_timeline_needs_a_read_that_found_them() -> None:
    history = [_record(0), _record(1, bad=True, weights=WeightsSeen(1)), _record(2)]
    assert weight_poisoning(history) is None  # a NaN step whose weights stayed finite: no poisoning


def test_the_timeline_does_not_guess_across_uninspected_steps() -> None:
    # every=2: steps 1 and 3 were not inspected, so which optimizer step made the weights NaN is not known.
    history = [_record(0), _record(2, bad=True), _record(4, bad=True, weights=WeightsSeen(4, {"a": 3}))]
    poisoning = weight_poisoning(history)
    assert poisoning is not None and poisoning.cause == UNKNOWN and not poisoning.exact
    assert poisoning.since == 4 and poisoning.finite_until == 0
    assert "by step 4" in poisoning.headline() and "not known" in poisoning.headline()


def test_skipped_steps_change_no_weight_and_a_restored_checkpoint_ends_the_poisoning() -> None:
    history = [
        _record(0),
        _record(1),  # its optimizer step made them (the only one that ran before the first bad read)
        _record(2, bad=True, skipped=True, weights=WeightsSeen(2, {"b": 1})),
        _record(3, bad=True, skipped=True, weights=WeightsSeen(3, {"b": 1})),
        _record(4, weights=WeightsSeen(5)),  # restored: read finite going into step 5
        _record(5),
        _record(6, bad=True, skipped=True),  # a new NaN after the restore: an origin again
    ]
    poisoning = weight_poisoning(history)
    assert (poisoning.cause, poisoning.by_step, poisoning.since) == (OPTIMIZER_STEP, 1, 2)
    assert poisoning.consequences == (2, 3)
    assert summarize(history).blame.steps == 1  # step 6 alone is traced to a module


def test_the_live_doctor_judges_the_autocast_dtype_the_run_used() -> None:
    """A GradScaler in a bf16 run: insp.doctor() says so as amp_inspect.doctor(..., autocast_dtype=bf16) does, and
    the fp16 neighbour (where the scaler belongs) hears nothing of it."""
    from torch import nn

    codes = {}
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        insp = amp_inspect.attach(model, scaler)
        for _ in range(3):
            with torch.autocast("cpu", dtype=dtype):
                loss = model(torch.randn(4, 8)).float().sum()
            scaler.scale(loss).backward()
            insp.check()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        live = insp.doctor().codes
        given = amp_inspect.doctor(model, opt, scaler, autocast_dtype=dtype, history=insp.history).codes
        assert ("scaler-with-bf16" in live) == ("scaler-with-bf16" in given)
        codes[dtype] = live
    assert "scaler-with-bf16" in codes[torch.bfloat16] and "scaler-with-bf16" not in codes[torch.float16]


def test_findings_for_machines_are_one_json_document(bf16_runs) -> None:
    import json

    _, _, log = bf16_runs[True]
    document = json.loads(cli_output("summary", "--json", str(log)))
    assert document["schema"] == "amp_inspect.findings/1" and document["ok"] is False
    assert document["weights_poisoned"]["since"] == PLANTED_AT + 1
    assert document["weights_poisoned"]["cause"] == APPLIED_NONFINITE
    assert document["top_offender"] == SOURCE
    first = document["findings"][0]
    assert first["code"] == "weights-poisoned" and first["severity"] == "error"
    assert first["steps"] == [PLANTED_AT, PLANTED_AT + 1] and first["modules"][0] == SOURCE
    assert first["evidence"]["by_step"] == PLANTED_AT and first["action"]
    doctor = json.loads(cli_output("doctor", "--json", "--log", str(log)))
    assert doctor["schema"] == document["schema"] and doctor["header"][0].startswith("environment: torch")
    assert [f for f in doctor["findings"] if f["code"] == "weights-poisoned"] == [first]
    _, _, healthy = bf16_runs[False]
    calm = json.loads(cli_output("summary", "--json", str(healthy)))
    assert calm["weights_poisoned"] is None and "weights-poisoned" not in {f["code"] for f in calm["findings"]}


def test_a_module_whose_forward_is_bypassed_is_not_measured_never_ready() -> None:
    """nn.MultiheadAttention hands out_proj's weight to F.multi_head_attention_forward: out_proj is never called,
    so only its dW is seen. Its readiness is "not measured" for every recipe; a Linear beside it is judged."""
    from torch import nn

    from amp_inspect.readiness.report import NOT_MEASURED, READY

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.attn(x, x, x)[0])

    torch.manual_seed(0)
    model = Attention()
    insp = amp_inspect.attach(model, readiness_every=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 8, 16)).float().sum().backward()
    insp.check()
    report = insp.readiness()
    assert list(report.modules["attn.out_proj"]) == ["dW"]
    assert {report.verdict("attn.out_proj", r).level for r in report.recipes} == {NOT_MEASURED}
    assert report.verdict("fc", "fp8_e4m3_tensor").level == READY
    assert all(counts[READY] <= 1 for counts in report.ready_counts().values())  # out_proj is never counted ready
    insp.detach()


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_is_measured_once(reentrant: bool) -> None:
    """A checkpointed block's forward runs again in backward: its X, W and dY are counted once, as without
    checkpointing (reentrant checkpointing runs the first forward without grad: its recomputation is the one seen)."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self, ckpt: bool) -> None:
            super().__init__()
            self.a, self.b, self.ckpt = nn.Linear(16, 16), nn.Linear(16, 16), ckpt

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = checkpoint(self.a, x, use_reentrant=reentrant) if self.ckpt else self.a(x)
            return self.b(torch.relu(h))

    seen = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = Block(ckpt)
        insp = amp_inspect.attach(model, readiness_every=1)
        model(torch.randn(4, 16, requires_grad=reentrant)).sum().backward()
        insp.check()
        seen[ckpt] = {
            (m, op): (s.nonzero, s.sq_signal) for m, ops in insp.readiness().modules.items() for op, s in ops.items()
        }
        insp.detach()
    assert seen[True] == seen[False] and ("a", "X") in seen[True]


def test_a_spike_in_a_loop_that_clips_is_not_told_to_clip() -> None:
    """No scaler, one gradient spike: the advice says to clip only where the loop does not clip already (the HF
    Trainer's max_grad_norm, Lightning's gradient_clip_val, insp.clip_grad_norm_), and says the step was clipped."""
    norms = [1.0, 1.1, 0.9, 1.0, 1.2, 40.0, 1.0]

    def history(clip: float | None) -> list[StepRecord]:
        return [
            StepRecord(
                i, None, False, [], total_norm=n, headroom=Headroom(None, None), recommended_scale=None, clip_norm=clip
            )
            for i, n in enumerate(norms)
        ]

    plain, clipped = summarize(history(None)).spike_advice, summarize(history(1.0)).spike_advice
    assert "first: step 5" in plain and "or clip the gradient norm" in plain
    assert "the loop clips the gradient norm to 1, so the optimizer took a clipped step" in clipped
    assert "or clip the gradient norm" not in clipped


def test_one_report_names_one_origin() -> None:
    """GPT-2 whose h.1.mlp.c_fc overflows fp16 (weight x1e4) under a GradScaler, the activation hooks on: the printed
    report's "NaN/Inf started in" names the module of its "first non-finite producer", never another one (here
    both kinds of evidence agree; the test below has them disagree)."""
    import re

    model = _gpt2()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(1e4)
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler, activations="always")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    texts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x, labels=x).loss
            scaler.scale(loss).backward()
            texts.append(str(insp.check()))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    insp.detach()
    judged = [t for t in texts if "first non-finite producer" in t]
    assert judged
    for text in judged:
        producer = re.search(r"first non-finite producer: ([\w.]+):", text).group(1)
        origins = re.findall(r"NaN/Inf started in: ([\w. ]+?) \(", text)
        assert origins == [producer], text


def test_a_spike_names_the_same_modules_with_or_without_a_log(tmp_path: Path) -> None:
    """GPT-2, bf16, no scaler, the loss x1e5 on step 12: the spike's modules are judged against the same recent
    median whether or not log= keeps every step (it named another module before), and the log's summary agrees."""

    def run(log: Path | None):
        model = _gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        insp = amp_inspect.attach(model, log=log)
        g = torch.Generator().manual_seed(0)
        for step in range(16):
            x = torch.randint(0, 64, (2, 16), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            (loss * 1e5 if step == 12 else loss).backward()
            insp.check()
            opt.step()
            opt.zero_grad()
        insp.close()
        return [(s.step, [m for m, _ in s.rose]) for s in insp.summary().spikes]

    log = tmp_path / "spike.jsonl"
    without, with_log = run(None), run(log)
    assert without and without[0][0] == 12 and without[0][1]
    assert without == with_log
    from_log = summarize([StepRecord.from_log_record(r) for r in amp_inspect.read_log(log)]).spikes
    assert [(s.step, [m for m, _ in s.rose]) for s in from_log] == without


def test_one_origin_when_a_forward_overflow_reaches_every_gradient() -> None:
    """a -> b -> head, a's fp16 output overflows: the loss is NaN, every module's gradients hold NaN and the module
    closest to the output (head) is first in backward order. The report names a, the hooks' producer, once; it
    named head beside the hooks' "a" before."""
    import re

    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].weight.mul_(1e5)
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler, activations="always")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 8)).float().sum()
    scaler.scale(loss).backward()
    text = str(insp.check())
    insp.detach()
    assert re.search(r"first non-finite producer: 0: forward output", text), text
    assert re.findall(r"NaN/Inf started in: ([\w. ]+?) \(", text) == ["0"], text


def _fp16_overflow_run(overflow: bool):
    """fp16 autocast, no scaler, SGD, activation hooks always armed; with ``overflow``, h.1.mlp.c_fc's weight is
    scaled up by 2^20 before step PLANTED_AT: its fp16 matmul overflows to Inf from finite inputs, and the step's
    NaN/Inf gradients are applied."""
    model = _gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, activations="always")
    g = torch.Generator().manual_seed(0)
    for step in range(PLANTED_AT + 2):
        if overflow and step == PLANTED_AT:
            with torch.no_grad():
                model.transformer.h[1].mlp.c_fc.weight.mul_(2.0**20)
        x = torch.randint(0, 64, (2, 16), generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, labels=x).loss
        loss.backward()
        insp.check()
        opt.step()
        opt.zero_grad()
    insp.close()
    return insp


def test_a_forward_overflow_from_finite_inputs_is_called_an_overflow_of_that_module() -> None:
    insp = _fp16_overflow_run(overflow=True)
    report = insp.history[PLANTED_AT]
    assert report.first_nonfinite is not None
    assert report.first_nonfinite.startswith(f"{SOURCE}: forward output overflowed fp16 to Inf (")
    poisoning = insp.weights_poisoned()
    assert poisoning is not None and (poisoning.by_step, poisoning.origin) == (PLANTED_AT, SOURCE)
    assert poisoning.overflowed == "fp16"
    codes = {f.code: f for f in insp.doctor().findings}
    assert "no-grad-scaler" in codes  # fp16 without a scaler: said too
    finding = codes["weights-poisoned"]
    assert f"{SOURCE}'s forward output overflowed fp16 at step {PLANTED_AT}" in finding.fix
    assert "went non-finite" not in finding.fix
    # Its healthy neighbour: no finding, no overflow.
    healthy = _fp16_overflow_run(overflow=False)
    assert healthy.weights_poisoned() is None
    assert all(r.first_nonfinite is None for r in healthy.history)


def test_a_summary_reads_the_poisoning_once(bf16_runs, monkeypatch) -> None:
    """One timeline per summary: the blame, the findings, the collapse and skip-run lines judge by the same
    poisoning (a slice of the run is never judged by a poisoning of its own)."""
    import amp_inspect.diagnosis.history as history
    import amp_inspect.diagnosis.incident as incident

    insp, _, _ = bf16_runs[True]
    calls = []
    real = incident.weight_poisoning
    for module in (history, incident):
        monkeypatch.setattr(module, "weight_poisoning", lambda h: calls.append(len(h)) or real(h))
    summary = insp.summary()
    assert summary.weights is not None and calls == [STEPS]  # was 5 per summary


def _scenario_model(kind: str):
    """A tiny third-party model (no download), the module to plant the NaN in, and the name the tool gives it."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(
            vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0
        )
        model = transformers.T5ForConditionalGeneration(config)
        return model, model.encoder.block[0].layer[1].DenseReluDense.wi, "encoder.block.0.layer.1.DenseReluDense.wi"
    model = _gpt2()
    if kind == "lora":
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
        lora_a = model.base_model.model.transformer.h[0].attn.c_attn.lora_A["default"]
        return model, lora_a, "transformer.h.0.attn.c_attn.lora_A.default"
    return model, model.transformer.h[1].mlp.c_fc, SOURCE


@pytest.mark.parametrize("kind", ["t5", "lora", "compile"])
def test_the_poisoned_run_is_one_story_on_every_surface_of_third_party_models(kind: str, tmp_path: Path) -> None:
    """bf16, no scaler, AdamW, one NaN in a module's weight gradient on step 5 (T5, a peft LoRA adapter, GPT-2 under
    torch.compile): every surface names that module and steps 5 and 6, and no other origin; the healthy neighbour
    gets no NaN finding on any surface."""
    planted_at, steps = 5, 8

    def run(plant: bool):
        model, module, name = _scenario_model(kind)
        wrapped = torch.compile(model, backend="aot_eager") if kind == "compile" else model
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        log = tmp_path / f"{kind}-{plant}.jsonl"
        insp = amp_inspect.attach(wrapped, log=log)
        g = torch.Generator().manual_seed(0)
        for step in range(steps):
            x = torch.randint(0, 64, (2, 16), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = wrapped(input_ids=x, labels=x).loss
            loss.backward()
            if plant and step == planted_at:
                module.weight.grad.view(-1)[0] = math.nan
            insp.check()
            opt.step()
            opt.zero_grad()
        insp.detach()  # the hooks armed on the NaN step leave the compiled model (and dynamo's stance) with it
        return insp, log, name

    insp, log, name = run(plant=True)
    poisoning = insp.weights_poisoned()
    assert poisoning is not None
    assert (poisoning.by_step, poisoning.since, poisoning.origin) == (planted_at, planted_at + 1, name)
    story = f"the weights became NaN/Inf at step {planted_at + 1}: the optimizer applied step {planted_at}'s"
    surfaces = {
        "summary": str(insp.summary()),
        "doctor": str(insp.doctor()),
        "doctor --log": cli_output("doctor", "--log", str(log)),
        "summary CLI": cli_output("summary", str(log)),
    }
    for surface, text in surfaces.items():
        flat = " ".join(text.split())  # the doctor wraps its lines
        assert story in flat and name in flat, surface
        started = {m for m in re.findall(r"started in ([\w.]+)", flat)}
        assert started == {name}, (surface, started)
        assert "the forward pass or the loss" not in flat, surface
    assert insp.doctor().findings[0].code == "weights-poisoned"

    healthy, healthy_log, _ = run(plant=False)
    assert healthy.weights_poisoned() is None
    codes = {f.code for f in healthy.doctor().findings}
    assert not codes & {"weights-poisoned", "poisoned-steps", "first-nonfinite"}
    assert "NaN/Inf" not in cli_output("summary", str(healthy_log))


@pytest.mark.parametrize("plant", [True, False])
def test_lightning_with_a_nan_on_one_step_is_told_as_poisoned_weights(plant: bool) -> None:
    """Lightning's "16-mixed" on a CPU runs bf16 without a scaler; a NaN in one module's output on step 5 only: the
    optimizer applies it and the doctor says so (it said "no problems found" before, the summary "the forward pass
    or the loss" alone). Its neighbour without the NaN: no NaN finding."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch import nn

    from amp_inspect.integrations import AmpInspectCallback

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)
            self.calls = 0

        def training_step(self, batch, _):
            x, y = batch
            h = self.b(torch.relu(self.a(x)))
            if plant and self.calls == 5:
                h = h * math.nan
            self.calls += 1
            return (self.c(torch.relu(h)).float() - y).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(128, 16, generator=g), torch.randn(128, 8, generator=g))
    callback = AmpInspectCallback()
    trainer = pl.Trainer(
        precision="16-mixed",
        accelerator="cpu",
        max_epochs=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=16))
    insp = callback.inspector
    codes = [f.code for f in insp.doctor().findings]
    if plant:
        poisoning = insp.weights_poisoned()
        assert poisoning is not None and (poisoning.by_step, poisoning.since) == (5, 6)
        assert codes[0] == "weights-poisoned" and insp.doctor().ok is False
        assert "the weights became NaN/Inf at step 6" in str(insp.summary())
    else:
        assert insp.weights_poisoned() is None
        assert not {"weights-poisoned", "poisoned-steps", "first-nonfinite"} & set(codes)
