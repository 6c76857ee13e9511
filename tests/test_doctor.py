"""The AMP doctor: each check fires on a setup built to trigger it and stays silent on a clean one; the clipping
watch in real CPU training steps (GradScaler("cpu"), bf16 autocast), restoring torch's functions whatever
happens; the command with and without a run log."""

from __future__ import annotations

import importlib
import importlib.util
import math
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.utils
import torch.nn.utils.clip_grad
from torch import nn

import amp_inspect
import amp_inspect.diagnosis.doctor
from amp_inspect.cli import commands as cli
from amp_inspect.diagnosis.doctor import ClipWatch, DoctorReport, Finding, doctor, watch_clipping
from amp_inspect.diagnosis.history import StepRecord
from amp_inspect.gradients.step_report import Headroom
from amp_inspect.runlog.log import RunLog
from tests.models import hf_gpt2

findings_module = importlib.import_module("amp_inspect.diagnosis.findings")  # the check registry


def main(argv: list[str]) -> int:
    """``amp-inspect doctor ARGV``: the doctor's command line lives with the CLI."""
    return cli.main(["doctor", *argv])


ORIGINALS = {
    (module, name): getattr(module, name)
    for module in (torch.nn.utils, torch.nn.utils.clip_grad)
    for name in ("clip_grad_norm_", "clip_grad_value_")
}


def assert_originals_restored() -> None:
    for (module, name), original in ORIGINALS.items():
        assert getattr(module, name) is original, f"{module.__name__}.{name} was not restored"


@pytest.fixture(autouse=True)
def torch_functions_untouched():
    """Every test leaves torch's clipping functions as it found them."""
    yield
    assert_originals_restored()


class CleanNet(nn.Module):
    """Every GEMM size a multiple of 8; the Conv's 3 input channels are an image's (exempt)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.conv = nn.Conv2d(3, 16, 3)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def mlp(width: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 8))


def codes(report: DoctorReport) -> list[str]:
    return [f.code for f in report.findings]


def record(step: int, scale: float, skipped: bool, offenders=(), up: int = 3, recommended: float | None = None):
    return StepRecord(
        step, scale, skipped, list(offenders), math.inf if skipped else 1.0, Headroom(up, 10), recommended
    )


# ---- clean setups ----


def test_clean_fp16_setup_is_ok() -> None:
    model = CleanNet()
    report = doctor(model, torch.optim.Adam(model.parameters()), torch.amp.GradScaler("cpu"), autocast_dtype="fp16")
    assert report.findings == [] and report.ok
    assert str(report) == "amp_inspect doctor: no problems found"


def test_clean_bf16_setup_is_ok() -> None:
    model = CleanNet()
    report = doctor(model, torch.optim.SGD(model.parameters(), lr=0.1), None, autocast_dtype=torch.bfloat16)
    assert report.findings == [] and report.ok


# ---- setup checks ----


def test_fp16_weights_stepped_without_master_copy() -> None:
    model = CleanNet().half()
    model.emb.weight.requires_grad_(False)  # frozen: never stepped, not a finding
    for optimizer in (torch.optim.SGD(model.parameters(), lr=0.1), None):
        report = doctor(model, optimizer, torch.amp.GradScaler("cpu"), autocast_dtype=torch.float16)
        (finding,) = [f for f in report.findings if f.code == "fp16-weights"]
        assert finding.severity == "error" and not report.ok
        assert "fc1.weight" in finding.message and "conv.bias" in finding.message
        assert ("that the optimizer steps" in finding.message) == (optimizer is not None)
        assert "emb.weight" not in finding.message
        assert "torch.autocast('cpu', dtype=torch.float16)" in finding.fix


def test_bf16_weights_are_an_info() -> None:
    model = mlp().to(torch.bfloat16)
    report = doctor(model, torch.optim.AdamW(model.parameters()), autocast_dtype=torch.bfloat16)
    assert codes(report) == ["bf16-weights"] and report.ok
    assert "0.weight" in report.findings[0].message


def test_fp16_autocast_without_scaler() -> None:
    model = CleanNet()
    for scaler in (None, torch.amp.GradScaler("cpu", enabled=False)):
        report = doctor(model, torch.optim.Adam(model.parameters()), scaler, autocast_dtype=torch.float16)
        assert codes(report) == ["no-grad-scaler"] and report.findings[0].severity == "error"
        assert "GradScaler('cpu')" in report.findings[0].fix  # the device of the parameters


def test_no_grad_scaler_fix_names_the_parameters_device_not_the_disabled_scalers() -> None:
    model = CleanNet()  # on the CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler("cuda") without CUDA: disabled, with a warning
        scaler = torch.amp.GradScaler("cuda", enabled=False)
    report = doctor(model, torch.optim.Adam(model.parameters()), scaler, autocast_dtype=torch.float16)
    assert codes(report) == ["no-grad-scaler"]
    assert "GradScaler('cpu')" in report.findings[0].fix and "GradScaler('cuda')" not in report.findings[0].fix
    without_parameters = doctor(nn.Identity(), None, scaler, autocast_dtype=torch.float16)
    assert [f.code for f in without_parameters.findings] == ["no-grad-scaler"]
    assert "GradScaler('cuda')" in without_parameters.findings[0].fix  # no parameters: the usual device


def test_autocast_dtype_is_read_from_the_enclosing_region() -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        report = doctor(CleanNet())
    assert codes(report) == ["no-grad-scaler"]
    assert doctor(CleanNet()).findings == []  # outside any autocast region: nothing known, nothing said


def test_scaler_with_bf16_is_an_info() -> None:
    model = CleanNet()
    report = doctor(model, None, torch.amp.GradScaler("cpu"), autocast_dtype="bf16")
    assert codes(report) == ["scaler-with-bf16"] and report.findings[0].severity == "info"
    assert report.ok


def test_sizes_not_multiple_of_8_grouped_in_one_warning() -> None:
    model = nn.ModuleDict(
        {
            "emb": nn.Embedding(50257, 16),
            "proj": nn.Linear(16, 100),
            "conv": nn.Conv1d(12, 30, 3),
            "image_in": nn.Conv2d(3, 16, 3),  # image channels: exempt
            "depthwise": nn.Conv2d(30, 30, 3, groups=30),  # not a plain GEMM: skipped
            "ok": nn.Linear(64, 64),
        }
    )
    report = doctor(model, autocast_dtype=torch.float16, scaler=torch.amp.GradScaler("cpu"))
    (finding,) = report.findings
    assert finding.code == "tensor-core-sizes" and finding.severity == "warning"
    assert "emb (Embedding num_embeddings=50257)" in finding.message
    assert "proj (Linear out_features=100)" in finding.message
    assert "conv (Conv1d in_channels=12, out_channels=30)" in finding.message
    assert "image_in" not in finding.message and "depthwise" not in finding.message and "ok (" not in finding.message
    assert "50257 -> 50264" in finding.fix
    assert doctor(model, autocast_dtype=torch.float32).findings == []  # no half-precision GEMMs: not a concern


def test_many_odd_modules_are_listed_shortly() -> None:
    model = nn.Sequential(*[nn.Linear(10, 10) for _ in range(25)])
    (finding,) = doctor(model, autocast_dtype="bf16").findings
    assert finding.message.startswith("25 modules")
    assert "and 15 more" in finding.message and "(Linear in_features=10, out_features=10)" in finding.message
    assert "24 (" not in finding.message


def test_loss_scale_collapse_in_history() -> None:
    collapsing = [record(0, 65536.0, False)] + [record(i, 65536.0 / 2**i, True, ["blocks.1.mlp"]) for i in range(1, 8)]
    report = doctor(history=collapsing)
    (finding,) = [f for f in report.findings if f.code == "scale-collapse"]
    assert finding.severity == "warning" and "blocks.1.mlp" in finding.message and not report.ok
    assert "activations='always'" in finding.fix

    recovered = collapsing + [record(8 + i, 512.0, False) for i in range(5)]
    report = doctor(history=recovered)
    assert "scale-collapse" not in codes(report)
    (finding,) = [f for f in report.findings if f.code == "skip-burst"]
    assert finding.severity == "warning" and "ending at step 7" in finding.message
    assert "blocks.1.mlp" in finding.message and "from 32768 to 512" in finding.message

    healthy = [record(i, 65536.0, i == 3, ["fc1"] if i == 3 else []) for i in range(20)]
    assert "scale-collapse" not in codes(doctor(history=healthy))
    assert "skip-burst" not in codes(doctor(history=healthy))


def test_scaler_advice_and_high_init_scale_from_history() -> None:
    # The scale backed off from 2^16 to 2^10 over 6 skipped steps; there the largest gradient fits with 2 doublings
    # to spare (ceiling 2^12) and the recommendation is 2^9.
    history = [record(i, 65536.0 / 2**i, True, ["head"], up=-1) for i in range(6)]
    history += [record(6 + i, 1024.0, False, up=2, recommended=512.0) for i in range(10)]
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    report = doctor(scaler=scaler, history=history)
    found = codes(report)
    assert "scaler-advice" in found
    assert "skip-burst" not in found and "scale-collapse" not in found  # calibrating at the start: advice only
    (high,) = [f for f in report.findings if f.code == "init-scale-high"]
    assert "2^12" in high.message and "init_scale=2.0**9" in high.fix
    advice = [f for f in report.findings if f.code == "scaler-advice"]
    assert any("lower init_scale" in f.fix for f in advice)
    assert "init-scale-high" not in codes(doctor(scaler=torch.amp.GradScaler("cpu", init_scale=512.0), history=history))


def test_fused_optimizer_on_unsupported_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils._foreach_utils as foreach_utils

    model = CleanNet()
    optimizer = torch.optim.Adam(model.parameters(), fused=True)  # CPU fused kernels exist in this torch
    scaler = torch.amp.GradScaler("cpu")
    assert "fused-optimizer-device" not in codes(doctor(model, optimizer, scaler))
    monkeypatch.setattr(foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    (finding,) = [f for f in doctor(model, optimizer, scaler).findings if f.code == "fused-optimizer-device"]
    assert finding.severity == "error" and "cpu" in finding.message and "foreach=True" in finding.fix


def test_history_may_be_an_inspector() -> None:
    class HasHistory:
        history = [record(i, 2.0**-i, True, ["fc"]) for i in range(3)]

    assert "scale-collapse" in codes(doctor(history=HasHistory()))


def test_new_checks_are_registered_with_a_decorator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(findings_module, "CHECKS", list(findings_module.CHECKS))

    @amp_inspect.diagnosis.doctor.check
    def always(setup):
        yield Finding("custom", "info", f"model is {type(setup.model).__name__}")

    assert codes(doctor(CleanNet())) == ["custom"]


def test_report_text_lists_errors_first_with_fixes() -> None:
    model = mlp(width=12).half()
    report = doctor(model, None, None, autocast_dtype=torch.float16)
    assert codes(report) == ["fp16-weights", "no-grad-scaler", "tensor-core-sizes"]
    text = str(report)
    assert text.splitlines()[0] == "amp_inspect doctor: 2 errors, 1 warning"
    assert text.count("fix: ") == 3
    assert text.index("ERROR [fp16-weights]") < text.index("ERROR [no-grad-scaler]") < text.index("WARNING [tensor")
    assert all(len(line) <= 120 for line in text.splitlines())


def test_finding_severity_is_checked() -> None:
    with pytest.raises(ValueError, match="severity"):
        Finding("x", "fatal", "m")


# ---- clipping scaled gradients, in real CPU training steps ----


def train_step(model, optimizer, scaler, *, clip: str, step: int = 0, max_norm: float = 1.0, raise_in=None) -> None:
    """One bf16-autocast step with GradScaler("cpu"); clip "before" or "after" unscale_, or "value" before."""
    torch.manual_seed(step)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    if raise_in == "backward":
        raise RuntimeError("user code failed")
    if clip == "before":
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    elif clip == "value":
        torch.nn.utils.clip_grad.clip_grad_value_(model.parameters(), 0.1)
    scaler.unscale_(optimizer)
    if clip == "after":
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def setup_training(init_scale: float = 2.0**16):
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, optimizer, torch.amp.GradScaler("cpu", init_scale=init_scale)


def clip_findings(watch) -> list:
    """The doctor's words for what the watch saw (its typed evidence, ``watch.scaled_clips``)."""
    return [f for f in doctor(clip_watch=watch).findings if f.code == "clip-before-unscale"]


def test_clip_before_unscale_is_caught() -> None:
    model, optimizer, scaler = setup_training()
    with watch_clipping(scaler) as watch:
        for step in range(3):
            train_step(model, optimizer, scaler, clip="before", step=step)
    assert_originals_restored()
    (clip,) = watch.scaled_clips
    assert (clip.function, clip.calls, clip.scale) == ("clip_grad_norm_", 3, 65536.0)
    (finding,) = clip_findings(watch)
    assert finding.code == "clip-before-unscale" and finding.severity == "error"
    assert "clip_grad_norm_" in finding.message and "65536" in finding.message and "3 calls" in finding.message
    assert "test_doctor.py:" in finding.message
    assert "scaler.unscale_(optimizer); torch.nn.utils.clip_grad_norm_" in finding.fix
    report = doctor(model, optimizer, scaler, autocast_dtype=torch.bfloat16, clip_watch=watch)
    assert "clip-before-unscale" in codes(report) and not report.ok


def test_clip_after_unscale_is_clean() -> None:
    model, optimizer, scaler = setup_training()
    with watch_clipping(scaler, optimizer) as watch:
        for step in range(3):
            train_step(model, optimizer, scaler, clip="after", step=step)
    assert watch.calls == 0 and clip_findings(watch) == []


def test_clip_value_before_unscale_is_caught() -> None:
    model, optimizer, scaler = setup_training()
    with watch_clipping(scaler) as watch:
        train_step(model, optimizer, scaler, clip="value")
    (finding,) = clip_findings(watch)
    assert "clip_grad_value_" in finding.message and "clip_value/65536" in finding.message


def test_clip_at_scale_one_is_harmless() -> None:
    model, optimizer, scaler = setup_training(init_scale=1.0)
    with watch_clipping(scaler) as watch:
        train_step(model, optimizer, scaler, clip="before")
    assert watch.calls == 1 and clip_findings(watch) == []


def test_watch_does_not_change_what_clipping_does() -> None:
    """The watched run (parameters passed as a generator) ends in the same weights as an unwatched one."""
    runs = []
    for watched in (False, True):
        model, optimizer, scaler = setup_training()
        watch = watch_clipping(scaler) if watched else None
        try:
            for step in range(3):
                train_step(model, optimizer, scaler, clip="before", step=step, max_norm=1e-3)
        finally:
            if watch is not None:
                watch.close()
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_owning_optimizer_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two optimizers: clipping the one already unscaled is fine, clipping the other is not."""
    torch.manual_seed(0)
    body, head = nn.Linear(8, 8), nn.Linear(8, 8)
    opt_body, opt_head = torch.optim.SGD(body.parameters(), lr=0.01), torch.optim.SGD(head.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    with watch_clipping(scaler, [opt_body, opt_head]) as watch:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = head(body(torch.randn(4, 8))).float().square().mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt_body)
        torch.nn.utils.clip_grad_norm_(body.parameters(), 1.0)
        assert watch.calls == 0
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        assert watch.calls == 1
        scaler.step(opt_body)
        scaler.step(opt_head)
        scaler.update()


def test_originals_restored_after_an_exception() -> None:
    model, optimizer, scaler = setup_training()
    with pytest.raises(RuntimeError, match="user code failed"), watch_clipping(scaler):
        train_step(model, optimizer, scaler, clip="before", raise_in="backward")
    assert_originals_restored()


def test_close_is_idempotent_and_nested_watches_unwind() -> None:
    _, _, scaler = setup_training()
    outer = watch_clipping(scaler)
    inner = ClipWatch(scaler)
    assert torch.nn.utils.clip_grad_norm_ is torch.nn.utils.clip_grad.clip_grad_norm_  # one wrapper for both names
    outer.close()  # out of order: the inner wrapper stays, outer's passes through
    assert torch.nn.utils.clip_grad_norm_.__wrapped__ is not ORIGINALS[(torch.nn.utils, "clip_grad_norm_")]
    inner.close()
    inner.close()
    outer.close()
    assert_originals_restored()
    assert "closed" in repr(inner)


def test_watch_needs_a_grad_scaler() -> None:
    with pytest.raises(TypeError, match="GradScaler"):
        watch_clipping(object())  # type: ignore[arg-type]


# ---- the command ----


def write_collapsing_log(path) -> None:
    with RunLog(path) as log:
        log.write(
            {
                "step": 0,
                "scale": 65536.0,
                "skipped": False,
                "total_norm": 1.0,
                "offenders": [],
                "headroom": {"up": 2, "down": 9},
                "recommended_scale": 16384.0,
            }
        )
        for step in range(1, 9):
            log.write(
                {
                    "step": step,
                    "scale": 65536.0 / 2**step,
                    "skipped": True,
                    "total_norm": math.nan,
                    "offenders": ["blocks.2.attn", "blocks.2.mlp"],
                    "headroom": {"up": -1, "down": 12},
                    "recommended_scale": None,
                }
            )


def test_main_checks_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "[torch-build]" in out and "[tf32]" in out and "[extension" in out
    assert f"torch {torch.__version__}" in out


def test_main_with_a_collapsing_log(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    write_collapsing_log(log)
    assert main(["--log", str(log)]) == 0  # a collapse is a warning
    out = capsys.readouterr().out
    assert f"run log {log}: 9 inspected steps, 8 skipped" in out
    assert "WARNING [scale-collapse]" in out and "blocks.2.attn" in out and "fix: " in out
    assert main(["--log", str(log), "--strict"]) == 1
    assert main(["--log", str(log), "--collapse-skips", "20"]) == 0
    capsys.readouterr()


def test_main_reports_hardware_from_the_log(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    gib = 1 << 30
    with RunLog(tmp_path / "run.jsonl") as log:
        for step in range(3):
            hardware = {
                "rss_bytes": 2 * gib,
                "torch_peak": (step + 1) * gib,
                "torch_reserved": 4 * gib,
                "gpu_mem_used": (70 + 4 * step) * gib,
                "gpu_mem_total": 80 * gib,
                "gpu_temp": 60 + step,
            }
            log.write(
                {
                    "step": step,
                    "scale": 1024.0,
                    "skipped": False,
                    "total_norm": 1.0,
                    "offenders": [],
                    "headroom": {"up": 3, "down": 9},
                    "hardware": hardware,
                    "hardware_note": "rss_bytes is the peak resident set size",
                }
            )
    assert main(["--log", str(tmp_path / "run.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "torch peak allocated 3.00 GiB" in out and "GPU memory used 78.00 of 80.00 GiB" in out
    assert "GPU temperature 62 C" in out and out.count("rss_bytes is the peak") == 1  # not again for the log
    assert "WARNING [gpu-memory-full] the GPU's memory was 98% used at step 2" in out


def test_main_exit_codes(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["--log", str(tmp_path / "empty.jsonl")]) == 0
    assert "[empty-log]" in capsys.readouterr().out
    broken = [lambda: [Finding("broken", "error", "something is broken", "fix it")]]
    monkeypatch.setattr(findings_module, "ENVIRONMENT_CHECKS", broken)
    assert main([]) == 1
    assert "ERROR [broken] something is broken\n    fix: fix it" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--log" in capsys.readouterr().out


def test_the_doctors_command_line_options_need_no_torch() -> None:
    """amp-inspect builds its parser, the doctor's options included, without importing torch."""
    code = """
import sys
import warnings
sys.modules["torch"] = None  # importing torch now raises ImportError
from amp_inspect.cli import commands as cli
parser = cli.build_parser()
print(parser.parse_args(["doctor", "--collapse-skips", "7"]).collapse_skips)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "7"


def test_a_gpu_the_binary_cannot_run_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor reads the binary's images (sm_80 ... compute_120) the way `amp_inspect.info` does: a Turing
    GPU (7.5) is missing from the default build, an H200 (9.0) and a later Blackwell (12.1) are not."""
    from amp_inspect.core import ops as _ops
    from amp_inspect.diagnosis import environment_checks

    if not _ops.has_kernel("cuda"):
        pytest.skip("built without CUDA kernels")
    gpus = [("Tesla T4", (7, 5)), ("NVIDIA H200", (9, 0)), ("RTX 5090-ish", (12, 1))]
    monkeypatch.setattr(environment_checks, "_gpus", lambda: gpus)
    monkeypatch.setattr(_ops, "build_info", lambda: {"cpu": "1", "cuda": "1", "cuda_archs": "sm_80 sm_90 compute_120"})
    found = {f.code: f for f in environment_checks.extension()}
    assert "cuda-arch-missing" in found
    assert "Tesla T4 (7.5)" in found["cuda-arch-missing"].message
    assert "H200" not in found["cuda-arch-missing"].message and "5090" not in found["cuda-arch-missing"].message


# ---- the multiple-of-8 check sees transformers' Conv1D ----


def sizes_finding(model: nn.Module):
    """The doctor's tensor-core-sizes finding on ``model`` under fp16 autocast, or None."""
    report = amp_inspect.doctor(model, autocast_dtype=torch.float16)
    return next((f for f in report.findings if f.code == "tensor-core-sizes"), None)


def test_doctor_flags_gpt2_conv1d_sizes() -> None:
    finding = sizes_finding(hf_gpt2(n_embd=36))  # 36 and 3 * 36 = 108: not multiples of 8
    assert finding is not None
    for name in ("transformer.h.0.attn.c_attn (Conv1D nx=36, nf=108)", "transformer.h.0.mlp.c_fc (Conv1D nx=36)"):
        assert name in finding.message, finding.message
    assert "transformer.h.0.mlp.c_proj (Conv1D nf=36)" in finding.message


def test_doctor_is_quiet_on_a_gpt2_with_round_sizes() -> None:
    assert sizes_finding(hf_gpt2(n_embd=32)) is None


class Conv1D(nn.Module):
    """A nanoGPT-style copy of transformers' Conv1D (weight [nx, nf])."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.zeros(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, self.nx), self.weight)


def test_doctor_flags_a_copied_conv1d_without_transformers() -> None:
    finding = sizes_finding(nn.Sequential(Conv1D(nf=30, nx=16)))
    assert finding is not None and "0 (Conv1D nf=30)" in finding.message
