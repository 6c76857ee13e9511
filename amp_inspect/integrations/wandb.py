"""Weights & Biases: amp_inspect's step reports as logged values and exponent histograms.

Usage::

    import wandb
    from amp_inspect.integrations import WandbLogger

    run = wandb.init(project="amp")
    insp = amp_inspect.attach(model, scaler)
    WandbLogger(run, log_every=10, hist_every=100).attach(insp)

Each report becomes one ``run.log({...}, step=report.step)`` with the keys of the TensorBoard integration
(amp_inspect/integrations/tensorboard.py; terms in amp_inspect/integrations/_common.py):
``amp_inspect/loss_scale``, ``skipped``, ``total_norm``, ``headroom_up``, ``headroom_down``,
``recommended_scale_log2``, ``nonfinite``; ``amp_inspect/{overflow_frac,underflow_frac,subnormal_frac,
nonfinite}/<module>`` for up to ``top_modules`` troubled modules; and on ``hist_every`` steps
``amp_inspect/exponent/<module>`` as ``wandb.Histogram(np_histogram=(counts, edges))`` over the span of
nonzero exponent bins, x = log2|v| of the judged (scaled) gradient, bin e = [e - 127, e - 126).

NaN/Inf are kept: wandb's own gradient histograms (``wandb.watch``) drop non-finite values, so a step full of
NaN looks empty there. Here their count is the histogram's last bin, [128, 129) (past every finite
float32), and also the separate key ``amp_inspect/nonfinite/<module>``.

Steps: wandb keeps a run's steps increasing; a ``run.log`` with a smaller step than the run's current one is
dropped with a warning. Log your own metrics at the same step numbers (optimizer steps from 0), or pass
``step=False`` to log without a step (at wandb's own counter).

Host syncs: ``log(report)`` reads the report's values, which waits for its device copies on CUDA; pass a
report whose ``ready()`` is True, or use ``attach(inspector)``, which logs each report when the Inspector
finalizes it (its statistics already on the host, normally one step behind on CUDA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amp_inspect.integrations._common import require
from amp_inspect.integrations._report_logger import ReportLogger

wandb = require("wandb", "wandb", "WandbLogger")

if TYPE_CHECKING:
    from amp_inspect.gradients.step_report import StepReport


class WandbLogger(ReportLogger):
    """Logs StepReports to a wandb run (see the module docstring for the keys and the histogram axis).

    Args:
        run: the run to log to; None uses ``wandb.run`` (the run of ``wandb.init``) at each log.
        log_every: scalars for reports whose step is divisible by N.
        hist_every: exponent histograms for reports whose step is divisible by N; 0 turns them off.
        top_modules: at most this many modules get per-module values and histograms.
        step: pass ``step=report.step`` to ``run.log`` (True) or leave the step to wandb (False).

    Example::

        run = wandb.init(mode="offline")
        logger = WandbLogger(run, hist_every=1)
        logger.log(insp.check())   # reads the report now: waits for the device on CUDA

    With ``attach(inspector)``, call ``flush()`` before ``run.finish()``: it logs the reports still in flight.
    """

    def __init__(
        self,
        run: Any = None,
        *,
        log_every: int = 1,
        hist_every: int = 100,
        top_modules: int = 10,
        step: bool = True,
    ) -> None:
        super().__init__(log_every=log_every, hist_every=hist_every, top_modules=top_modules)
        self.run = run
        self.step = step

    def payload(self, report: StepReport) -> dict[str, Any]:
        """The dict ``log`` passes to ``run.log`` for this report (empty on steps it leaves out)."""
        scalars, histograms = self.tagged_values(report)
        out: dict[str, Any] = dict(scalars)
        for tag, (counts, edges) in histograms.items():
            out[tag] = wandb.Histogram(np_histogram=(counts, edges))
        return out

    def log(self, report: StepReport) -> None:
        """Logs one report with ``run.log(payload, step=report.step)``.

        Reads the report's values: waits for its device copies on CUDA unless ``report.ready()``.
        """
        payload = self.payload(report)
        if not payload:
            return
        run = self.run if self.run is not None else wandb.run
        if run is None:
            raise RuntimeError("WandbLogger: no run to log to; call wandb.init() or pass run=")
        if self.step:
            run.log(payload, step=report.step)
        else:
            run.log(payload)


__all__ = ["WandbLogger"]
