"""readiness/report.py: the verdicts (each where it must appear and where it must not), the best recipe, merging,
the run log's "readiness" entry, ``amp-inspect readiness`` and the HTML report's heatmap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.cli import commands as cli
from amp_inspect.core.format_readiness import format_readiness
from amp_inspect.core.recipes import RECIPE_NAMES, RECIPES_BY_NAME
from amp_inspect.readiness import hooks as readiness_hooks
from amp_inspect.readiness.report import (
    BORDERLINE,
    NOT_READY,
    READY,
    THRESHOLDS,
    OperandStats,
    ReadinessReport,
    from_log,
    mantissa_bound_db,
)
from amp_inspect.render.html_report import write_report
from amp_inspect.runlog.log import RunLog, read_log


def _operand(t: torch.Tensor) -> OperandStats:
    r = readiness_hooks._rows(format_readiness([t]))[0]
    return OperandStats.from_row(r.counts.tolist(), r.sums.tolist(), float(r.amax), len(RECIPE_NAMES))


def _report(**modules: dict[str, torch.Tensor]) -> ReadinessReport:
    return ReadinessReport(RECIPE_NAMES, {m: {op: _operand(t) for op, t in ops.items()} for m, ops in modules.items()})


def _gaussian(seed: int, shape: tuple[int, ...] = (64, 256)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _with_outlier(seed: int) -> torch.Tensor:
    x = _gaussian(seed)
    # 2e4 times the typical value: one fp32 scale per tensor puts |x| < 0.044 (3.5% of a Gaussian) below E4M3's
    # smallest subnormal; its MX block's scale 2^6 keeps it at 312, below E4M3's 448 (no clamp), and the rest of
    # that block above 2^-10 but for |x| < 0.06 (1 or 2 of its 31 others)
    x[3, 17] = 2e4
    return x


def _layer(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"X": x, "W": _gaussian(100) * 0.05, "dY": _gaussian(101) * 1e-4}


# ---- verdicts ----


def test_a_huge_outlier_in_x_is_not_ready_per_tensor_but_ready_per_mx_block() -> None:
    report = _report(fc=_layer(_with_outlier(0)))
    tensor_scaled = report.verdict("fc", "fp8_e4m3_tensor")
    assert tensor_scaled.level == NOT_READY
    assert tensor_scaled.why.startswith("X:") and "flushed" in tensor_scaled.why  # the outlier's scale flushes X
    assert report.verdict("fc", "mxfp8_e4m3").level == READY  # 32-element blocks: only its block pays
    assert report.verdict("fc", "mxfp8_e4m3_rceil").level == READY


def test_a_well_scaled_layer_is_ready_for_mxfp8_and_fp8() -> None:
    report = _report(fc=_layer(_gaussian(0)))
    for recipe in ("fp8_e4m3_tensor", "fp8_e4m3_block128", "mxfp8_e4m3", "mxfp8_e4m3_rceil", "mxfp8_e5m2"):
        assert report.verdict("fc", recipe) == report.verdict("fc", recipe).__class__(READY), recipe


def test_levels_at_their_thresholds() -> None:
    """At a limit is still the better level; just past it is the next one (flushed and SQNR alike)."""
    limits = THRESHOLDS["e4m3"]
    r = RECIPE_NAMES.index("mxfp8_e4m3")
    n = len(RECIPE_NAMES)

    def stats(sqnr_db: float, flushed: int) -> OperandStats:
        signal = 1.0e6
        error = signal / 10 ** (sqnr_db / 10)
        return OperandStats(
            100_000, 100_000, 0, (flushed,) * n, (0,) * n, (3125,) * n, (0,) * n, signal, (error,) * n, 4.0
        )

    def level(s: OperandStats) -> str:
        return ReadinessReport(RECIPE_NAMES, {"fc": {"X": s}}).verdict("fc", RECIPE_NAMES[r]).level

    ready_flushed = int(limits.ready_flushed * 100_000)
    borderline_flushed = int(limits.borderline_flushed * 100_000)
    assert level(stats(limits.ready_sqnr + 1e-9, ready_flushed)) == READY
    assert level(stats(limits.ready_sqnr - 0.01, 0)) == BORDERLINE
    assert level(stats(limits.ready_sqnr + 1.0, ready_flushed + 1)) == BORDERLINE
    assert level(stats(limits.borderline_sqnr + 1e-9, borderline_flushed)) == BORDERLINE
    assert level(stats(limits.borderline_sqnr - 0.01, 0)) == NOT_READY
    assert level(stats(limits.ready_sqnr + 1.0, borderline_flushed + 1)) == NOT_READY


def test_thresholds_follow_the_mantissa_bound() -> None:
    for element, mbits in (("e4m3", 3), ("e5m2", 2), ("e2m1", 1)):
        bound = 10 * math.log10(28) + 20 * mbits * math.log10(2)
        assert mantissa_bound_db(mbits) == pytest.approx(bound)
        assert THRESHOLDS[element].ready_sqnr == pytest.approx(bound - 6)
        assert THRESHOLDS[element].borderline_sqnr == pytest.approx(bound - 12)


def test_nan_in_an_operand_is_not_ready_and_a_finite_one_is_not_blamed() -> None:
    x = _gaussian(0)
    x[0, 0] = math.nan
    report = _report(bad=_layer(x), good=_layer(_gaussian(1)))
    verdict = report.verdict("bad", "mxfp8_e4m3")
    assert verdict.level == NOT_READY and verdict.why == "X: 1 NaN/Inf"
    assert report.verdict("good", "mxfp8_e4m3").level == READY


def test_dw_is_shown_but_not_judged_and_zeros_lose_nothing() -> None:
    layer = _layer(_gaussian(0))
    layer["dW"] = _with_outlier(5)  # would be not ready per tensor
    layer["dY"] = torch.zeros(8, 32)
    report = _report(fc=layer)
    assert report.verdict("fc", "fp8_e4m3_tensor").level == READY
    assert list(report.modules["fc"]) == ["X", "W", "dY", "dW"]


def test_a_heavy_tailed_x_is_borderline_for_mxfp4_and_a_gaussian_one_is_not() -> None:
    torch.manual_seed(0)
    heavy = torch.distributions.Laplace(0.0, 1.0).sample((64, 256))  # MXFP4 flushes 16% of it (a Gaussian: 9%)
    report = _report(heavy=_layer(heavy), gaussian=_layer(_gaussian(0)))
    fp4 = report.verdict("heavy", "mxfp4")
    assert fp4.level == BORDERLINE and fp4.why.startswith("X:") and "flushed" in fp4.why
    assert report.verdict("gaussian", "mxfp4").level == READY
    assert report.verdict("heavy", "mxfp8_e4m3_rceil").level == READY


def test_the_best_recipe_keeps_the_most_modules_ready() -> None:
    report = _report(a=_layer(_with_outlier(0)), b=_layer(_gaussian(1)))
    counts = report.ready_counts()
    best = report.best_recipe()
    assert counts[best][READY] == max(c[READY] for c in counts.values()) == 2
    assert best != "fp8_e4m3_tensor" and counts["fp8_e4m3_tensor"][READY] == 1  # a's outlier
    text = str(report)
    assert f"the recipe that keeps the most modules ready: {best}" in text
    assert "fp8_e4m3_tensor: a not ready (X:" in text
    assert "fp8_e4m3_tensor: b" not in text  # b is ready: no line for it


def test_ties_go_to_the_most_accurate_recipe() -> None:
    report = _report(a=_layer(_gaussian(0)))
    counts = report.ready_counts()
    tied = [r for r in RECIPE_NAMES if counts[r][READY] == 1]
    assert len(tied) > 1  # a Gaussian layer is ready for more than one recipe
    best = report.best_recipe()
    assert best in tied
    assert report.mean_worst_sqnr(best) == max(report.mean_worst_sqnr(r) for r in tied)
    assert RECIPES_BY_NAME[best].element != "e2m1"  # 4-bit elements are never the more accurate


# ---- merging ----


def test_merging_adds_counts_and_sums_and_takes_the_larger_amax() -> None:
    a, b = _report(fc=_layer(_gaussian(0))), _report(fc=_layer(_gaussian(1) * 3), other=_layer(_gaussian(2)))
    merged = a.merged(b)
    x, xa, xb = merged.modules["fc"]["X"], a.modules["fc"]["X"], b.modules["fc"]["X"]
    assert x.numel == xa.numel + xb.numel and x.nonzero == xa.nonzero + xb.nonzero
    assert x.flushed == tuple(p + q for p, q in zip(xa.flushed, xb.flushed, strict=True))
    assert x.sq_error == tuple(p + q for p, q in zip(xa.sq_error, xb.sq_error, strict=True))
    assert x.amax == max(xa.amax, xb.amax)
    assert list(merged.modules) == ["fc", "other"]
    with pytest.raises(ValueError, match="cannot merge readiness of recipes"):
        a.merged(ReadinessReport(["nvfp4"], {}))


# ---- the log, the command line, the HTML report ----


def _train(tmp_path: Path, readiness_every: int | None, steps: int = 5) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))
    log = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, log=str(log), readiness_every=readiness_every)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 16)).float().square().mean()
        loss.backward()
        insp.check()
        opt.step()
        opt.zero_grad()
    insp.detach()
    return log


def test_the_log_carries_readiness_on_readiness_steps_only(tmp_path: Path) -> None:
    records = read_log(_train(tmp_path, readiness_every=2))
    assert [("readiness" in r) for r in records] == [True, False, True, False, True]
    tables = from_log(records)
    assert [t.step for t in tables] == [0, 2, 4]
    assert list(tables[-1].modules) == ["0", "2"] and list(tables[-1].modules["0"]) == ["X", "W", "dY", "dW"]
    assert tables[-1].modules["0"]["X"].numel == 8 * 16


def test_the_log_entry_reads_back_as_it_was_written(tmp_path: Path) -> None:
    x = _gaussian(0)
    x[1, 1] = math.inf
    report = _report(fc=_layer(x))
    path = tmp_path / "r.jsonl"
    with RunLog(path) as log:
        log.write({"step": 7, "readiness": report.to_record()})
    (back,) = from_log(read_log(path))
    assert back.step == 7 and back.modules == report.modules


def test_a_malformed_readiness_entry_is_an_invalid_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    good = {"schema": 1, "log": "amp_inspect", "step": 0}
    bad = {**good, "step": 1, "readiness": {"modules": []}}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.warns(RuntimeWarning, match="line 2 is incomplete or invalid"):
        assert [r["step"] for r in read_log(path)] == [0]


@pytest.mark.parametrize(
    "entry",
    [
        {"recipes": [{}], "modules": {}},
        {"recipes": ["nvfp4"], "modules": {"fc": {"X": {"flushed": [None]}}}},
        {"recipes": ["nvfp4"], "modules": {"fc": {"Q": {}}}},
    ],
)
def test_a_malformed_readiness_entry_is_one_sentence_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture, entry: dict
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"schema": 1, "log": "amp_inspect", "step": 0, "readiness": entry}) + "\n")
    assert cli.main(["readiness", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("amp-inspect readiness: ") and "\n" not in err


def test_cli_prints_the_table_of_the_last_readiness_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = _train(tmp_path, readiness_every=2)
    assert cli.main(["readiness", str(log)]) == 0
    out = capsys.readouterr().out
    assert "format readiness at step 4" in out
    assert "the recipe that keeps the most modules ready:" in out
    for name in RECIPE_NAMES:
        assert name in out
    assert cli.main(["readiness", str(log), "--step", "2", "--recipes", "mxfp8_e4m3,nvfp4"]) == 0
    out = capsys.readouterr().out
    assert "at step 2" in out and "nvfp4" in out and "fp8_e5m2_tensor" not in out
    best = out.split("the recipe that keeps the most modules ready (of those shown): ")[1].split()[0]
    assert best in ("mxfp8_e4m3", "nvfp4")


def test_cli_on_a_log_without_readiness_says_so_in_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = _train(tmp_path, readiness_every=None, steps=2)  # what every log written before readiness_every looks like
    assert cli.main(["readiness", str(log)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("no readiness table in this log (attach with readiness_every=N to measure one every N steps)")
    assert "\n" not in err


@pytest.mark.parametrize("args", [["missing.jsonl"], ["LOG", "--step", "3"], ["LOG", "--recipes", "fp9"]])
def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str]) -> None:
    log = _train(tmp_path, readiness_every=2, steps=1)
    argv = ["readiness", *(str(log) if a == "LOG" else str(tmp_path / a) if a.endswith(".jsonl") else a for a in args)]
    assert cli.main(argv) in (1, 2)
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err


def test_the_html_report_has_the_heatmap_only_when_the_log_has_readiness(tmp_path: Path) -> None:
    with_readiness = _train(tmp_path / "a", readiness_every=2, steps=3)
    page = write_report(with_readiness, tmp_path / "a" / "report.html").read_text()
    assert 'id="readiness"' in page and "format readiness heatmap" in page
    assert "The recipe that keeps the most modules ready" in page
    without = _train(tmp_path / "b", readiness_every=None, steps=2)
    page = write_report(without, tmp_path / "b" / "report.html").read_text()
    assert 'id="readiness"' not in page
