"""``amp-inspect demo`` (``make demo``): a small GPT trains under fp16 autocast with a GradScaler and meets the
classic kinds of trouble, on purpose, while amp_inspect watches. It runs the same on a GPU and on a CPU (torch
runs fp16 autocast on both), in seconds on a CPU.

- The loss scale grows every few clean steps (``growth_interval`` is short on purpose) into fp16's ceiling: scaled
  gradients past 65504 overflow, GradScaler skips the step and halves the scale, and grows back into it.
- From step ``trouble_from`` on, one attention block's logits sometimes exceed fp16's 65504 (a batch with a rare
  token makes them spike). The softmax turns the Inf into NaN, GradScaler skips the step and halves the loss
  scale; amp_inspect names the offending module, and its activation hooks, armed after the skip, find the
  module whose forward output went non-finite first.
- Another block's MLP branch is damped more and more over the run: its gradients drift into fp16's
  subnormal range and then to zero.
- On a CPU, one more block's output projection (``blocks.2.mlp.fc2``) is fine-tuned as many recipes do it: its
  weights in bf16 without a master copy, at lr 1e-5. Its updates are rounded away, and ``update_every`` (the
  optimizer's steps measured every 10 steps) says so. (On a GPU it stays fp32: torch's GradScaler cannot unscale
  bf16 gradients on CUDA.)

It prints a live summary and writes ./amp_inspect_demo/ (run.jsonl, report.html and the PNG plots). A folder that
already holds files (an earlier run) is left alone: the demo writes into the next free ``<folder>-2``,
``<folder>-3``, ... and says so.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from amp_inspect.cli.argtypes import DEMO_STEPS, DEMO_TROUBLE_FROM, add_demo_arguments
from amp_inspect.cli.baselines import compare
from amp_inspect.cli.tiny_gpt import TinyGPT
from amp_inspect.inspection.inspector import attach
from amp_inspect.render.console import print_summary
from amp_inspect.runlog.log import read_log

# The model and batch are as small as the story allows: fp16 matmuls on a CPU without fp16 arithmetic are emulated
# (several times slower than float32), and the demo has to run in seconds there.
VOCAB = 256
CONTEXT = 32
WIDTH = 64
BATCH = 4
GROWTH_INTERVAL = 5  # GradScaler doubles the scale after this many clean steps: fp16's ceiling within ~30 steps
SPIKE_TOKEN = 7  # batches holding this token (in the overflowing block's input) make its logits spike
SPIKE_GAIN = 1e5
SPIKE_PROBABILITY = 0.08
LOSSY_LR = 1e-5  # blocks.2.mlp.fc2's learning rate: below half a bf16 ulp of most of its weights
UPDATE_EVERY = 10  # what the optimizer did, measured every 10 steps


@contextmanager
def _one_cpu_thread(device: str) -> Iterator[None]:
    """One intra-op thread on a CPU while the demo trains: its matrices are tiny, and on a busy two-core machine
    every parallel region waits for a core (many times slower than one thread). The caller's setting comes back."""
    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _progress(total: int):
    """A rich progress bar when rich is installed, else a plain line rewritten in place."""
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
        )
        task = progress.add_task("", total=total)

        class Bar:
            def __enter__(self):
                progress.__enter__()
                return self

            def __exit__(self, *exc):
                progress.__exit__(*exc)

            def update(self, text: str) -> None:
                progress.update(task, advance=1, description=text)

            def log(self, text: str) -> None:
                progress.console.print(text, markup=False, emoji=False)  # module names are printed literally

        return Bar()
    except ImportError:

        class Plain:
            done = 0

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                print()

            def update(self, text: str) -> None:
                self.done += 1
                print(f"\rtraining {self.done}/{total} {text}", end="", flush=True)

            def log(self, text: str) -> None:
                print(f"\n{text}")

        return Plain()


def fresh_folder(out_dir: Path) -> Path:
    """``out_dir`` if it is absent or empty, else the first absent or empty ``<out_dir>-N`` (N = 2, 3, ...): an
    earlier run's log, report and plots are never overwritten."""
    candidate, n = Path(out_dir), 1
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        n += 1
        candidate = out_dir.with_name(f"{out_dir.name}-{n}")
    return candidate


def run(
    steps: int = DEMO_STEPS,
    out_dir: Path = Path("amp_inspect_demo"),
    trouble_from: int = DEMO_TROUBLE_FROM,
    seed: int = 0,
    device: str | None = None,
) -> Path:
    """Trains the demo model and returns the path of its run log (in ``fresh_folder(out_dir)``). ``device``:
    ``"cuda"`` or ``"cpu"``; None picks CUDA when it is available (the figures the docs quote are the CPU's)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(trouble_from, bool) or not isinstance(trouble_from, int) or trouble_from < 0:
        raise ValueError(f"trouble_from must be an int >= 0, got {trouble_from!r}")
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device must be 'cuda', 'cpu' or None, got {device!r}")
    out_dir = Path(out_dir)
    chosen = fresh_folder(out_dir)
    if chosen != out_dir:
        print(f"{out_dir} holds an earlier run (kept as it is); writing to {chosen}")
        out_dir = chosen
    torch.manual_seed(seed)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    amp_dtype = torch.float16
    # The attention logits are a module of their own (attn.scores), so they can spike and the hooks can name them.
    model = TinyGPT(VOCAB, CONTEXT, WIDTH, explicit_scores=True).to(device)
    spiking = model.blocks[3].attn.scores
    damped = model.blocks[1]
    lossy = model.blocks[2].mlp.fc2  # bf16 weights, no master copy, a fine-tuning learning rate: updates lost
    if device == "cpu":
        lossy.to(torch.bfloat16)
    lossy_ids = {id(p) for p in lossy.parameters()}
    groups = [
        {"params": [p for p in model.parameters() if id(p) not in lossy_ids]},
        {"params": list(lossy.parameters()), "lr": LOSSY_LR},
    ]
    opt = torch.optim.AdamW(groups, lr=3e-4)
    scaler = torch.amp.GradScaler(device, growth_interval=GROWTH_INTERVAL)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "run.jsonl"  # out_dir is new or empty: nothing to overwrite
    insp = attach(model, scaler, log=log_path, hist_every=5, optimizer=opt, update_every=UPDATE_EVERY)

    numel = sum(p.numel() for p in model.parameters())
    print(f"amp_inspect demo: TinyGPT with {numel:,} parameters, {steps} steps on {device}, {amp_dtype} autocast")
    print("logit spikes planted from step", trouble_from)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    with _one_cpu_thread(device), _progress(steps) as bar:
        for step in range(steps):
            idx = torch.randint(8, VOCAB, (BATCH, CONTEXT), generator=g)
            spike = step >= trouble_from and torch.rand((), generator=g).item() < SPIKE_PROBABILITY
            if spike:
                idx[0, torch.randint(0, CONTEXT, (4,), generator=g)] = SPIKE_TOKEN
            idx = idx.to(device)
            spiking.gain = SPIKE_GAIN if bool((idx == SPIKE_TOKEN).any()) else 1.0
            damped.mlp_gain = 1e-2 * (1e-5) ** (step / steps)  # drifts from 1e-2 down to 1e-7

            with torch.autocast(device, dtype=amp_dtype):
                logits = model(idx[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
            scaler.scale(loss).backward()
            report = insp.check()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

            if report is not None and report.found_inf:
                where = ", ".join(report.offenders[:3])
                bar.log(f"step {step}: skipped at loss scale {report.scale:g}; NaN/Inf gradients in {where}, ...")
            last = insp.history[-1] if step % 10 == 0 or step == steps - 1 else None
            if last is not None and last.first_nonfinite:
                bar.log(f"  first non-finite producer: {last.first_nonfinite}")
            bar.update(f"scale {scaler.get_scale():g}")
    elapsed = time.perf_counter() - start
    insp.close()

    records = read_log(log_path)
    print(f"\n{steps} steps in {elapsed:.1f} s")
    print_summary(insp.summary(), records[-1] if records else None)
    findings = sorted({r["first_nonfinite"] for r in records if r.get("first_nonfinite")})
    for f in findings[:3]:
        print(f"activation hooks: {f}")
    _write_report(log_path, out_dir)
    _compare_with_python_checks(model)
    insp.detach()
    return log_path


def _write_report(log_path: Path, out_dir: Path) -> None:
    try:
        from amp_inspect.render.html_report import write_report
    except ImportError as error:  # matplotlib is an optional extra
        print(f"report not written ({error}); pip install amp_inspect[report]")
        return
    html = write_report(log_path, out_dir / "report.html")
    print(f"report: {html} (plots beside it); log: {log_path}")


def _compare_with_python_checks(model: nn.Module) -> None:
    """Times one fused pass against the per-parameter checks people write today, on fresh gradients."""
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    ms = compare([p.grad for p in model.parameters()])
    print(
        f"one fused pass: {ms['fused']:.2f} ms (one read of the gradients: {ms['foreach_norm']:.2f} ms); "
        f"per-parameter Python checks (10 .item() per tensor): {ms['per_tensor_python']:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="amp-inspect demo", description=__doc__.splitlines()[0])
    add_demo_arguments(parser)
    args = parser.parse_args(argv)
    run(args.steps, args.out, args.trouble_from)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
