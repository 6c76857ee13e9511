"""UpdateStats in the run log and what `amp-inspect summary` / the doctor say from it (issue 22)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import amp_inspect
from amp_inspect.cli import commands as cli
from amp_inspect.updates.report import LOST_THRESHOLD, UpdateStats, update_verdicts
from tests.test_optimizer_watch import Net, _run

pytestmark = pytest.mark.filterwarnings("ignore:amp_inspect. no compiled update_stats kernel:RuntimeWarning")


def _record(lost: int, with_grad: int, *, dtype: str = "bf16", underflow: int = 0, ratio: float = 1e-3) -> dict:
    return {
        "numel": with_grad,
        "numel_with_grad": with_grad,
        "lost": lost,
        "changed": with_grad - lost,
        "weight_nonfinite": 0,
        "weight_subnormal": 0,
        "state_underflow": underflow,
        "sq_change": ratio**2,
        "sq_weight": 1.0,
        "weight_amax": 1.0,
        "dtype": dtype,
        "state_dtype": dtype,
    }


def _log(tmp_path: Path, dtype: torch.dtype) -> Path:
    model = Net(dtype)
    log = tmp_path / "run.jsonl"
    insp, _ = _run(model, [torch.optim.AdamW(model.parameters(), lr=1e-5)], steps=3, log=str(log))
    insp.detach()
    return log


def test_the_log_carries_the_update_and_amp_inspect_summary_says_the_verdict(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.bfloat16)
    records = amp_inspect.read_log(log)
    assert all("update" in r for r in records)
    live = UpdateStats.from_record(records[-1]["update"], records[-1]["step"])
    assert live.by_module["fc2"]["lost"] == records[-1]["update"]["modules"]["fc2"]["lost"]
    assert cli.main(["summary", str(log)]) == 0
    out = capsys.readouterr().out
    assert "were rounded away (bf16 weights without a master copy" in out
    assert cli.main(["doctor", "--log", str(log)]) in (0, 1)
    assert "[updates-rounded-away]" in capsys.readouterr().out


def test_an_fp32_log_gets_no_update_verdict(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.float32)
    assert cli.main(["summary", str(log)]) == 0
    out = capsys.readouterr().out
    assert "rounded away" not in out and "exp_avg_sq" not in out and "update-to-weight" not in out


def test_old_logs_without_updates_still_read(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.bfloat16)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        line.pop("update")
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["summary", str(log)]) == 0
    assert "rounded away" not in capsys.readouterr().out


def test_a_malformed_update_entry_is_one_sentence() -> None:
    with pytest.raises(ValueError, match='needs "modules"'):
        UpdateStats.from_record({"modules": 3})
    with pytest.raises(ValueError, match="update record of module 'fc' is malformed"):
        UpdateStats.from_record({"modules": {"fc": {"lost": 1}}})


def test_a_log_written_before_made_nonfinite_reads_as_none_made() -> None:
    older = {"modules": {"fc": _record(lost=10, with_grad=100)}}  # no "made_nonfinite": the op had no such count
    assert "made_nonfinite" not in older["modules"]["fc"]
    back = UpdateStats.from_record(older, 3)
    assert back.by_module["fc"]["made_nonfinite"] == 0
    assert "optimizer-made-nonfinite" not in [v.code for v in update_verdicts([back])]
    made = UpdateStats.from_record({"modules": {"fc": {**_record(lost=10, with_grad=100), "made_nonfinite": 4}}}, 3)
    assert [v.code for v in update_verdicts([made])][0] == "optimizer-made-nonfinite"


def test_the_lost_threshold_is_where_the_verdict_starts() -> None:
    at = math.ceil(LOST_THRESHOLD * 1000)
    below = UpdateStats(0, {"fc": _record(at - 1, 1000)})
    on = UpdateStats(0, {"fc": _record(at, 1000)})
    assert not update_verdicts([below])
    (verdict,) = update_verdicts([on])
    assert verdict.code == "updates-rounded-away"
    assert verdict.seen.startswith(f"{at / 1000:.0%} of the updates of 1 module were rounded away")


def test_state_underflow_advice_names_eps_only_for_fp16_state() -> None:
    fp16 = update_verdicts([UpdateStats(0, {"fc": _record(0, 1000, dtype="fp16", underflow=10)})])
    assert [v.code for v in fp16] == ["optimizer-state-underflow"] and "eps to about 1e-4" in fp16[0].fix
    fp32 = update_verdicts([UpdateStats(0, {"fc": _record(0, 1000, dtype="fp32", underflow=10)})])
    assert "eps to about 1e-4" not in fp32[0].fix
    assert not update_verdicts([UpdateStats(0, {"fc": _record(0, 1000, dtype="fp16", underflow=0)})])


def test_update_ratio_range() -> None:
    assert not update_verdicts([UpdateStats(0, {"fc": _record(0, 100, dtype="fp32", ratio=1e-3)})])
    (high,) = update_verdicts([UpdateStats(0, {"fc": _record(0, 100, dtype="fp32", ratio=0.05)})])
    assert high.code == "update-ratio" and "above 0.01" in high.seen and "fc 5.0e-02" in high.seen


def test_the_html_report_plots_the_update_ratio_beside_the_heatmaps(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from amp_inspect.render.html_report import write_report

    log = _log(tmp_path, torch.bfloat16)
    page = write_report(log, tmp_path / "report.html").read_text()
    assert '<section id="updates">' in page and "update-to-weight ratio" in page
    assert page.index('id="heatmap_over_time"') < page.index('id="updates"') < page.index('id="fractions"')
    assert "were rounded away" in page  # the verdict among the findings
    section = page[page.index('id="updates"') : page.index("</section>", page.index('id="updates"'))]
    assert "what the optimizer did (3 measured optimizer steps)" in section and "update ratio (median)" in section
    assert '<td class="module">fc1</td>' in section and '<td class="module">fc2</td>' in section


def test_a_log_without_updates_has_no_update_section(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from amp_inspect.updates.plot import html_section

    assert html_section([{"step": 0}]) is None


def test_amp_inspect_summary_tables_the_modules_worst_first(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.bfloat16)
    assert cli.main(["summary", str(log)]) == 0
    out = capsys.readouterr().out
    assert "what the optimizer did (3 measured optimizer steps): " in out and "updates lost (9" in out
    assert "what the optimizer did per module over 3 measured optimizer steps, worst first" in out
    records = amp_inspect.read_log(log)
    steps = [UpdateStats.from_record(r["update"], r["step"]) for r in records]
    lost = {m: sum(u.by_module[m]["lost"] for u in steps) for m in ("fc1", "fc2")}
    with_grad = {m: sum(u.by_module[m]["numel_with_grad"] for u in steps) for m in ("fc1", "fc2")}
    worst = max(lost, key=lambda m: lost[m] / with_grad[m])
    table = out[out.index("worst first") :]
    assert table.index(f" {worst} ") < table.index(f" {'fc1' if worst == 'fc2' else 'fc2'} ")
    assert f"{with_grad[worst]:,}" in table and f"{100 * lost[worst] / with_grad[worst]:.3g}%" in table


def test_an_fp32_summary_tables_no_lost_updates(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.float32)
    assert cli.main(["summary", str(log)]) == 0
    out = capsys.readouterr().out
    # A rare element after Adam's m crosses 0 (far below the 5% verdict): the fact is shown, no verdict.
    lost = re.search(r"updates lost \(([0-9.]+)%", out)
    assert lost is not None and float(lost.group(1)) < 1 and "worst first" in out
    assert "rounded away" not in out


def test_amp_inspect_updates_shows_the_run_or_one_step(tmp_path, capsys) -> None:
    log = _log(tmp_path, torch.bfloat16)
    assert cli.main(["updates", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("what the optimizer did (3 measured optimizer steps)") and "fc1" in out and "fc2" in out
    assert cli.main(["updates", str(log), "--step", "1"]) == 0
    one = capsys.readouterr().out
    assert one.startswith("optimizer step at step 1: what it did per module")
    assert cli.main(["updates", str(log), "--step", "99"]) == 1
    assert "no measured optimizer step at step 99 (the last ones: 0, 1, 2)" in capsys.readouterr().err


def test_amp_inspect_updates_on_a_log_without_them_says_how_to_get_them(tmp_path, capsys) -> None:
    log = tmp_path / "run.jsonl"
    model = Net(torch.float32)
    insp = amp_inspect.attach(model, log=str(log))
    model(torch.randn(4, 16)).sum().backward()
    insp.check()
    insp.detach()
    assert cli.main(["updates", str(log)]) == 1
    assert "attach with optimizer=opt, update_every=N" in capsys.readouterr().err


def test_the_overview_counts_skipped_steps_apart() -> None:
    from amp_inspect.updates.report import overview

    applied = UpdateStats(1, {"fc": _record(10, 100)})
    skipped = UpdateStats(2, {})
    skipped._skipped = True
    seen = overview([applied, skipped])
    assert seen is not None and seen.steps == 1 and seen.skipped == 1
    assert "1 measured optimizer step, 1 more skipped (NaN/Inf, nothing applied)" in seen.headline()
    assert overview([skipped]) is None


def test_a_module_whose_weights_were_zero_on_a_measured_step_is_left_out_of_the_high_ratio() -> None:
    zeros = {**_record(0, 100, dtype="fp32", ratio=0.0), "sq_weight": 0.0}
    high = UpdateStats(1, {"lora_B": _record(0, 100, dtype="fp32", ratio=0.05)})
    assert not update_verdicts([UpdateStats(0, {"lora_B": zeros}), high])
    (verdict,) = update_verdicts([high])
    assert verdict.code == "update-ratio" and "lora_B 5.0e-02" in verdict.seen


def test_learning_rate_0_on_every_measured_step_is_said_and_on_one_step_is_not() -> None:
    frozen = {**_record(0, 0, dtype="bf16", ratio=0.0), "numel": 100, "numel_lr_zero": 100}
    always = update_verdicts([UpdateStats(0, {"fc": frozen}), UpdateStats(1, {"fc": frozen})])
    assert [v.code for v in always] == ["update-ratio"] and "exactly 0 on every measured step" in always[0].seen
    moving = _record(1, 100, dtype="bf16", ratio=1e-3)
    assert not update_verdicts([UpdateStats(0, {"fc": frozen}), UpdateStats(1, {"fc": moving})])
    # The count reaches the log and comes back; an old log's record without it reads as 0.
    back = UpdateStats.from_record(UpdateStats(0, {"fc": frozen}).to_record())
    assert back.by_module["fc"]["numel_lr_zero"] == 100
    assert UpdateStats.from_record({"modules": {"fc": moving}}).by_module["fc"]["numel_lr_zero"] == 0


def test_lost_fp32_updates_are_not_told_to_keep_fp32_master_weights() -> None:
    (fp32,) = update_verdicts([UpdateStats(0, {"fc": _record(500, 1000, dtype="fp32")})])
    assert "(fp32 weights;" in fp32.seen and "master weights" not in fp32.fix and "far too small" in fp32.fix
    (bf16,) = update_verdicts([UpdateStats(0, {"fc": _record(500, 1000, dtype="bf16")})])
    assert "without a master copy" in bf16.seen and "keep fp32 master weights" in bf16.fix
    both = {"fc": _record(500, 1000, dtype="fp32"), "head": _record(500, 1000, dtype="mixed")}
    (mixed,) = update_verdicts([UpdateStats(0, both)])
    assert "keep fp32 master weights" in mixed.fix  # a module with a 16-bit parameter among the lossy ones


def test_the_headline_says_learning_rate_0_and_not_that_nothing_had_a_gradient() -> None:
    from amp_inspect.updates.report import overview

    frozen = {**_record(0, 0, dtype="bf16", ratio=0.0), "numel": 100, "numel_lr_zero": 100}
    line = overview([UpdateStats(0, {"fc": frozen})]).headline()
    assert "no update was asked for, 100 elements at learning rate 0" in line
    assert "gradient" not in line
    dead = {**_record(0, 0, dtype="bf16", ratio=0.0), "numel": 100}
    assert "no element had a finite nonzero gradient" in overview([UpdateStats(0, {"fc": dead})]).headline()
    warm = overview([UpdateStats(0, {"fc": frozen}), UpdateStats(1, {"fc": _record(5, 100)})]).headline()
    assert "5 of 100 updates lost" in warm and "100 elements at learning rate 0" in warm
