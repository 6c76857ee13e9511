"""Plain-text tables of TensorStats, for the demo and for logs.

Rendering reads the statistics to the host (one copy per field; on CUDA that waits for the op to finish),
so call it when you want to look, not on every training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only its methods are called: the run-log readers use fixed_width without torch
    from amp_inspect.core.tensor_stats import TensorStats


def fixed_width(headers: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = True) -> list[str]:
    """Lines of a fixed-width table: the first column left-aligned, the others right-aligned; ``rule`` puts
    a line of dashes under the headers."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        pairs = enumerate(zip(values, widths, strict=True))
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)

    head = [line(headers)] + (["  ".join("-" * w for w in widths)] if rule else [])
    return head + [line(r) for r in rows]


def _fmt_float(x: float) -> str:
    if x == 0:
        return "0"
    if x == float("inf"):
        return "-"
    return f"{x:.3g}"


def stats_rows(stats: TensorStats, names: Sequence[str], fmt: str | None = None) -> list[dict[str, object]]:
    """One dict per tensor with host values: the columns a person reads, for format ``fmt`` (default: the first)."""
    if len(names) != len(stats):
        raise ValueError(f"{len(names)} names for {len(stats)} tensors")
    col = stats.column(fmt or stats.formats[0])
    host = {
        "numel": stats.numel.tolist(),
        "nan": stats.nan.tolist(),
        "inf": (stats.posinf + stats.neginf).tolist(),
        "zero": stats.zero.tolist(),
        "overflow": stats.overflow[:, col].tolist(),
        "subnormal": stats.subnormal[:, col].tolist(),
        "underflow": stats.underflow[:, col].tolist(),
        "amax": stats.amax.tolist(),
        "amin_nonzero": stats.amin_nonzero.tolist(),
        "norm": stats.norm.tolist(),
    }
    return [{"name": name, **{key: values[i] for key, values in host.items()}} for i, name in enumerate(names)]


def format_stats_table(
    stats: TensorStats, names: Sequence[str], fmt: str | None = None, only_trouble: bool = False
) -> str:
    """A fixed-width table, one line per tensor. ``only_trouble`` keeps the tensors with NaN/Inf, overflow,
    subnormal or underflow values in format ``fmt``."""
    fmt = fmt or stats.formats[0]
    rows = stats_rows(stats, names, fmt)
    if only_trouble:
        rows = [r for r in rows if any(r[k] for k in ("nan", "inf", "overflow", "subnormal", "underflow"))]
    headers = ["tensor", "numel", "nan", "inf", "zero", f"{fmt} overflow", f"{fmt} subnormal", f"{fmt} underflow"]
    headers += ["max |v|", "min |v|>0", "L2 norm"]
    cells = [
        [
            str(r["name"]),
            *(str(r[k]) for k in ("numel", "nan", "inf", "zero", "overflow", "subnormal", "underflow")),
            *(_fmt_float(float(r[k])) for k in ("amax", "amin_nonzero", "norm")),  # type: ignore[arg-type]
        ]
        for r in rows
    ]
    lines = fixed_width(headers, cells)
    if not cells:
        lines.append("(no tensor in trouble)")
    return "\n".join(lines)
