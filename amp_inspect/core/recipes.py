"""The low-precision GEMM recipes format readiness asks about, and each one's exact rule, written once.

A recipe quantizes a GEMM operand (activations X, weights W, output gradients dY) to a narrow element format
with a scale per tensor or per block of contiguous elements along the last dimension. ``format_readiness``
(core/format_readiness.py) measures, per tensor and recipe, what quantizing and dequantizing every finite element would
lose. The kernels (csrc/readiness/readiness.h ``kRecipes``), the float64 reference (core/references/format_readiness.py)
and the docs (docs/numerics.md, "Format readiness") follow the rules below; ``amp_inspect._C.layout()`` reports the C++
table and tests/test_schema.py holds the two equal.

Notation: ``fl32(e)`` is e computed in float32 arithmetic (one IEEE float32 operation, round to nearest even);
``amax`` is the largest |x| over the finite elements of the tensor (``amax_t``) or of the block (``amax_b``);
NaN and Inf elements take no part in any amax or sum. x is the element's value widened exactly to float32.

**Element casts** ``cast_E(v)``: round v to nearest, ties to even, on the grid of element format E (its
subnormals included), and saturate: a |v| above E's largest finite value gives that value with v's sign
(as the hardware's saturating conversions do). ``saturated`` counts finite elements the cast clamps: those
whose rounding on E's grid continued past max_E is above max_E, the values a cast without saturation would send
to Inf or NaN (E4M3: |v| > 464, its tie at 464 rounding to the even 448; E5M2: |v| >= 61440; E2M1: |v| >= 7).
A |v| in (max_E, that bound) rounds to max_E as any value rounds to its neighbour and is not counted: an fp32
scale fl32(max_E / amax) rounds up for about one block in ten, putting the amax one float32 above max_E with
nothing lost beyond rounding (its error is in ``sq_error``). ``flushed`` counts finite nonzero x whose
dequantized value is 0.

**Scale rules**, by ``Recipe.scale``:

- ``fp32_tensor`` (TransformerEngine's current scaling) and ``fp32_block`` (1x128 blocks, DeepSeek-V3 style):
  s = fl32(max_E / amax); s = 1 where amax = 0 (and where a given tensor amax is Inf or NaN, as
  TransformerEngine's compute_scale_from_amax does); s = FLT_MAX where the division overflows to +inf (the
  block's scale is then at its limit: counted in ``scale_flushed``). v = fl32(x * s); q = cast_E(v);
  dequantized q / s.
- ``e8m0_floor`` (OCP Microscaling v1.0, section 6.3): X = floor(log2 amax_b) - emax_E, clamped to [-127, 127]
  (the E8M0 range; a block whose X is clamped counts in ``scale_flushed``); X = -127 where amax_b = 0.
  v = x * 2^-X (exact), q = cast_E(v), dequantized q * 2^X.
- ``e8m0_rceil`` (the scale rounded up, as TransformerEngine's MXFP8 and torchao's RCEIL mode do):
  r = fl32(amax_b / max_E); X = the least integer with 2^X >= r, clamped to [-127, 127] (clamped blocks count in
  ``scale_flushed``); X = -127 where r = 0 (a block with amax_b > 0 whose r underflowed to 0 is a clamped
  block). Then as ``e8m0_floor``.
- ``nvfp4`` (NVIDIA's two-level scaling, as torchao's nvfp4_tensor.py computes it, but without clamping the
  block scale up to E4M3's smallest normal): d = fl32(amax_t / (448 * 6)) the tensor's decode scale;
  per block, s_b = cast_E4M3(fl32(fl32(amax_b / 6) / d)) (saturating at 448, its subnormals kept);
  total = fl32(d * s_b). Where total = 0 every element of the block dequantizes to 0; else
  v = fl32(x / total), q = cast_E2M1(v), dequantized q * total. A block with amax_b > 0 whose s_b is zero or
  an E4M3 subnormal (below 2^-6) counts in ``scale_flushed``. Two cases the arithmetic leaves open: s_b = 0
  where fl32(amax_b / 6) = 0 (not 0/0 when d = 0), and d = 1 where amax_t is 0, Inf or NaN (a given, stale
  amax; TransformerEngine's compute_global_encode_scaling_factor_FP4 does the same). A tensor whose own
  amax_t is 0 has nothing to lose.

Blocks run along the last dimension as the tensor is given (a 0-d tensor is one row of one element); a
row's last block may be shorter than the block size and is its own block. A tensor-scaled recipe's tensor is
one block. ``blocks`` counts the blocks of each tensor (0 for an empty tensor).

Torch-free (plain numbers), like core/formats.py, so the log readers can name recipes without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElementFormat:
    """A narrow float format's grid: ``mbits`` mantissa bits, normal exponents from ``emin`` to ``emax``,
    largest finite value ``max_value``; its smallest subnormal is 2^(emin - mbits)."""

    name: str
    mbits: int
    emin: int
    emax: int
    max_value: float

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)


ELEMENT_FORMATS: dict[str, ElementFormat] = {
    "e4m3": ElementFormat("e4m3", 3, -6, 8, 448.0),  # OCP FP8 E4M3 (torch.float8_e4m3fn): no Inf
    "e5m2": ElementFormat("e5m2", 2, -14, 15, 57344.0),  # OCP FP8 E5M2 (torch.float8_e5m2)
    "e2m1": ElementFormat("e2m1", 1, 0, 2, 6.0),  # OCP FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6
}

SCALE_RULES = ("fp32_tensor", "fp32_block", "e8m0_floor", "e8m0_rceil", "nvfp4")
E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT = -127, 127
NVFP4_TENSOR_DIVISOR = 448.0 * 6.0  # E4M3's max times E2M1's max


@dataclass(frozen=True)
class Recipe:
    """One recipe (module docstring: the rules). ``block`` 0: one scale for the whole tensor."""

    name: str
    element: str  # a key of ELEMENT_FORMATS
    block: int
    scale: str  # one of SCALE_RULES
    doc: str

    @property
    def element_format(self) -> ElementFormat:
        return ELEMENT_FORMATS[self.element]

    @property
    def needs_tensor_amax(self) -> bool:
        """Whether the rule needs the tensor's amax before the pass (a second pass, or a given amax)."""
        return self.scale in ("fp32_tensor", "nvfp4")


RECIPES: tuple[Recipe, ...] = (
    Recipe("fp8_e4m3_tensor", "e4m3", 0, "fp32_tensor", "FP8 E4M3, one fp32 scale per tensor (current scaling)"),
    Recipe("fp8_e5m2_tensor", "e5m2", 0, "fp32_tensor", "FP8 E5M2, one fp32 scale per tensor (current scaling)"),
    Recipe("fp8_e4m3_block128", "e4m3", 128, "fp32_block", "FP8 E4M3, an fp32 scale per 1x128 block"),
    Recipe("mxfp8_e4m3", "e4m3", 32, "e8m0_floor", "MXFP8 E4M3, an E8M0 scale per 32 elements (OCP rule)"),
    Recipe("mxfp8_e5m2", "e5m2", 32, "e8m0_floor", "MXFP8 E5M2, an E8M0 scale per 32 elements (OCP rule)"),
    Recipe("mxfp8_e4m3_rceil", "e4m3", 32, "e8m0_rceil", "MXFP8 E4M3, the E8M0 scale rounded up (RCEIL)"),
    Recipe("mxfp4", "e2m1", 32, "e8m0_floor", "MXFP4 E2M1, an E8M0 scale per 32 elements (OCP rule)"),
    Recipe("nvfp4", "e2m1", 16, "nvfp4", "NVFP4 E2M1, an E4M3 scale per 16 elements and an fp32 tensor scale"),
)
RECIPE_NAMES: tuple[str, ...] = tuple(r.name for r in RECIPES)
RECIPES_BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}


def check_recipes(recipes: object) -> tuple[str, ...]:
    """The recipe names asked for, in order (None: all of them), or a ValueError naming the bad one."""
    if recipes is None:
        return RECIPE_NAMES
    if isinstance(recipes, str):
        recipes = (recipes,)
    try:
        names = tuple(recipes)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"recipes must be a list of recipe names, not {type(recipes).__name__}") from None
    for n in names:
        if n not in RECIPES_BY_NAME:
            raise ValueError(f"unknown recipe {n!r}; the recipes are {', '.join(RECIPE_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"recipes {list(names)} name one recipe twice")
    if not names:
        raise ValueError("recipes is empty; leave it out to measure every recipe")
    return names
