"""The loss scaler's decisions on the scale timeline (amp_inspect/scaling/timeline.py): ``amp-inspect summary``, the
console, the HTML report and the loss-scale figure show each step where InspectingGradScaler(policy="headroom")
changed the scale or skipped, with the reason and the skip kind; and the Summary's advice follows the policy the
log was written under (GradScaler's settings under policy="torch", the policy's decisions under "headroom").

The logs are written from real HeadroomPolicy decisions on planted statistics, and from the demo's CPU loop.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from amp_inspect.cli import commands as cli
from amp_inspect.diagnosis.history import StepRecord, summarize
from amp_inspect.runlog.log import RunLog, read_log
from amp_inspect.scaling.policies import (
    HEADROOM,
    MARGIN,
    NONFINITE_NOT_FROM_SCALE,
    OVERFLOW,
    SKIP_NONFINITE,
    SKIP_OVERFLOW,
    START,
    HeadroomPolicy,
    ScaleDecision,
    StepStats,
    register_policy,
)
from amp_inspect.scaling.timeline import (
    POLICY_HEADROOM,
    POLICY_TORCH,
    ScaleChange,
    decision_from_record,
    scale_changes,
    shown_changes,
)

GRADSCALER_WORDS = ("init_scale", "growth_interval", "backoff_factor")
NAN_STEPS = (8, 9, 10)  # a burst of NaN batches: not the scale's fault
SPIKE_STEP = 14  # one batch whose gradients are 1e4 times larger: overflow at the chosen scale


def _headroom_run(steps: int = 20) -> tuple[list[dict], list[ScaleDecision]]:
    """Records of a run under HeadroomPolicy (real decisions), gradients of amax 2^-6 unscaled."""
    policy = HeadroomPolicy()
    scale = policy.first_scale(65536.0)
    records, decisions = [], []
    for step in range(steps):
        amax = 2.0**-6 * scale
        nan = 5 if step in NAN_STEPS else 0
        inf = 3 if step == SPIKE_STEP else 0
        if step == SPIKE_STEP:
            amax = 60000.0  # finite gradients at the ceiling: the scale caused the Inf
        offenders = ("blocks.1.mlp",) if nan or inf else ()
        decision = policy.decide(StepStats(scale=scale, amax=amax, nan=nan, inf=inf, offenders=offenders))
        skipped = bool(nan or inf)
        records.append(
            {
                "step": step,
                "scale": scale,
                "skipped": skipped,
                "total_norm": math.nan if nan else (math.inf if inf else 1.0),
                "offenders": list(offenders),
                "headroom": {"up": decision.room, "down": 10},
                "recommended_scale": 2.0**20,
                "formats": ["fp16"],
                "modules": {
                    "blocks.1.mlp": {"numel": 100, "nan": nan, "posinf": inf, "neginf": 0, "zero": 0}
                    | {"overflow": 0, "subnormal": 0, "underflow": 0, "amax": amax / scale, "grad_norm": 1.0}
                },
                "scale_decision": decision.to_record(),
            }
        )
        decisions.append(decision)
        scale = decision.scale
    return records, decisions


def _write(path: Path, records: list[dict]) -> Path:
    with RunLog(path) as log:
        for r in records:
            log.write(r)
    return path


def _history(records: list[dict]) -> list[StepRecord]:
    return [StepRecord.from_log_record(r) for r in records]


# ---- which decisions are shown -----------------------------------------------------------------------------


def test_decisions_that_change_the_scale_or_skip_are_shown_with_reason_and_skip_kind() -> None:
    records, decisions = _headroom_run()
    changes = scale_changes([r["step"] for r in records], decisions)
    by_step = {c.step: c for c in changes}
    assert by_step[0].decision.reason == START and by_step[0].decision.previous == 1.0
    assert [by_step[s].decision.reason for s in NAN_STEPS] == [NONFINITE_NOT_FROM_SCALE] * 3
    assert all(by_step[s].decision.skip == SKIP_NONFINITE for s in NAN_STEPS)
    assert by_step[SPIKE_STEP].decision.reason == OVERFLOW and by_step[SPIKE_STEP].decision.skip == SKIP_OVERFLOW
    # Every shown decision changed the scale or skipped; every decision left out did neither.
    for step, d in enumerate(decisions):
        assert (step in by_step) == (d.skip is not None or d.scale != d.previous or d.unsafe_scale is not None)
    text = str(by_step[NAN_STEPS[0]])
    assert f"step {NAN_STEPS[0]}: scale 2^" in text and "non-finite, not explained by the measured gradients" in text
    assert "blocks.1.mlp" in text


def test_shown_changes_keep_skips_and_rare_reasons_before_plain_headroom_moves() -> None:
    def change(step: int, reason: str, skip: str | None = None) -> ScaleChange:
        return ScaleChange(step, ScaleDecision(2.0**step, 2.0 ** (step - 1), reason, skip, 2, 3, "this step"))

    changes = [change(s, HEADROOM) for s in range(30)] + [change(30, MARGIN, SKIP_OVERFLOW), change(31, START)]
    shown = shown_changes(changes, limit=5)
    assert [c.step for c in shown] == [0, 1, 2, 30, 31]  # log order, the rare ones kept
    assert shown_changes(changes[:3]) == changes[:3]


def test_a_decision_round_trips_through_the_run_log(tmp_path: Path) -> None:
    broken = ScaleDecision(1.0, math.inf, START, None, 2, None, None, ())
    records, decisions = _headroom_run(4)
    records[-1]["scale_decision"] = broken.to_record()
    back = read_log(_write(tmp_path / "run.jsonl", records))
    assert [decision_from_record(r["scale_decision"]) for r in back] == [*decisions[:3], broken]


@pytest.mark.parametrize(
    "bad",
    [
        "headroom",
        {"scale": 1.0},
        {"scale": "x", "previous": 1.0, "reason": "start", "skip": None, "margin": 2, "room": 1, "room_from": None}
        | {"offenders": []},
        {"scale": 1.0, "previous": 1.0, "reason": "start", "skip": None, "margin": 2, "room": 1, "room_from": None}
        | {"offenders": [3]},
    ],
)
def test_a_malformed_decision_is_an_invalid_line(tmp_path: Path, bad: object) -> None:
    records, _ = _headroom_run(3)
    records[1]["scale_decision"] = bad
    with pytest.warns(RuntimeWarning, match=r'line 2 \("scale_decision" has the wrong type'):
        assert [r["step"] for r in read_log(_write(tmp_path / "run.jsonl", records))] == [0, 2]


# ---- summary, console, HTML report, figure -----------------------------------------------------------------


def test_summary_lists_the_decisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records, decisions = _headroom_run()
    summary = summarize(_history(records))
    assert summary.policy == POLICY_HEADROOM
    assert [c.step for c in summary.decisions] == [c.step for c in scale_changes(range(len(decisions)), decisions)]
    assert "policy 'headroom'" in str(summary) and f"{len(summary.decisions)} decisions" in str(summary)

    assert cli.main(["summary", str(_write(tmp_path / "run.jsonl", records))]) == 0
    out = capsys.readouterr().out
    assert "loss-scale decisions (policy 'headroom')" in out
    lines = out.splitlines()
    for step in (0, *NAN_STEPS, SPIKE_STEP):
        row = next(line for line in lines if line.strip("│ ").startswith(f"{step} ") and "2^" in line)
        reason = {0: "start", SPIKE_STEP: "overflow caused by the scale"}.get(step, "non-finite, not explained")
        assert reason in row, row
    spike = next(line for line in lines if line.strip("│ ").startswith(f"{SPIKE_STEP} "))
    assert "overflow (the scale)" in spike


def test_a_torch_policy_log_has_no_decisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records, _ = _headroom_run()
    for r in records:
        del r["scale_decision"]
    summary = summarize(_history(records))
    assert summary.policy == POLICY_TORCH and summary.decisions == []
    assert cli.main(["summary", str(_write(tmp_path / "run.jsonl", records))]) == 0
    assert "loss-scale decisions" not in capsys.readouterr().out


def test_html_report_lists_the_decisions(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the report needs matplotlib")
    from amp_inspect.render.html_report import write_report

    records, _ = _headroom_run()
    records[SPIKE_STEP]["scale_decision"]["offenders"] = ["<b>head</b>"]
    page = write_report(_write(tmp_path / "run.jsonl", records), tmp_path / "out" / "r.html").read_text()
    section = page[page.index('<section id="decisions">') :]
    section = section[: section.index("</section>")]
    assert "loss-scale policy<b>headroom</b>" in page
    assert "Loss-scale decisions (policy &#x27;headroom&#x27;)" in section
    assert section.count("<tr>") == 1 + len(summarize(_history(records)).decisions)
    assert "non-finite, not explained by the measured gradients" in section
    assert "overflow caused by the scale" in section
    assert "&lt;b&gt;head&lt;/b&gt;" in section and "<b>head</b>" not in section


def test_loss_scale_figure_marks_the_decisions_by_reason() -> None:
    pytest.importorskip("matplotlib", reason="the figures need matplotlib")
    from amp_inspect.render import plots

    records, _ = _headroom_run()
    fig = plots.loss_scale(records)
    ax = fig.axes[0]
    marks = {line.get_label(): line for line in ax.get_lines() if line.get_label().startswith("decision: ")}
    nonfinite = marks["decision: non-finite, not explained by the measured gradients (3)"]
    assert list(nonfinite.get_xdata()) == list(NAN_STEPS)
    assert list(nonfinite.get_ydata()) == [records[s + 1]["scale"] for s in NAN_STEPS]  # the scale chosen
    assert list(marks["decision: overflow caused by the scale (1)"].get_xdata()) == [SPIKE_STEP]
    assert "decision: start: set from the first measured step (1)" in marks
    assert "policy='headroom'" in ax.get_title(loc="left")
    for r in records:
        del r["scale_decision"]
    plain = plots.loss_scale(records).axes[0]
    assert not [line for line in plain.get_lines() if line.get_label().startswith("decision: ")]


@register_policy
class WordsOfItsOwn(HeadroomPolicy):
    """The headroom policy's decisions in words of its own: its reason names, said otherwise, and a routine (a
    registered policy has the ScalePolicy methods: register_policy refuses a class of words alone)."""

    name = "words_of_its_own"
    reason_words = {
        START: "first scale: mine",
        NONFINITE_NOT_FROM_SCALE: "NaN that my rule ignores",
        OVERFLOW: "too high for me",
        HEADROOM: "my routine nudge",
    }
    routine = (HEADROOM,)


def _decision_marks(records: list[dict]) -> dict[str, object]:
    from amp_inspect.render import plots

    ax = plots.loss_scale(records).axes[0]
    return {line.get_label(): line for line in ax.get_lines() if line.get_label().startswith("decision: ")}


def test_loss_scale_figure_labels_decisions_in_the_words_of_the_policy_in_the_log() -> None:
    pytest.importorskip("matplotlib", reason="the figures need matplotlib")
    records, _ = _headroom_run()
    for r in records:
        r["scale_decision"]["policy"] = WordsOfItsOwn.name  # the same decisions, recorded under the other policy
    marks = _decision_marks(records)
    assert list(marks["decision: NaN that my rule ignores (3)"].get_xdata()) == list(NAN_STEPS)
    assert list(marks["decision: too high for me (1)"].get_xdata()) == [SPIKE_STEP]
    assert "decision: first scale: mine (1)" in marks
    assert marks["decision: my routine nudge (1)"].get_marker() == "."  # its routine moves: small dots
    labels = " | ".join(marks)
    for words in HeadroomPolicy.reason_words.values():
        assert words not in labels, labels  # not the headroom policy's words

    records, _ = _headroom_run()
    for r in records:
        r["scale_decision"]["policy"] = "not_registered_here"  # a policy whose module this process lacks
    labels = " | ".join(_decision_marks(records))
    assert f"decision: {NONFINITE_NOT_FROM_SCALE} (3)" in labels  # its reasons as recorded
    for words in HeadroomPolicy.reason_words.values():
        assert words not in labels, labels


# ---- advice by policy --------------------------------------------------------------------------------------


def test_advice_on_gradscaler_settings_only_under_the_torch_policy() -> None:
    records, _ = _headroom_run()
    torch_records = [{k: v for k, v in r.items() if k != "scale_decision"} for r in records]
    under_torch = summarize(_history(torch_records), growth_interval=2000, backoff_factor=0.5)
    assert any("backoff_factor" in a for a in under_torch.advice)  # the NaN burst: a run of 3 skips

    under_headroom = summarize(_history(records), growth_interval=2000, backoff_factor=0.5)
    assert not [a for a in under_headroom.advice if any(w in a for w in GRADSCALER_WORDS)], under_headroom.advice
    innocent = [a for a in under_headroom.advice if "the measured gradients do not explain" in a]
    assert len(innocent) == 1 and f"first: step {NAN_STEPS[0]}" in innocent[0] and "blocks.1.mlp" in innocent[0]


def test_headroom_advice_names_a_widened_margin_and_repeated_overflows() -> None:
    records, _ = _headroom_run(4)
    history = _history(records)

    def with_decision(r: StepRecord, d: ScaleDecision) -> StepRecord:
        return StepRecord(**{**r.__dict__, "skipped": d.skip is not None, "scale_decision": d})

    widened = ScaleDecision(2.0**10, 2.0**12, MARGIN, SKIP_OVERFLOW, 5, 4, "this step")
    overflow = ScaleDecision(2.0**9, 2.0**10, OVERFLOW, SKIP_OVERFLOW, 5, 0, "this step")
    planted = [with_decision(history[0], widened)] + [
        with_decision(StepRecord(**{**history[1].__dict__, "step": s}), overflow) for s in (1, 2, 3)
    ]
    advice = summarize(planted).advice
    assert any("widened its margin 1 time(s)" in a and "HeadroomPolicy(margin=5)" in a for a in advice), advice
    assert any("3 steps (first: step 1) overflowed" in a and "HeadroomPolicy(margin=6)" in a for a in advice)
    assert not [a for a in advice if any(w in a for w in GRADSCALER_WORDS)]


def test_live_summary_follows_the_scalers_policy() -> None:
    """The same NaN burst in the demo's CPU loop: GradScaler's run gets advice on backoff_factor, the headroom
    policy's run does not (its backoff is bounded), and says the scale did not cause the NaN."""
    import amp_inspect
    from tests.test_scale_policy import make, train

    summaries = {}
    for policy in ("torch", "headroom"):
        model, opt, scaler = make(policy)
        insp = amp_inspect.attach(model, scaler)
        train(model, opt, scaler, range(14), nan_steps=NAN_STEPS)
        summaries[policy] = insp.summary()
        insp.detach()
    assert any("backoff_factor" in a for a in summaries["torch"].advice), summaries["torch"].advice
    headroom = summaries["headroom"]
    assert headroom.policy == POLICY_HEADROOM
    assert not [a for a in headroom.advice if any(w in a for w in GRADSCALER_WORDS)], headroom.advice
    assert any("the measured gradients do not explain" in a for a in headroom.advice)
    assert [c.step for c in headroom.decisions if c.decision.skip] == list(NAN_STEPS)


@pytest.mark.parametrize("calls_check", [True, False], ids=["check-before-step", "no-check"])
def test_every_log_line_carries_the_decision_also_with_check_before_step(tmp_path: Path, calls_check: bool) -> None:
    """check() before scaler.step inspects before update() decides: the step's log line waits for update()."""
    import torch
    from torch import nn

    import amp_inspect

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    insp = amp_inspect.attach(model, scaler, log=tmp_path / "run.jsonl")
    for step in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if calls_check:
            assert insp.check().step == step
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert [r.step for r in insp.history] == list(range(step + 1))
    insp.detach()
    records = read_log(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["scale_decision"]["scale"] > 0 for r in records)
    assert [r.scale_decision.reason for r in insp.history] == [r["scale_decision"]["reason"] for r in records]


def test_a_run_of_nan_steps_the_gradients_do_not_explain_is_told_how_far_the_scale_fell() -> None:
    """Issue 29: six NaN steps with finite gradients beside them halve the headroom scale each step (as GradScaler's:
    a hidden intermediate the scale overflowed looks the same); the advice says so instead of 'without collapsing
    the scale'. A NaN loss (no finite gradient) falls at most one binade, and is told so."""
    from amp_inspect.evidence.headroom import Headroom
    from amp_inspect.scaling.policies import HeadroomPolicy, StepStats

    def run(finite_beside: bool) -> list[str]:
        policy, scale, history = HeadroomPolicy(), 1.0, []
        for step in range(30):
            bad = 10 <= step < 16
            amax = (1e-3 * scale if finite_beside else 0.0) if bad else 1e-2 * scale
            decision = policy.decide(StepStats(scale, amax, 5 if bad else 0, 0))
            norm = math.nan if bad else 1.0
            facts = {"total_norm": norm, "headroom": Headroom(None, None), "recommended_scale": None}
            history.append(StepRecord(step, scale, bad, ["fc"] if bad else [], **facts, scale_decision=decision))
            scale = decision.scale
        return [a for a in summarize(history).advice if "do not explain" in a]

    (halved,) = run(finite_beside=True)
    assert "the scale fell x64 over such a run of steps" in halved and "without collapsing" not in halved
    (bounded,) = run(finite_beside=False)
    assert "without collapsing the scale" in bounded and "fell x" not in bounded


def test_a_one_off_loss_spike_under_the_headroom_policy_is_not_told_as_a_hidden_overflow_kept_for_the_run() -> None:
    """GPT-2, fp16 autocast, InspectingGradScaler(policy="headroom"), the loss x1e5 on step 10 only: every gradient
    is non-finite there, the next step runs clean one binade lower and the policy takes a first lesson. The advice
    says the lesson is temporary and that a spike looks the same; it does not say a hidden gradient overflowed and
    the margin is kept for the run (it said so before), nor that the steps after ran at the same scale."""
    import warnings

    import torch

    import amp_inspect

    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    insp = amp_inspect.attach(model, scaler)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for step in range(16):
            x = torch.randint(0, 64, (2, 16), generator=g)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(input_ids=x, labels=x).loss
            scaler.scale(loss * 1e5 if step == 10 else loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    insp.detach()
    advice = insp.summary().advice
    assert [r.step for r in insp.history if r.skipped] == [10]
    (lesson,) = [a for a in advice if "widened its margin" in a]
    assert "for a while" in lesson and "growth interval" in lesson and "spike" in lesson
    assert "keeps that margin for the run" not in lesson and "inside backward" not in lesson
    (one_off,) = [a for a in advice if "do not explain" in a]
    assert "a one-off" in one_off and "at the same scale" not in one_off


@pytest.mark.parametrize(("scale", "text"), [(32768, "2^15 (32,768)"), (32768.0, "2^15 (32,768)"), (3, "3")])
def test_a_scale_given_as_an_int_reads_as_its_float(scale: float, text: str) -> None:
    # Python 3.11's int has no is_integer(): an int scale (a log through jq, a caller's own) raised AttributeError.
    from amp_inspect.scaling.timeline import scale_text

    assert scale_text(scale) == text
