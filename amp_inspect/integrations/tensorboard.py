"""TensorBoard: amp_inspect's step reports as scalars and exponent histograms.

Usage::

    from amp_inspect.integrations import TensorBoardLogger

    insp = amp_inspect.attach(model, scaler)
    tb = TensorBoardLogger("runs/amp", log_every=10, hist_every=100).attach(insp)
    ...                                  # train: insp.check() each step, as usual
    tb.close()

What is written (global step = the report's step; terms in amp_inspect/integrations/_common.py):

- ``amp_inspect/loss_scale``, ``skipped``, ``total_norm``, ``headroom_up``, ``headroom_down``,
  ``recommended_scale_log2``, and ``amp_inspect/nonfinite`` (NaN and Inf gradient elements of the step).
- Per module, for up to ``top_modules`` modules with trouble: ``amp_inspect/overflow_frac/<module>``,
  ``underflow_frac/<module>``, ``subnormal_frac/<module>``, ``nonfinite/<module>``.
- On steps divisible by ``hist_every``: ``amp_inspect/exponent/<module>`` for ``(all)`` and up to
  ``top_modules`` modules (troubled first, then the largest), written with ``add_histogram_raw``. The
  x axis is log2|v| of the judged (scaled) gradient; bucket limits are right edges: exponent bin e becomes
  the bucket (e - 127, e - 126] holding the bin's count, zeros and float32 subnormals the bucket with limit
  -126. NaN/Inf have no finite position: their count is the last bucket, limit 129 (no finite float32 has
  log2|v| >= 128), and is also written as the scalar ``amp_inspect/nonfinite/<module>``. ``min``/``max`` are
  the outer edges of the nonzero bins, ``sum``/``sum_squares`` use bin midpoints. Only the span of
  nonzero bins is written.

Host syncs: ``log(report)`` reads the report's values, which waits for its device copies on CUDA; pass a
report whose ``ready()`` is True, or use ``attach(inspector)``, which logs each report when the Inspector
finalizes it (its statistics already on the host, normally one step behind on CUDA).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from amp_inspect.integrations._common import require
from amp_inspect.integrations._report_logger import ReportLogger

if TYPE_CHECKING:
    from amp_inspect.gradients.step_report import StepReport


class TensorBoardLogger(ReportLogger):
    """Writes StepReports to TensorBoard (see the module docstring for the tags and the histogram axis).

    Args:
        writer_or_logdir: a ``torch.utils.tensorboard.SummaryWriter`` (or anything with its ``add_scalar``
            and ``add_histogram_raw``, e.g. tensorboardX's), or a log directory to open one in (needs
            ``pip install amp_inspect[tensorboard]``).
        log_every: scalars for reports whose step is divisible by N.
        hist_every: exponent histograms for reports whose step is divisible by N; 0 turns them off.
        top_modules: at most this many modules get per-module scalars and histograms.

    Example::

        tb = TensorBoardLogger(SummaryWriter("runs/amp"), hist_every=50)
        tb.log(insp.check())   # reads the report now: waits for the device on CUDA
    """

    def __init__(
        self,
        writer_or_logdir: Any,
        *,
        log_every: int = 1,
        hist_every: int = 100,
        top_modules: int = 10,
    ) -> None:
        super().__init__(log_every=log_every, hist_every=hist_every, top_modules=top_modules)
        if isinstance(writer_or_logdir, (str, os.PathLike)):
            tensorboard = require("torch.utils.tensorboard", "tensorboard", "TensorBoardLogger", "tensorboard")
            self.writer = tensorboard.SummaryWriter(os.fspath(writer_or_logdir))
            self._owns_writer = True
        else:
            for method in ("add_scalar", "add_histogram_raw"):
                if not callable(getattr(writer_or_logdir, method, None)):
                    raise TypeError(f"writer_or_logdir: a SummaryWriter or a path, got {type(writer_or_logdir)}")
            self.writer = writer_or_logdir
            self._owns_writer = False

    def log(self, report: StepReport) -> None:
        """Writes one report's scalars (and histograms on ``hist_every`` steps), at global step report.step.

        Reads the report's values: waits for its device copies on CUDA unless ``report.ready()``.
        """
        scalars, histograms = self.tagged_values(report)
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, report.step)
        for tag, (counts, edges) in histograms.items():
            self._add_exponent_histogram(tag, counts.astype(np.float64), edges, report.step)

    def _add_exponent_histogram(self, tag: str, counts: np.ndarray, edges: np.ndarray, step: int) -> None:
        midpoints = (edges[:-1] + edges[1:]) / 2
        self.writer.add_histogram_raw(
            tag,
            min=float(edges[0]),
            max=float(edges[-1]),
            num=int(counts.sum()),
            sum=float(counts @ midpoints),
            sum_squares=float(counts @ (midpoints * midpoints)),
            bucket_limits=edges[1:].tolist(),
            bucket_counts=counts.tolist(),
            global_step=step,
        )

    def flush(self) -> None:
        """Logs the attached inspector's reports still in flight (waits for them) and flushes the writer."""
        super().flush()
        flush = getattr(self.writer, "flush", None)
        if callable(flush):
            flush()

    def close(self) -> None:
        """``flush()``, then closes the writer if this logger opened it."""
        self.flush()
        if self._owns_writer:
            self.writer.close()


__all__ = ["TensorBoardLogger"]
