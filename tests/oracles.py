"""Independent oracles for amp_inspect.tensor_stats.

None of these read amp_inspect's thresholds (csrc/tensor_stats/tensor_stats.h, amp_inspect/core/formats.py) or its
reference:

- ``classify_torch_cast``: casts float32 v with ``v.to(dtype)`` and looks at what came out.
- ``classify_numpy_fp16``: numpy's float16 cast, which rounds float32 *and float64* directly (one rounding),
  so it is the fp16 oracle for float64 inputs too (torch rounds float64 through float32: two roundings).
- ``classify_exact`` (numpy) and ``classify_exact_scalar`` (pure Python): round-to-nearest-even from
  (exponent bits, mantissa bits, max finite), exact for any Python float, hence for float64 inputs and
  every format.
- ``value_stats``: amax, amin_nonzero, sumsq and the exponent histogram computed with numpy in float64.

Every classifier returns a dict ``{"overflow", "subnormal", "underflow"}`` of boolean numpy arrays, one
entry per element, with the meaning of amp_inspect/core/formats.py: finite v only; overflow = the cast is Inf
(e4m3fn: |v| > 464); subnormal = the cast is a nonzero subnormal; underflow = v != 0 and the cast is zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

ALL_FORMATS = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
CATEGORIES = ("overflow", "subnormal", "underflow")
FIXED_COUNTS = ("numel", "nan", "posinf", "neginf", "zero")
# TensorStats fields that two exact computations must give bit for bit (sumsq: to a tolerance).
EXACT_FIELDS = (*FIXED_COUNTS, *CATEGORIES, "amax", "amin_nonzero", "hist")


@dataclass(frozen=True)
class FormatSpec:
    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool
    torch_dtype: torch.dtype

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def min_normal_exponent(self) -> int:
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_normal_exponent)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.min_normal_exponent - self.mantissa_bits)

    @property
    def max_finite(self) -> float:
        max_exponent = (1 << self.exponent_bits) - 1 - self.bias  # the all-ones exponent field
        if self.has_inf:  # IEEE: the all-ones field is Inf/NaN, the largest finite has all mantissa ones
            return math.ldexp(2.0 - math.ldexp(1.0, -self.mantissa_bits), max_exponent - 1)
        # e4m3fn: the all-ones field holds finite values; only all-ones mantissa is NaN
        return math.ldexp(2.0 - math.ldexp(1.0, 1 - self.mantissa_bits), max_exponent)


SPECS: dict[str, FormatSpec] = {
    "fp16": FormatSpec("fp16", 5, 10, True, torch.float16),
    "bf16": FormatSpec("bf16", 8, 7, True, torch.bfloat16),
    "fp8_e4m3": FormatSpec("fp8_e4m3", 4, 3, False, torch.float8_e4m3fn),
    "fp8_e5m2": FormatSpec("fp8_e5m2", 5, 2, True, torch.float8_e5m2),
}

E4M3_OUT_OF_RANGE_ABOVE = 464.0  # the midpoint between 448 and the (absent) 480; it rounds to even, 448


# ---------------------------------------------------------------------------------------------------------
# (c) exact round-to-nearest-even on Python floats


def round_exact(x: float, spec: FormatSpec) -> float:
    """|x| rounded to nearest, ties to even, onto the format's grid with an unbounded exponent range above
    (so a result above max_finite means overflow) and the subnormal spacing at the bottom. Exact: scaling a
    double by a power of two is exact here and ``round`` on a float rounds half to even."""
    a = abs(x)
    if a == 0.0:
        return 0.0
    _, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1, so the binade exponent is e - 1
    quantum_exponent = max(e - 1, spec.min_normal_exponent) - spec.mantissa_bits
    n = round(math.ldexp(a, -quantum_exponent))  # an exact double, then RNE to an integer
    try:
        return math.ldexp(float(n), quantum_exponent)
    except OverflowError:  # rounded up past the largest double: far beyond every format
        return math.inf


def classify_exact_scalar(x: float, fmt: str) -> str:
    """One of 'nan', 'inf', 'zero', 'overflow', 'subnormal', 'underflow', 'normal'."""
    spec = SPECS[fmt]
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    if x == 0.0:
        return "zero"
    r = round_exact(x, spec)
    if r > spec.max_finite:
        return "overflow"
    if r == 0.0:
        return "underflow"
    if r < spec.min_normal:
        return "subnormal"
    return "normal"


def classify_exact_scalars(values: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """``classify_exact_scalar`` element by element (slow: for small arrays and for checking the fast one)."""
    labels = [classify_exact_scalar(float(v), fmt) for v in np.asarray(values).reshape(-1)]
    return {c: np.array([lab == c for lab in labels], dtype=bool) for c in CATEGORIES}


def classify_exact(values: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """The same rounding as ``round_exact``, vectorised with numpy on float64: frexp for the binade, an
    exact power-of-two ldexp, ``np.rint`` (round half to even) to the integer number of quanta."""
    spec = SPECS[fmt]
    with np.errstate(invalid="ignore"):
        v = np.asarray(values).reshape(-1).astype(np.float64)  # float32 -> float64 is exact
    finite = np.isfinite(v)
    a = np.where(finite, np.abs(v), 0.0)
    _, e = np.frexp(a)
    quantum_exponent = np.maximum(e - 1, spec.min_normal_exponent) - spec.mantissa_bits
    with np.errstate(over="ignore"):
        r = np.ldexp(np.rint(np.ldexp(a, -quantum_exponent)), quantum_exponent)
    nonzero = finite & (a != 0)
    overflow = nonzero & (r > spec.max_finite)
    underflow = nonzero & (r == 0)
    subnormal = nonzero & (r != 0) & (r < spec.min_normal)
    return {"overflow": overflow, "subnormal": subnormal, "underflow": underflow}


# ---------------------------------------------------------------------------------------------------------
# (a) torch casts of float32 v


def classify_torch_cast(v: np.ndarray | torch.Tensor, fmt: str) -> dict[str, np.ndarray]:
    """Classifies float32 values by casting them with torch. Only valid for float32 v."""
    spec = SPECS[fmt]
    t = torch.as_tensor(np.asarray(v, dtype=np.float32)) if not isinstance(v, torch.Tensor) else v
    assert t.dtype == torch.float32, "torch casts are only an oracle for float32 values"
    t = t.reshape(-1)
    finite = torch.isfinite(t)
    cast = t.to(spec.torch_dtype).float()
    nonzero = t != 0
    if spec.has_inf:
        overflow = finite & torch.isinf(cast)
    else:
        overflow = finite & (t.abs() > E4M3_OUT_OF_RANGE_ABOVE)
        # Whatever torch does beyond the range (saturate to 448 since 2.13, NaN before), check it is that.
        out = cast[overflow]
        assert bool(((out.abs() == spec.max_finite) | torch.isnan(out)).all()), out
        assert bool(torch.isfinite(cast[finite & ~overflow]).all())
    subnormal = finite & nonzero & (cast != 0) & (cast.abs() < spec.min_normal) & ~overflow
    underflow = finite & nonzero & (cast == 0)
    return {"overflow": overflow.numpy(), "subnormal": subnormal.numpy(), "underflow": underflow.numpy()}


# ---------------------------------------------------------------------------------------------------------
# (b) numpy float16, one rounding from float32 or float64


def classify_numpy_fp16(v: np.ndarray) -> dict[str, np.ndarray]:
    v = np.asarray(v).reshape(-1)
    assert v.dtype in (np.float32, np.float64)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        cast = v.astype(np.float16)
    finite = np.isfinite(v)
    nonzero = v != 0
    min_normal = np.float16(2.0**-14)
    return {
        "overflow": finite & np.isinf(cast),
        "subnormal": finite & nonzero & (cast != 0) & (np.abs(cast) < min_normal) & np.isfinite(cast),
        "underflow": finite & nonzero & (cast == 0),
    }


# ---------------------------------------------------------------------------------------------------------
# v, as numpy, from an input tensor (without going through amp_inspect or torch's arithmetic)


def input_as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's logical elements as float32 (float32/float16/bfloat16) or float64 numpy values, exact,
    decoded from the bits with numpy (bfloat16 is the high half of a float32)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.dtype == torch.float32:
        return flat.view(torch.int32).numpy().view(np.float32).copy()
    if flat.dtype == torch.float64:
        return flat.view(torch.int64).numpy().view(np.float64).copy()
    if flat.dtype == torch.float16:
        return flat.view(torch.int16).numpy().view(np.float16).astype(np.float32)
    if flat.dtype == torch.bfloat16:
        bits16 = flat.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
        return (bits16 << np.uint32(16)).view(np.float32)
    raise TypeError(t.dtype)


def judged_values(t: torch.Tensor, scale: float | None) -> np.ndarray:
    """v for one tensor: x itself, or float32(x) * float32(scale) as one IEEE float32 multiply (numpy)."""
    x = input_as_numpy(t)
    if scale is None:
        return x
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return x.astype(np.float32) * np.float32(scale)


def classify(v: np.ndarray, fmt: str, *, exact: bool | None = None) -> dict[str, np.ndarray]:
    """The oracle classification of v, cross-checked between the oracles that apply to v's dtype.

    float32 v: torch's cast; numpy's float16 for fp16; the exact classifiers when ``exact`` (default: when
    v is small enough for per-element Python). float64 v: the vectorised exact classifier, the per-element
    one when ``exact``; numpy's float16 for fp16.
    Raises AssertionError if two oracles disagree (a bug in an oracle, not in amp_inspect)."""
    v = np.asarray(v).reshape(-1)
    if exact is None:
        exact = v.size <= 5000
    results = []
    if v.dtype == np.float32:
        results.append(("torch", classify_torch_cast(v, fmt)))
    if fmt == "fp16":
        results.append(("numpy", classify_numpy_fp16(v)))
    if v.dtype == np.float64 or exact:
        results.append(("exact", classify_exact(v, fmt)))
    if exact:
        results.append(("exact per element", classify_exact_scalars(v, fmt)))
    first_name, first = results[0]
    for name, other in results[1:]:
        for c in CATEGORIES:
            bad = np.nonzero(first[c] != other[c])[0]
            assert bad.size == 0, f"oracles {first_name} and {name} disagree on {fmt} {c} at {v[bad][:8]!r}"
    return first


# ---------------------------------------------------------------------------------------------------------
# expected op outputs


def value_stats(v: np.ndarray) -> dict[str, object]:
    """numel, nan, posinf, neginf, zero, amax, amin_nonzero (float32), sumsq (float64), hist (float32 bits)."""
    v = np.asarray(v).reshape(-1)
    finite = np.isfinite(v)
    mags = np.abs(v[finite]).astype(np.float64)
    nonzero = mags[mags != 0]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        amax = np.float32(mags.max()) if mags.size else np.float32(0.0)
        amin = np.float32(nonzero.min()) if nonzero.size else np.float32(np.inf)
        sumsq = float(np.sum(mags * mags)) if mags.size else 0.0
        v32 = v.astype(np.float32)
    exponent = (v32.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    return {
        "numel": v.size,
        "nan": int(np.isnan(v).sum()),
        "posinf": int(np.isposinf(v).sum()),
        "neginf": int(np.isneginf(v).sum()),
        "zero": int((v == 0).sum()),
        "amax": amax,
        "amin_nonzero": amin,
        "sumsq": sumsq,
        "hist": np.bincount(exponent.astype(np.int64), minlength=256),
    }


def expected_row(v: np.ndarray, formats: tuple[str, ...], *, exact: bool | None = None) -> dict[str, object]:
    """Every output of tensor_stats for a tensor whose judged values are v, from the oracles."""
    row = value_stats(v)
    per_format = [classify(v, f, exact=exact) for f in formats]
    for c in CATEGORIES:
        row[c] = np.array([int(p[c].sum()) for p in per_format], dtype=np.int64)
    return row


def per_element_expected(v: np.ndarray, formats: tuple[str, ...]) -> dict[str, np.ndarray]:
    """For one-element tensors: the expected count of each category per element (0/1), [N, F]."""
    per_format = [classify(v, f) for f in formats]
    return {c: np.stack([p[c] for p in per_format], axis=1).astype(np.int64) for c in CATEGORIES}


def assert_stats_match_oracle(
    stats, tensors, scale: float | None, *, exact: bool | None = None, rtol: float = 2e-6
) -> None:
    """Checks every output of ``stats`` (a TensorStats on any device) against the oracles, tensor by tensor."""
    for i, t in enumerate(tensors):
        v = judged_values(t, scale)
        exp = expected_row(v, stats.formats, exact=exact)
        where = f"tensor {i} ({t.dtype}, numel {t.numel()}, scale {scale})"
        for name in ("numel", "nan", "posinf", "neginf", "zero"):
            assert int(getattr(stats, name)[i]) == exp[name], f"{where}: {name}"
        for c in CATEGORIES:
            got = getattr(stats, c)[i].cpu().numpy()
            np.testing.assert_array_equal(got, exp[c], err_msg=f"{where}: {c} {stats.formats}")
        assert float(stats.amax[i]) == float(exp["amax"]), f"{where}: amax"
        assert float(stats.amin_nonzero[i]) == float(exp["amin_nonzero"]), f"{where}: amin_nonzero"
        np.testing.assert_allclose(float(stats.sumsq[i]), exp["sumsq"], rtol=rtol, err_msg=f"{where}: sumsq")
        np.testing.assert_array_equal(stats.hist[i].cpu().numpy(), exp["hist"], err_msg=f"{where}: hist")


def assert_outputs_equal(got, want, *, rtol: float = 2e-6, what: str = "") -> None:
    """Op outputs (counts, hist, amax, amin_nonzero, sumsq) equal: exactly, sumsq to rtol."""
    names = ("counts", "hist", "amax", "amin_nonzero", "sumsq")
    for name, g, w in zip(names, got, want, strict=True):
        g = g.cpu()
        w = w.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}{name}: {g.dtype}{tuple(g.shape)} vs {w.dtype}"
        if name == "sumsq":
            torch.testing.assert_close(g, w, rtol=rtol, atol=0, equal_nan=True, msg=f"{what}{name}")
        else:
            bad = (g != w) & ~(g.isnan() & w.isnan()) if g.is_floating_point() else g != w
            assert not bool(bad.any()), (
                f"{what}{name} differs at {bad.nonzero()[:8].tolist()}: {g[bad][:8]} vs {w[bad][:8]}"
            )


# ---------------------------------------------------------------------------------------------------------
# bit-pattern helpers


def f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def f64_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).view(np.float64)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included) of the logical elements of two tensors of one dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(int_dtype), b.contiguous().view(int_dtype))


# ---- format readiness: what a saturating element cast clamps ----

# The smallest float32 |v| each element cast clamps (a cast without saturation would round it past the max), by
# hand from each format's max and its ulp there, not from amp_inspect's tables: E4M3 448 + 16 = 464 is a tie that
# goes to the even 448, so the first clamped value is the float32 after 464; E5M2's tie 57344 + 4096 = 61440 and
# E2M1's 6 + 1 = 7 go up (their max has an odd last mantissa bit).
READINESS_CLAMPED_FROM = {
    "e4m3": float(np.nextafter(np.float32(464.0), np.float32(np.inf))),
    "e5m2": 61440.0,
    "e2m1": 7.0,
}


def clamped_by_cast(v: torch.Tensor, element: str) -> torch.Tensor:
    """Whether the saturating cast to ``element`` clamps v (the readiness statistic ``saturated``)."""
    return v.abs() >= READINESS_CLAMPED_FROM[element]
