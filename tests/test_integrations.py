"""Integrations (amp_inspect/integrations/): TensorBoard and wandb read back from what they wrote, Lightning and
transformers' Trainer on CPU with real training loops. Each optional package is imported once, in a fixture,
and its tests skip when it is missing. Nothing is downloaded: wandb runs offline, the models are nn.Modules.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.diagnosis.incident import weight_poisoning
from amp_inspect.integrations._common import exponent_edges, exponent_span, on_finalized

POISON_AT = 4  # the step (0-based) whose gradients get NaN/Inf in the training-loop tests
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


# ---- a model and one inspected step ----


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.embed = nn.Linear(8, 16)
            self.hidden = nn.Linear(16, 16)
            self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(torch.relu(self.embed(x))))).squeeze(-1)


def inspected_step(insp: amp_inspect.Inspector, model: Net, scaler: torch.amp.GradScaler | None, poison: bool):
    """Forward, backward, optional NaN/Inf in hidden.weight and a tiny head.bias gradient, check()."""
    x = torch.randn(4, 8)
    loss = model(x).square().mean()
    (scaler.scale(loss) if scaler is not None else loss).backward()
    with torch.no_grad():
        model.head.bias.grad.fill_(2.0**-20)  # as stored (scaled, before unscale_): an fp16 subnormal
        if poison:
            model.hidden.weight.grad[0, 0] = math.nan
            model.hidden.weight.grad[1, :3] = math.inf
    report = insp.check()
    model.zero_grad()
    return report


class CollectSteps:
    """A stand-in for an amp_inspect logger passed as ``loggers=``: records the steps of finalized reports."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def attach(self, inspector: amp_inspect.Inspector) -> CollectSteps:
        on_finalized(inspector, lambda report: self.steps.append(report.step))
        return self


# ---- package hygiene ----


def run_python(code: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=cwd, env=env
    ).stdout


def test_import_imports_no_optional_package_and_missing_ones_name_the_extra(tmp_path) -> None:
    code = """
import sys
import amp_inspect, amp_inspect.integrations
heavy = ("tensorboard", "wandb", "lightning", "pytorch_lightning", "transformers", "accelerate")
print("loaded:", [m for m in heavy if m in sys.modules])
for name in ("torch.utils.tensorboard", "wandb", "lightning", "pytorch_lightning", "transformers"):
    sys.modules[name] = None  # importing it now raises ImportError
from amp_inspect.integrations import TensorBoardLogger
for attempt in ("TensorBoardLogger('unused_dir')", "amp_inspect.integrations.WandbLogger",
                "amp_inspect.integrations.AmpInspectCallback", "amp_inspect.integrations.AmpInspectTrainerCallback"):
    try:
        eval(attempt)
        print("no error:", attempt)
    except ImportError as error:
        print("error:", error)
"""
    out = run_python(code, cwd=tmp_path)
    lines = out.splitlines()
    assert lines[0] == "loaded: []", out
    extras = ("tensorboard", "wandb", "lightning", "hf")
    assert len(lines) == 5, out
    for line, extra in zip(lines[1:], extras, strict=True):
        assert line.startswith("error:") and f"pip install amp_inspect[{extra}]" in line, out
    assert not (tmp_path / "unused_dir").exists()


def test_lightning_callback_falls_back_to_pytorch_lightning(tmp_path) -> None:
    pytest.importorskip("pytorch_lightning")
    code = """
import sys
sys.modules["lightning"] = None  # only pytorch_lightning installed
from amp_inspect.integrations import AmpInspectCallback
print([base.__module__.split(".")[0] for base in AmpInspectCallback.__mro__[1:2]])
"""
    assert run_python(code, cwd=tmp_path).strip() == "['pytorch_lightning']"


# ---- TensorBoard ----


@pytest.fixture(scope="module")
def tb():
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from amp_inspect.integrations.tensorboard import TensorBoardLogger

    return SummaryWriter, EventAccumulator, TensorBoardLogger


def read_events(event_accumulator, logdir) -> object:
    acc = event_accumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_tensorboard_scalars_and_histograms_read_back(tb, tmp_path) -> None:
    summary_writer, event_accumulator, logger_cls = tb
    model = Net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    insp = amp_inspect.attach(model, scaler, activations="off")
    report = inspected_step(insp, model, scaler, poison=True)
    writer = summary_writer(str(tmp_path))
    logger = logger_cls(writer, hist_every=1, top_modules=2)
    logger.log(report)
    writer.close()
    acc = read_events(event_accumulator, tmp_path)

    def scalar(tag: str) -> float:
        (event,) = acc.Scalars(tag)
        assert event.step == report.step
        return event.value

    assert scalar("amp_inspect/loss_scale") == 2.0**10
    assert scalar("amp_inspect/skipped") == 1.0
    assert math.isnan(scalar("amp_inspect/total_norm"))  # NaN present: like clip_grad_norm_
    assert scalar("amp_inspect/headroom_up") == report.headroom.up
    assert scalar("amp_inspect/headroom_down") == report.headroom.down
    assert scalar("amp_inspect/recommended_scale_log2") == math.log2(report.recommended_scale)
    hidden = report.by_module["hidden"]
    assert hidden["nan"] == 1 and hidden["posinf"] == 3
    assert scalar("amp_inspect/nonfinite") == 4
    assert scalar("amp_inspect/nonfinite/hidden") == 4
    head = report.by_module["head"]
    assert head["numel"] == 17 and head["subnormal"] >= 1  # the bias
    assert scalar("amp_inspect/subnormal_frac/head") == pytest.approx(head["subnormal"] / 17)
    # top_modules=2: hidden (NaN/Inf) and head (subnormal) have trouble, embed has none
    scalar_tags = acc.Tags()["scalars"]
    assert not any(tag.endswith("/embed") and "frac" in tag for tag in scalar_tags)

    histogram_tags = set(acc.Tags()["histograms"])
    assert histogram_tags == {"amp_inspect/exponent/(all)", "amp_inspect/exponent/hidden", "amp_inspect/exponent/head"}
    for name in ("(all)", "hidden", "head"):
        modules = list(report.by_module) if name == "(all)" else [name]
        hist = sum(report.module_hist(m) for m in modules)
        (event,) = acc.Histograms(f"amp_inspect/exponent/{name}")
        value = event.histogram_value
        first, last = exponent_span(hist)
        assert list(value.bucket) == hist[first : last + 1].tolist()
        assert list(value.bucket_limit) == exponent_edges(first, last)[1:].tolist()
        assert value.num == hist.sum() == sum(report.by_module[m]["numel"] for m in modules)
        assert value.min == first - 127 and value.max == last - 126
        nonfinite = hist[255]
        assert scalar(f"amp_inspect/nonfinite/{name}") == nonfinite
        if name in ("(all)", "hidden"):
            assert nonfinite == 4 and last == 255  # NaN/Inf: the last bucket, limit 129
            assert value.bucket_limit[-1] == 129 and value.bucket[-1] == 4
        else:
            assert nonfinite == 0 and value.bucket_limit[-1] < 128
    # head.bias: 2^-20 judged (scaled, as stored): exponent bin 107, the bucket (-20, -19]
    (head_event,) = acc.Histograms("amp_inspect/exponent/head")
    limits = list(head_event.histogram_value.bucket_limit)
    assert head_event.histogram_value.bucket[limits.index(-19.0)] >= 1


def test_tensorboard_attach_logs_finalized_reports_every_n(tb, tmp_path) -> None:
    _, event_accumulator, logger_cls = tb
    model = Net()
    insp = amp_inspect.attach(model, activations="off")
    logger = logger_cls(tmp_path / "run", log_every=2, hist_every=3).attach(insp)
    for step in range(6):
        inspected_step(insp, model, None, poison=step == 3)
    logger.close()
    insp.detach()
    acc = read_events(event_accumulator, tmp_path / "run")
    assert [e.step for e in acc.Scalars("amp_inspect/skipped")] == [0, 2, 4]
    assert [e.step for e in acc.Histograms("amp_inspect/exponent/(all)")] == [0, 3]
    assert [e.value for e in acc.Scalars("amp_inspect/nonfinite/(all)")] == [0, 4]  # hist steps 0 and 3
    assert "amp_inspect/loss_scale" not in acc.Tags()["scalars"]  # no scaler
    assert "_finalize" not in vars(insp)  # detach removed the sink


# ---- wandb ----


def read_wandb_records(path: str) -> list:
    """The protobuf Records of an offline run's .wandb file (a LevelDB-style log of records in 32 KiB blocks
    after a 7-byte header), parsed with wandb's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        data = file.read()
    block, pos, raw_records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # full record, or the last fragment of one
            raw_records.append(pending)
    records = []
    for raw in raw_records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def read_wandb_history(run_dir: str, timeout_s: float = 30.0) -> list[dict[str, object]]:
    """The history rows of a finished offline run. wandb-core writes the file asynchronously: run.finish()
    can return before the records reach it, so this waits for the run's exit record."""
    import json
    import time

    (path,) = glob.glob(os.path.join(run_dir, "*.wandb"))
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


def test_wandb_offline_keeps_nonfinite_counts(tmp_path) -> None:
    wandb = pytest.importorskip("wandb")
    from amp_inspect.integrations.wandb import WandbLogger

    model = Net()
    insp = amp_inspect.attach(model, activations="off")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="amp_inspect_test")
    logged = []
    real_log = run.log

    def capture(data, *args, **kwargs):
        logged.append((dict(data), kwargs.get("step")))
        return real_log(data, *args, **kwargs)

    run.log = capture
    try:
        logger = WandbLogger(run, hist_every=2).attach(insp)
        reports = [inspected_step(insp, model, None, poison=step == 2) for step in range(3)]
        logger.flush()
    finally:
        run.finish()
    assert [step for _, step in logged] == [0, 1, 2]
    payload = logged[2][0]
    assert payload["amp_inspect/nonfinite"] == 4 and payload["amp_inspect/nonfinite/hidden"] == 4
    assert payload["amp_inspect/skipped"] == 0.0 and payload["amp_inspect/poisoned"] == 1.0  # no scaler: applied
    assert "amp_inspect/exponent/hidden" in payload and "amp_inspect/exponent/hidden" not in logged[1][0]

    rows = {row["_step"]: row for row in read_wandb_history(os.path.dirname(run.dir))}
    assert sorted(rows) == [0, 1, 2]
    row = rows[2]
    assert row["amp_inspect/poisoned"] == 1 and row["amp_inspect/nonfinite"] == 4
    assert row["amp_inspect/nonfinite/hidden"] == 4 and row["amp_inspect/nonfinite/(all)"] == 4
    hist = reports[2].module_hist("hidden")
    first, last = exponent_span(hist)
    assert row["amp_inspect/exponent/hidden/_type"] == "histogram"
    assert row["amp_inspect/exponent/hidden/values"] == hist[first : last + 1].tolist()
    assert row["amp_inspect/exponent/hidden/bins"] == exponent_edges(first, last).tolist()
    assert row["amp_inspect/exponent/hidden/values"][-1] == 4  # NaN/Inf: the last bin, [128, 129)
    assert row["amp_inspect/exponent/hidden/bins"][-2:] == [128, 129]
    assert rows[1]["amp_inspect/poisoned"] == 0 and "amp_inspect/exponent/hidden/values" not in rows[1]


# ---- Lightning ----


@pytest.fixture(scope="module")
def lightning():
    pl = pytest.importorskip("lightning.pytorch")
    from amp_inspect.integrations.lightning import AmpInspectCallback

    class LitNet(pl.LightningModule):
        """Net under the name "net"; at POISON_AT, NaN/Inf go into head's gradient after backward."""

        def __init__(self) -> None:
            super().__init__()
            self.net = Net()
            self.grad_norms: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).float(), y)

        def on_after_backward(self) -> None:
            if self.global_step == POISON_AT:
                with torch.no_grad():
                    self.net.head.weight.grad[0, 0] = math.nan
                    self.net.head.weight.grad[0, 1] = math.inf

        def on_before_optimizer_step(self, optimizer) -> None:
            # after Lightning's unscale_ (16-mixed), after the callbacks' hook: the gradients the optimizer gets
            grads = [p.grad.double().flatten() for p in self.parameters()]
            self.grad_norms.append(torch.linalg.vector_norm(torch.cat(grads)).item())
            for p in self.parameters():  # keep the weights finite after the poisoned step (no scaler to skip it)
                p.grad.nan_to_num_(0.0, 0.0, 0.0)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return pl, AmpInspectCallback, LitNet


def lightning_data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(-1)), batch_size=4)


def fit_lightning(lightning, tmp_path, loggers=(), callback_options=None, **trainer_kwargs):
    pl, callback_cls, lit_cls = lightning
    from lightning.pytorch.loggers import CSVLogger

    cb = callback_cls(activations="off", loggers=loggers, **(callback_options or {}))
    options = dict(accelerator="cpu", max_steps=10, enable_checkpointing=False, enable_progress_bar=False)
    options.update(enable_model_summary=False, log_every_n_steps=1, logger=CSVLogger(tmp_path, name="csv"))
    trainer = pl.Trainer(callbacks=[cb], **options, **trainer_kwargs)
    module = lit_cls()
    trainer.fit(module, lightning_data())
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as file:
        rows = list(csv.DictReader(file))
    return trainer, cb, rows, module


def logged_column(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(row[key]) for row in rows if row.get(key)]


def test_lightning_bf16_mixed_cpu(lightning, tmp_path) -> None:
    collect = CollectSteps()
    trainer, cb, rows, _ = fit_lightning(lightning, tmp_path, loggers=[collect], precision="bf16-mixed")
    history = cb.inspector.history
    assert [r.step for r in history] == list(range(10)) == collect.steps
    assert cb.inspector.scaler is None  # bf16-mixed: no GradScaler
    assert set(cb.inspector.last_report.by_module) == {"net.embed", "net.hidden", "net.head"}
    assert not any(r.poisoned or r.skipped for r in history[:POISON_AT])
    # bf16 without a GradScaler: nothing skips the NaN step, the optimizer applies it (poisoned, not skipped)
    assert history[POISON_AT].poisoned and history[POISON_AT].offenders == ["net.head"]
    assert not any(r.skipped for r in history)
    assert history[POISON_AT].scale is None
    # Judged against bf16, the format the trainer's autocast runs (no formats= given), and the weights read after
    # the NaN step (finite: the module cleans the gradients the optimizer gets) poison nothing.
    assert {r.fmt for r in history} == {"bf16"}
    assert history[POISON_AT].weights is not None and history[POISON_AT].weights.finite
    assert weight_poisoning(history) is None
    poisoned = logged_column(rows, "amp_inspect/poisoned")  # one per step: the newest finalized report
    assert len(poisoned) == 10 and poisoned[:POISON_AT] == [0.0] * POISON_AT and poisoned[POISON_AT] == 1.0
    assert logged_column(rows, "amp_inspect/skipped") == [0.0] * 10
    assert "amp_inspect/loss_scale" not in rows[0]
    assert "_finalize" not in vars(cb.inspector)  # detached at fit end


def test_lightning_checkpoint_of_poisoned_weights_is_warned_about(lightning, tmp_path) -> None:
    """bf16-mixed, no scaler, the NaN step applied (the gradients left as they are): the checkpoint saved after it
    holds NaN weights, and the callback says so when Lightning saves it, naming the step that made them."""
    pl, callback_cls, lit_cls = lightning
    from amp_inspect.integrations._common import PoisonedCheckpointWarning

    class Applied(lit_cls):
        def on_before_optimizer_step(self, optimizer) -> None:
            pass  # nothing cleans the NaN gradients: the optimizer applies them

    cb = callback_cls(activations="off")
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=POISON_AT + 2)
    trainer = pl.Trainer(
        callbacks=[cb, saver],
        accelerator="cpu",
        max_steps=POISON_AT + 2,
        precision="bf16-mixed",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    with pytest.warns(PoisonedCheckpointWarning, match=f"became NaN/Inf at step {POISON_AT + 1}.*net.head"):
        trainer.fit(Applied(), lightning_data())
    assert list((tmp_path / "ckpt").iterdir())  # saved all the same: the warning says what it holds


@pytest.mark.filterwarnings("ignore:amp_inspect. no compiled update_stats kernel:RuntimeWarning")
def test_lightning_update_every_measures_the_trainers_optimizer(lightning, tmp_path) -> None:
    _, cb, _, module = fit_lightning(lightning, tmp_path, callback_options={"update_every": 3}, precision="bf16-mixed")
    measured = [r.step for r in cb.inspector.history if r.update is not None and r.update.by_module]
    assert measured[:2] == [0, 3]  # the NaN step's update is measured too (it was applied)
    assert set(cb.inspector.last_update.by_module) == {"net.embed", "net.hidden", "net.head"}


def test_lightning_16_mixed_cpu_grad_scaler(lightning, tmp_path) -> None:
    # Trainer(precision="16-mixed") on CPU turns into bf16-mixed; the plugin with a CPU GradScaler is fp16 AMP.
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    trainer, cb, rows, module = fit_lightning(lightning, tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    assert cb.inspector.scaler is scaler
    history = cb.inspector.history
    assert len(history) == 10
    assert [r.skipped for r in history] == [step == POISON_AT for step in range(10)]
    assert history[POISON_AT].offenders == ["net.head"]
    assert history[POISON_AT].scale == 2.0**8 and history[POISON_AT + 1].scale == 2.0**7  # backoff after the skip
    # checked after Lightning's unscale_: judged multiplied back by the scale, and the norm is the unscaled one
    for record, norm in zip(history, module.grad_norms, strict=True):
        if not record.skipped:
            assert record.total_norm == pytest.approx(norm, rel=1e-5)
    assert logged_column(rows, "amp_inspect/loss_scale")[POISON_AT : POISON_AT + 2] == [2.0**8, 2.0**7]
    assert logged_column(rows, "amp_inspect/skipped")[POISON_AT] == 1.0


@pytest.mark.cuda
def test_lightning_16_mixed_cuda(lightning, tmp_path) -> None:
    trainer, cb, rows, _ = fit_lightning(lightning, tmp_path, accelerator="gpu", devices=1, precision="16-mixed")
    assert cb.inspector.scaler is trainer.precision_plugin.scaler is not None
    history = cb.inspector.history
    assert len(history) == 10 and "net.head" in history[POISON_AT].offenders  # default scale: more may overflow
    assert logged_column(rows, "amp_inspect/skipped").count(1.0) >= 1


# ---- transformers Trainer ----


class HFNet(nn.Module):
    """Net returning {"loss": ...}; at forward call POISON_AT, NaN goes into hidden.weight's gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.calls = 0
        self.net.hidden.weight.register_hook(self._poison)

    def _poison(self, grad: torch.Tensor) -> torch.Tensor:
        if self.calls - 1 == POISON_AT:
            grad = grad.clone()
            grad[0, 0] = math.nan
        return grad

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"loss": nn.functional.mse_loss(self.net(x).float(), y)}


class HFData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return {"x": x, "y": x.sum()}


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from amp_inspect.integrations.hf import AmpInspectTrainerCallback

    return transformers, AmpInspectTrainerCallback


def hf_trainer(hf, tmp_path, callbacks=(), **args):
    transformers, _ = hf
    options = dict(output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=4, report_to=[], use_cpu=True)
    options.update(bf16=True, logging_steps=2, save_strategy="no", disable_tqdm=True, learning_rate=1e-3)
    options.update(args)
    training_args = transformers.TrainingArguments(**options)
    return transformers.Trainer(model=HFNet(), args=training_args, train_dataset=HFData(), callbacks=list(callbacks))


MODULES = {"net.embed", "net.hidden", "net.head"}


def test_hf_trainer_callback_history_and_logs(hf, tmp_path) -> None:
    transformers, callback_cls = hf
    collect = CollectSteps()
    cb = callback_cls(activations="off", loggers=[collect])
    trainer = hf_trainer(hf, tmp_path, callbacks=[cb])
    trainer.train()
    history = cb.inspector.history
    assert [r.step for r in history] == list(range(8)) == collect.steps
    assert cb.inspector.scaler is None  # bf16 on CPU: no GradScaler
    # The Trainer clips to max_grad_norm (1.0 by default): every record says so, and the run is judged as bf16.
    assert {r.clip_norm for r in history} == {1.0} and {r.fmt for r in history} == {"bf16"}
    assert set(cb.inspector.last_report.by_module) == MODULES
    entries = [e for e in trainer.state.log_history if "amp_inspect/skipped" in e]
    assert [e["step"] for e in entries] == [2, 4, 6, 8]
    for entry in entries:  # on CPU the newest finalized report is the current step's: global step k, report k - 1
        record = history[entry["step"] - 1]
        assert entry["amp_inspect/skipped"] == 0.0  # bf16, no GradScaler: nothing is skipped
        assert entry["amp_inspect/poisoned"] == float(record.poisoned)
        assert entry["amp_inspect/total_norm"] == pytest.approx(record.total_norm, nan_ok=True)
        assert "amp_inspect/headroom_up" in entry or record.poisoned
    # Trainer(callbacks=[cb]) checks in on_pre_optimizer_step: after the Trainer's clip_grad_norm_, which
    # multiplied every gradient by NaN: the NaN of one module shows up in all of them.
    assert history[POISON_AT].poisoned and set(history[POISON_AT].offenders) == MODULES
    assert [e["amp_inspect/skipped_steps"] for e in entries] == [0, 0, 0, 0]
    assert [e["amp_inspect/poisoned_steps"] for e in entries] == [0, 0, 2, 2]  # NaN weights after the poisoned step
    assert entries[0]["grad_norm"] > 1.0 and entries[0]["amp_inspect/total_norm"] == pytest.approx(1.0)  # clipped
    assert "_finalize" not in vars(cb.inspector)  # detached at train end


@pytest.mark.filterwarnings("ignore:amp_inspect. no compiled update_stats kernel:RuntimeWarning")
def test_hf_trainer_update_every_measures_the_trainers_optimizer(hf, tmp_path) -> None:
    _, callback_cls = hf
    cb = callback_cls(activations="off", update_every=4)
    hf_trainer(hf, tmp_path, callbacks=[cb]).train()
    measured = [r.step for r in cb.inspector.history if r.update is not None and r.update.by_module]
    assert measured == [0, 4]
    assert set(cb.inspector.last_update.by_module) == MODULES


def test_hf_trainer_install_judges_before_clipping(hf, tmp_path) -> None:
    transformers, callback_cls = hf
    seen: list[dict] = []

    class Later(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    trainer = hf_trainer(hf, tmp_path, callbacks=[Later()], max_steps=POISON_AT + 2)
    cb = callback_cls(activations="off").install(trainer)
    assert trainer.callback_handler.callbacks[0] is cb
    trainer.train()
    history = cb.inspector.history
    assert len(history) == POISON_AT + 2
    assert not any(r.skipped for r in history[:POISON_AT])
    assert history[POISON_AT].offenders == ["net.hidden"]  # judged before the clipping spread the NaN
    logged = [logs for logs in seen if "amp_inspect/skipped" in logs]  # callbacks after this one get the keys
    assert len(logged) == 3
    for logs in logged[:2]:  # the norm before clipping: the one the Trainer logs as grad_norm
        assert logs["amp_inspect/total_norm"] == pytest.approx(logs["grad_norm"], rel=1e-5)
    cb.uninstall()
    assert cb not in trainer.callback_handler.callbacks and "clip_grad_norm_" not in vars(trainer.accelerator)


@pytest.mark.cuda
def test_hf_trainer_fp16_cuda_finds_the_scaler(hf, tmp_path) -> None:
    _, callback_cls = hf
    cb = callback_cls(activations="off")
    trainer = hf_trainer(hf, tmp_path, callbacks=[cb], use_cpu=False, bf16=False, fp16=True)
    trainer.train()
    assert cb.inspector.scaler is trainer.accelerator.scaler is not None
    history = cb.inspector.history
    assert len(history) == 8 and history[0].scale is not None
    assert any("amp_inspect/loss_scale" in e for e in trainer.state.log_history)


def test_lightning_16_mixed_cpu_inspecting_grad_scaler_logs_the_current_step(lightning, tmp_path) -> None:
    # The scaler's report reaches the history at scaler.update(), after on_before_optimizer_step: on CPU the
    # callback still logs each step's own values, the last step included.
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**8)
    trainer, cb, rows, module = fit_lightning(lightning, tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    history = cb.inspector.history
    assert [r.skipped for r in history] == [step == POISON_AT for step in range(10)]
    skipped = logged_column(rows, "amp_inspect/skipped")
    assert skipped == [float(step == POISON_AT) for step in range(10)]
    scales = logged_column(rows, "amp_inspect/loss_scale")
    assert scales == [r.scale for r in history]


# ---- attach()'s options, defined once (amp_inspect/inspection/options.py) ----


def test_attach_the_inspector_and_both_callbacks_take_every_attach_option_with_one_default(lightning, hf) -> None:
    import dataclasses
    import inspect

    from amp_inspect.inspection.options import AttachOptions

    defaults = {f.name: f.default for f in dataclasses.fields(AttachOptions)}
    for takes in (amp_inspect.attach, amp_inspect.Inspector, lightning[1], hf[1]):
        parameters = inspect.signature(takes).parameters
        assert {name: parameters[name].default for name in defaults} == defaults, takes
        assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in defaults), takes
        assert "collapse_skips:" in (takes.__init__ if isinstance(takes, type) else takes).__doc__


def test_callbacks_check_the_options_when_made_and_hand_all_of_them_to_the_inspector(lightning, hf) -> None:
    from types import SimpleNamespace

    lightning_cb, hf_cb = lightning[1], hf[1]
    for callback_cls in (lightning_cb, hf_cb):
        with pytest.raises(ValueError, match="every must be a positive int"):
            callback_cls(every=0)
        with pytest.raises(TypeError, match="unexpected keyword argument 'colapse_skips'"):
            callback_cls(colapse_skips=7)
    lit = lightning_cb(activations="off", collapse_skips=7, arm_steps=2, log_every=0)
    lit.on_fit_start(SimpleNamespace(precision_plugin=SimpleNamespace(scaler=None)), Net())
    hug = hf_cb(activations="off", collapse_skips=7, arm_steps=2)
    hug.on_train_begin(None, None, None, model=Net())
    for cb in (lit, hug):
        assert cb.inspector.options == cb.options
        assert (cb.inspector.collapse_skips, cb.inspector.arm_steps, cb.inspector.activations) == (7, 2, "off")
        cb.inspector.detach()
