"""amp_inspect.update_stats (what optimizer.step() did to each parameter) against hand-made oracles: each weight
compared before and after by the test itself, and values whose class (lost, subnormal, underflowing state) is known
by construction. The same cases run through the public face (the compiled kernel where one serves, else the
reference) and through the pure-torch reference alone (amp_inspect/core/references/update_stats.py)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core.references.update_stats import COUNT_NAMES, update_stats_reference
from amp_inspect.core.statistics import UPDATE, UPDATE_DERIVED
from amp_inspect.core.update_stats import UpdateTensorStats

NAN, INF = float("nan"), float("inf")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def through_reference(before, after, grads, exp_avg_sq=None) -> UpdateTensorStats:
    return UpdateTensorStats.from_op_outputs(update_stats_reference(before, after, grads, exp_avg_sq or []))


FACES = pytest.mark.parametrize("measure", [amp_inspect.update_stats, through_reference], ids=["face", "reference"])


def oracle(before: torch.Tensor, after: torch.Tensor, grad: torch.Tensor) -> dict[str, int]:
    """Each element judged by Python floats, one at a time."""
    b, a, g = (t.double().flatten().tolist() for t in (before, after, grad))
    with_grad = [math.isfinite(x) and x != 0 for x in g]
    return {
        "with_grad": sum(with_grad),
        "lost": sum(w and x == y for w, x, y in zip(with_grad, b, a, strict=True)),
        "changed": sum(x != y for x, y in zip(b, a, strict=True)),
    }


def adamw_step(dtype: torch.dtype, lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    w = torch.nn.Parameter((1 + 0.1 * torch.randn(4096)).to(dtype))
    opt = torch.optim.AdamW([w], lr=lr, weight_decay=0.0)
    w.grad = torch.randn(4096).to(dtype)
    before = w.detach().clone()
    opt.step()
    return before, w.detach().clone(), w.grad


@FACES
def test_bf16_weights_lose_an_adamw_step_of_1e_5(measure) -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)
    want = oracle(before, after, grad)
    got = measure([before], [after], [grad])
    assert want["lost"] > 0.9 * want["with_grad"]  # half an ulp of weights near 1 is 2^-9, the step ~1e-5
    assert got.lost.tolist() == [want["lost"]] and got.with_grad.tolist() == [want["with_grad"]]
    assert got.changed.tolist() == [want["changed"]]
    assert got.lost_fraction.tolist() == [want["lost"] / want["with_grad"]]


@FACES
def test_fp32_weights_lose_nothing_of_the_same_step(measure) -> None:
    before, after, grad = adamw_step(torch.float32, 1e-5)
    want = oracle(before, after, grad)
    got = measure([before], [after], [grad])
    assert want["lost"] == 0 and got.lost.tolist() == [0]
    assert got.changed.tolist() == [want["changed"]] == [4096]
    assert got.lost_fraction.tolist() == [0.0]


@FACES
@pytest.mark.parametrize("dtype", DTYPES)
def test_plus_and_minus_zero_are_the_same_weight(measure, dtype) -> None:
    before = torch.tensor([0.0, -0.0, 0.0], dtype=dtype)
    after = torch.tensor([-0.0, 0.0, 1.0], dtype=dtype)
    grad = torch.tensor([1.0, 1.0, 1.0], dtype=dtype)
    got = measure([before], [after], [grad])
    assert got.lost.tolist() == [2] and got.changed.tolist() == [1]
    assert got.sq_weight.tolist() == [0.0] and math.isnan(got.update_ratio.item())  # no weight to compare with


@FACES
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_weights(measure, dtype) -> None:
    before = torch.tensor([NAN, 2.0, 1.0, INF, 3.0], dtype=dtype)
    after = torch.tensor([NAN, NAN, 1.5, INF, -INF], dtype=dtype)
    grad = torch.ones(5, dtype=dtype)
    got = measure([before], [after], [grad])
    # NaN != NaN: changed and not lost; Inf == Inf: unchanged and lost.
    assert got.changed.tolist() == [4] and got.lost.tolist() == [1]
    assert got.weight_nonfinite.tolist() == [4]
    assert got.sq_change.tolist() == [0.25]  # only the element finite before and after
    assert got.sq_weight.tolist() == [4.0 + 1.0 + 9.0]  # finite before
    assert got.amax.tolist() == [1.5]


@FACES
@pytest.mark.parametrize("dtype", DTYPES)
def test_made_nonfinite_is_a_finite_weight_and_gradient_turned_nan_or_inf_by_the_step(measure, dtype) -> None:
    """Every combination of before, gradient and after among a normal, zero, the largest finite, +-Inf and NaN,
    against Python floats: counted exactly where before and gradient are finite and after is not."""
    big = torch.finfo(dtype).max
    values = [1.0, 0.0, -0.0, big, -big, INF, -INF, NAN]
    combos = [(b, g, a) for b in values for g in values for a in values]
    before, grad, after = (torch.tensor(list(column), dtype=dtype) for column in zip(*combos, strict=True))
    got = measure([before], [after], [grad])
    want = sum(math.isfinite(b) and math.isfinite(g) and not math.isfinite(a) for b, g, a in combos)
    assert want == 5 * 5 * 3  # finite before (5 values) x finite gradient (5) x Inf, -Inf, NaN after
    assert got.made_nonfinite.tolist() == [want]
    assert got.weight_nonfinite.tolist() == [len(values) ** 2 * 3]  # every before and gradient, after non-finite


@FACES
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_zero_or_nonfinite_gradient_is_not_with_grad(measure, dtype) -> None:
    before = torch.ones(5, dtype=dtype)
    after = before.clone()
    grad = torch.tensor([0.0, -0.0, NAN, INF, 1e-3], dtype=dtype)
    got = measure([before], [after], [grad])
    assert got.with_grad.tolist() == [1] and got.lost.tolist() == [1] and got.changed.tolist() == [0]


@FACES
def test_state_underflow_in_fp16_but_not_in_fp32(measure) -> None:
    # 1e-6 is a subnormal of float16 (its smallest normal is 2^-14 ~ 6.1e-5), a normal float32; zero in both.
    state = [0.0, 1e-6, 1e-2, 1e-6]
    grad = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last has no gradient: not counted
    before = torch.ones(4)
    after = before - 1e-3
    fp16 = measure([before], [after], [grad], [torch.tensor(state, dtype=torch.float16)])
    assert torch.tensor(state, dtype=torch.float16)[1].item() != 0  # subnormal, not flushed
    fp32 = measure([before], [after], [grad], [torch.tensor(state, dtype=torch.float32)])
    bf16 = measure([before], [after], [grad], [torch.tensor(state, dtype=torch.bfloat16)])
    none = measure([before], [after], [grad])
    assert fp16.state_underflow.tolist() == [2]
    assert fp32.state_underflow.tolist() == [1] and bf16.state_underflow.tolist() == [1]
    assert none.state_underflow.tolist() == [0]


@FACES
def test_weight_subnormal_in_its_own_dtype(measure) -> None:
    # 1e-39 is a subnormal of float32 and bfloat16 (smallest normal 2^-126); 1e-5 of float16 only.
    values = [1e-39, 1e-5, 0.0, -1e-39]
    want = {torch.float32: 2, torch.bfloat16: 2, torch.float16: 1}  # float16 rounds 1e-39 to 0
    for dtype, n in want.items():
        after = torch.tensor(values, dtype=dtype)
        got = measure([torch.ones(4, dtype=dtype)], [after], [torch.ones(4, dtype=dtype)])
        assert got.weight_subnormal.tolist() == [n], dtype


@FACES
def test_update_ratio(measure) -> None:
    before = torch.tensor([3.0, 4.0])
    after = torch.tensor([3.03, 4.04])
    got = measure([before], [after], [torch.ones(2)])
    b, a = before.double(), after.double()  # the float32 values, differenced in float64
    want = math.sqrt(float(((a - b) ** 2).sum()) / 25.0)
    assert got.update_ratio.tolist() == [want] and abs(want - 0.01) < 1e-6
    assert got.sq_change.dtype == torch.float64 and got.update_ratio.dtype == torch.float64


@FACES
def test_several_tensors_of_every_dtype_and_empty_ones(measure) -> None:
    torch.manual_seed(1)
    before = [torch.randn(n).to(d) for n, d in ((10, torch.float32), (0, torch.bfloat16), (33, torch.float16))]
    after = [(b.float() + 1e-3 * torch.randn(b.shape)).to(b.dtype) for b in before]
    grads = [torch.randn(b.shape).to(torch.bfloat16) for b in before]
    got = measure(before, after, grads)
    assert got.numel.tolist() == [10, 0, 33]
    for i, (b, a, g) in enumerate(zip(before, after, grads, strict=True)):
        want = oracle(b, a, g)
        assert (got.with_grad[i].item(), got.lost[i].item(), got.changed[i].item()) == tuple(want.values())
        finite = np.abs(a.float().numpy())
        assert got.amax[i].item() == (finite.max() if finite.size else 0.0)
    assert math.isnan(got.lost_fraction[1].item()) and got.sq_weight[1].item() == 0.0
    assert len(measure([], [], [])) == 0


def test_update_stats_is_the_function_whatever_was_imported_first() -> None:
    import amp_inspect.core.update_stats  # noqa: F401

    assert callable(amp_inspect.update_stats) and amp_inspect.update_stats.__module__ == "amp_inspect.core.update_stats"
    assert amp_inspect.core.UpdateTensorStats is UpdateTensorStats


def test_the_dataclass_holds_the_schema_and_its_outputs_round_trip() -> None:
    assert list(UpdateTensorStats.__dataclass_fields__) == [s.name for s in UPDATE]
    for entry in [*UPDATE, *UPDATE_DERIVED]:
        assert f"``{entry.name}``" in (UpdateTensorStats.__doc__ or "")
    before, after, grad = adamw_step(torch.bfloat16, 1e-3)
    stats = amp_inspect.update_stats([before, after], [after, before], [grad, grad])
    for x, y in zip(UpdateTensorStats.from_op_outputs(stats.outputs()).outputs(), stats.outputs(), strict=True):
        assert torch.equal(x, y)


def test_merge_of_pieces_is_the_statistic_of_their_union() -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-4)
    whole = amp_inspect.update_stats([before], [after], [grad])
    halves = [amp_inspect.update_stats([before[s]], [after[s]], [grad[s]]) for s in (slice(0, 1000), slice(1000, None))]
    merged = halves[0].merge(halves[1])
    for s in UPDATE:
        x, y = getattr(merged, s.name), getattr(whole, s.name)
        assert torch.equal(x, y) if s.is_count or s.merge == "max" else torch.allclose(x, y, rtol=1e-12, atol=0)
    cut = [slice(0, 1000), slice(1000, None)]
    two = amp_inspect.update_stats([before[s] for s in cut], [after[s] for s in cut], [grad[s] for s in cut])
    assert torch.equal(two.total().lost, whole.lost) and torch.equal(two.select([1]).numel, halves[1].numel)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((torch.ones(2), [torch.ones(2)], [torch.ones(2)]), TypeError, "wrap a single tensor"),
        (([torch.ones(2)], [], [torch.ones(2)]), ValueError, "one tensor per parameter"),
        (([torch.ones(2)], [torch.ones(2)], [torch.ones(2)], [torch.ones(2)] * 2), ValueError, "one tensor per"),
        (([torch.ones(2)], [torch.ones(2, dtype=torch.bfloat16)], [torch.ones(2)]), TypeError, "keeps the dtype"),
        (([torch.ones(2)], [torch.ones(3)], [torch.ones(2)]), ValueError, "has shape [3]"),
        (([torch.ones(2)], [torch.ones(2)], [torch.ones(2, 1)]), ValueError, "grads[0] has shape"),
        (([torch.ones(2, dtype=torch.float64)],) * 3, TypeError, "takes float32, bfloat16 or float16"),
        (([torch.ones(2)], [torch.ones(2)], [1.0]), TypeError, "grads[0] is a float"),
        (([torch.ones(2)], [torch.ones(2)], [torch.ones(2, device="meta")]), ValueError, "one device"),
    ],
)
def test_bad_inputs_are_one_sentence(args, error, words) -> None:
    with pytest.raises(error) as caught:
        amp_inspect.update_stats(*args)
    message = str(caught.value)
    assert words in message and "\n" not in message and message.count(". ") == 0


def test_inputs_are_left_as_they_were() -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-3)
    copies = [t.clone() for t in (before, after, grad)]
    amp_inspect.update_stats([before], [after], [grad], [grad.float().square()])
    assert all(torch.equal(x, y) for x, y in zip((before, after, grad), copies, strict=True))


def test_without_a_kernel_the_reference_serves_with_one_warning(monkeypatch) -> None:
    monkeypatch.setitem(_ops.OP_KERNELS, "update_stats", frozenset())
    monkeypatch.setattr(_ops, "_warned", set())
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = amp_inspect.update_stats([before], [after], [grad])
        amp_inspect.update_stats([before], [after], [grad])
    said = [str(w.message) for w in caught if "update_stats" in str(w.message)]
    assert len(said) == 1 and "pure-torch reference" in said[0]
    assert first.lost.tolist() == [oracle(before, after, grad)["lost"]]


def test_with_a_kernel_no_warning_is_given() -> None:
    if "cpu" not in _ops.OP_KERNELS["update_stats"]:
        pytest.skip(f"no compiled CPU kernel for update_stats: {_ops.LOAD_ERROR or 'the extension has none'}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp_inspect.update_stats([torch.ones(2)], [torch.ones(2)], [torch.ones(2)])


# ---------------------------------------------------------------------------------------------------------
# the compiled CPU kernel (csrc/update_stats/update_stats_cpu.cpp on csrc/update_stats/update_stats.h) against the
# reference
#
# Exactness: counts and amax equal the reference's exactly. sq_change and sq_weight are float64 sums of the same
# float64 terms (each a difference or square of floats widened exactly), added in another order: n nonnegative
# terms summed in float64 are within (n - 1) * 2^-53 of the exact sum relative to it, so the two agree to a
# relative ``sums_rtol(n) = 2 * n * 2^-53``.

needs_kernel = pytest.mark.skipif(
    "cpu" not in _ops.OP_KERNELS["update_stats"], reason="no compiled CPU update_stats kernel"
)
OP = torch.ops.amp_inspect.update_stats if "cpu" in _ops.OP_KERNELS["update_stats"] else None


def sums_rtol(numel: int) -> float:
    return 2 * max(numel, 1) * 2.0**-53


def assert_kernel_matches_reference(before, after, grads, states=()) -> None:
    got = OP(before, after, grads, list(states))
    want = update_stats_reference(before, after, grads, list(states))
    assert got[0].dtype == torch.int64 and got[1].dtype == torch.float64 and got[2].dtype == torch.float32
    assert torch.equal(got[0], want[0]), (got[0] - want[0]).nonzero().tolist()
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    numel = max([t.numel() for t in before], default=1)
    assert torch.allclose(got[1], want[1], rtol=sums_rtol(numel), atol=0), (got[1], want[1])


def random_step(rng: np.random.Generator, n: int, weight: torch.dtype, grad: torch.dtype, state: torch.dtype | None):
    """Random bit patterns (NaN, Inf, subnormals, zeros of both signs among them); about half the weights kept,
    some turned into the other zero, so lost, changed and +0 / -0 all occur."""
    from tests.test_random_bits import random_tensor

    before = random_tensor(rng, n, weight)
    keep = torch.from_numpy(rng.random(n) < 0.5)
    after = torch.where(keep, before, random_tensor(rng, n, weight))
    zeros = torch.from_numpy(rng.random(n) < 0.05)
    before = torch.where(zeros, torch.zeros((), dtype=weight), before)
    after = torch.where(zeros & torch.from_numpy(rng.random(n) < 0.5), torch.full((), -0.0, dtype=weight), after)
    g = random_tensor(rng, n, grad)
    g = torch.where(torch.from_numpy(rng.random(n) < 0.1), torch.zeros((), dtype=grad), g)
    s = None if state is None else random_tensor(rng, n, state).abs()
    return before, after, g, s


@needs_kernel
@pytest.mark.parametrize("weight", DTYPES)
@pytest.mark.parametrize("grad", DTYPES)
@pytest.mark.parametrize("state", [*DTYPES, None])
def test_kernel_equals_reference_on_random_bits(weight, grad, state) -> None:
    rng = np.random.default_rng([DTYPES.index(weight), DTYPES.index(grad), 3 if state is None else DTYPES.index(state)])
    # Sizes around the vector loop's widths (8 and 16 lanes), the kernel's 512-element block and 64Ki-element chunk,
    # and an empty tensor: each tail of the vectorised loop and of the float64 lanes.
    sizes = (1, 7, 8, 15, 16, 17, 511, 512, 513, 0, 65535, 65536, 65537)
    steps = [random_step(rng, n, weight, grad, state) for n in sizes]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert_kernel_matches_reference(before, after, grads, [] if state is None else states)


# Hostile values of each dtype, as bit patterns: zeros of both signs, infinities, NaNs with payloads (quiet and
# signalling, both signs), subnormals, the smallest normal and its neighbours, float16's smallest normal (2^-14) and
# its neighbours in the wider dtypes, 1 and its neighbours, the largest finite value.
HOSTILE_BITS = {
    torch.float32: [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF, 0x7F800001, 0xFFA00000,
        0x00000001, 0x80000002, 0x007FFFFF, 0x00400000, 0x00800000, 0x80800000, 0x00800001, 0x387FFFFF, 0x38800000,
        0x38800001, 0x3F800000, 0x3F800001, 0xBF7FFFFF, 0x7F7FFFFF, 0xFF7FFFFF,
    ],
    torch.bfloat16: [
        0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0x7FFF, 0x7F81, 0xFFC1, 0x0001, 0x8001, 0x007F, 0x0040,
        0x0080, 0x8080, 0x0081, 0x387F, 0x3880, 0x3881, 0x3F80, 0x3F81, 0xBF7F, 0x7F7F, 0xFF7F,
    ],
    torch.float16: [
        0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7E01, 0x7FFF, 0x7C01, 0xFE01, 0x0001, 0x8001, 0x03FF, 0x0200,
        0x0400, 0x8400, 0x0401, 0x83FF, 0x3C00, 0x3C01, 0xBBFF, 0x7BFF, 0xFBFF, 0x0100, 0x2000,
    ],
}  # fmt: skip


def hostile(dtype: torch.dtype) -> torch.Tensor:
    bits = np.array(HOSTILE_BITS[dtype], dtype=np.uint32 if dtype == torch.float32 else np.uint16)
    return torch.from_numpy(bits.view(np.int32 if dtype == torch.float32 else np.int16)).view(dtype)


def one_hostile_element_per_tensor(weight: torch.dtype, grad: torch.dtype, state: torch.dtype | None):
    """One tensor per (before, after) pair of hostile weights, each of 16 to 18 elements: zeros everywhere (they
    count nothing and add nothing) but one element, at a position that moves through the vector loop and its tail,
    whose gradient and state cycle through the hostile values. Weights that did not change come with a gradient of 1
    too, so every hostile weight is also a lost update. Each tensor's outputs are that one element's judgement."""
    w, g, s = hostile(weight), hostile(grad), hostile(state or torch.float32)
    pairs = [(i, j, r % len(g)) for r, (i, j) in enumerate((i, j) for i in range(len(w)) for j in range(len(w)))]
    one = len(g)  # the index of a gradient of 1 (appended)
    g = torch.cat([g, torch.ones(1, dtype=grad)])
    pairs += [(i, i, one) for i in range(len(w))]
    tensors: list[list[torch.Tensor]] = [[], [], [], []]
    for r, (i, j, k) in enumerate(pairs):
        n = 16 + r % 3
        at = (5 * r) % n
        row = [torch.zeros(n, dtype=d) for d in (weight, weight, grad, state or torch.float32)]
        row[0][at], row[1][at], row[2][at], row[3][at] = w[i], w[j], g[k], s[(r // 3) % len(s)]
        for out, t in zip(tensors, row, strict=True):
            out.append(t)
    before, after, grads, states = tensors
    return before, after, grads, states if state is not None else []


@needs_kernel
@pytest.mark.parametrize("weight", DTYPES)
@pytest.mark.parametrize("grad", DTYPES)
@pytest.mark.parametrize("state", [*DTYPES, None])
def test_kernel_judges_each_hostile_element_as_the_reference_does(weight, grad, state) -> None:
    """The CPU kernel's vectorised judge_update_element against the pure-torch reference, element by element: each
    tensor holds one judged element, so even the sums must be equal bit for bit."""
    before, after, grads, states = one_hostile_element_per_tensor(weight, grad, state)
    got = OP(before, after, grads, states)
    want = update_stats_reference(before, after, grads, states)
    for name, x, y in zip(("counts", "sums", "amax"), got, want, strict=True):
        assert torch.equal(x, y), (name, (x != y).nonzero()[:5].tolist())


@needs_kernel
@pytest.mark.cuda_emu
@pytest.mark.parametrize(
    ("weight", "grad", "state"),
    [
        (torch.float32, torch.bfloat16, torch.float16),
        (torch.bfloat16, torch.float16, torch.float32),
        (torch.float16, torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16, None),
    ],
)
def test_kernel_judges_each_hostile_element_as_the_cuda_element_logic_does(weight, grad, state) -> None:
    """The CPU kernel's judge_update_element against the CUDA kernel's tally_update_element (update_stats.h, run on
    the host through the emulation), element by element, every dtype in every role once (the emulation starts host
    threads per launch: about 4 s a case, so not all 36 combinations)."""
    before, after, grads, states = one_hostile_element_per_tensor(weight, grad, state)
    got = OP(before, after, grads, states)
    cuda = torch.ops.amp_inspect._update_stats_emulated(before, after, grads, states, 64, 1)
    for name, x, y in zip(("counts", "sums", "amax"), got, cuda, strict=True):
        assert torch.equal(x, y), (name, (x != y).nonzero()[:5].tolist())


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.sampled_from(DTYPES),
    st.sampled_from([*DTYPES, None]),
    st.lists(st.integers(0, 1100), min_size=1, max_size=4),
    st.integers(0, 2**31 - 1),
)
def test_kernel_equals_reference_on_any_sizes_and_dtypes(weight, grad, state, sizes, seed) -> None:
    """Sizes anywhere in the vector loop's, the float64 lanes' and the 512-element block's tails, several tensors."""
    rng = np.random.default_rng(seed)
    steps = [random_step(rng, n, weight, grad, state) for n in sizes]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert_kernel_matches_reference(before, after, grads, [] if state is None else states)


def sums_in_the_kernels_order(terms: np.ndarray, chunk: int = 1 << 16, lanes: int = 8) -> float:
    """A float64 sum in the order update_stats_cpu.cpp states: element i of a chunk into lane i mod 8, in element
    order; a chunk's lanes added from lane 0 to 7; the chunks' totals added in chunk order."""
    total = 0.0
    for first in range(0, len(terms), chunk):
        part = terms[first : first + chunk]
        part = np.concatenate([part, np.zeros(-len(part) % lanes)]).reshape(-1, lanes)
        acc = np.zeros(lanes)
        for row in part:  # one add per lane and row: numpy's pairwise summation would be another order
            acc = acc + row
        chunk_total = 0.0
        for x in acc.tolist():
            chunk_total += x
        total += chunk_total
    return total


@needs_kernel
def test_kernel_sums_in_its_stated_order_whatever_the_thread_count() -> None:
    rng = np.random.default_rng(22)
    sizes = (3 * (1 << 16) + 5, 1 << 16, 100, 7, 200_000)
    steps = [random_step(rng, n, torch.float32, torch.bfloat16, torch.float16) for n in sizes]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(OP(before, after, grads, states))
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(*results, strict=True):
        assert torch.equal(x, y)
    for row, (b, a) in enumerate(zip(before, after, strict=True)):
        b64, a64 = b.double().numpy(), a.double().numpy()
        finite_b, finite_a = np.isfinite(b64), np.isfinite(a64)
        with np.errstate(invalid="ignore", over="ignore"):
            change = np.where(finite_b & finite_a, np.square(a64 - b64), 0.0)
            weight = np.where(finite_b, np.square(b64), 0.0)
        assert results[0][1][row].tolist() == [sums_in_the_kernels_order(change), sums_in_the_kernels_order(weight)]


@needs_kernel
def test_kernel_equals_reference_on_the_hand_made_cases_and_layouts() -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)
    assert_kernel_matches_reference([before], [after], [grad], [grad.float().square()])
    x = torch.randn(64, 48)
    # A transposed (non-contiguous) parameter and its step: the op reads each in its logical order.
    assert_kernel_matches_reference([x.t()], [(x + 1e-3).t().contiguous()], [torch.randn(48, 64)])
    assert_kernel_matches_reference([torch.zeros(0, 3)], [torch.zeros(0, 3)], [torch.zeros(0, 3)])
    # An empty Tensor[] gives the dispatcher no key: the face answers it without the op.
    got = amp_inspect.update_stats([], [], []).outputs()
    assert [tuple(t.shape) for t in got] == [(0, len(COUNT_NAMES)), (0, 2), (0,)]


@needs_kernel
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (([torch.ones(2)], [torch.ones(2)], [], []), "one tensor per parameter"),
        (([torch.ones(2)], [torch.ones(2, dtype=torch.float16)], [torch.ones(2)], []), "keeps the dtype"),
        (([torch.ones(2)], [torch.ones(3)], [torch.ones(2)], []), "after[0] has another shape"),
        (([torch.ones(2)], [torch.ones(2)], [torch.ones(2, dtype=torch.float64)], []), "grads[0] has dtype"),
        (([torch.ones(2)], [torch.ones(2)], [torch.ones(2)], [torch.ones(1)]), "exp_avg_sq[0] has another shape"),
    ],
)
def test_kernel_refuses_bad_inputs_in_one_sentence(args, words) -> None:
    with pytest.raises(RuntimeError) as caught:
        OP(*args)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@needs_kernel
@pytest.mark.parametrize(
    "args",
    [
        ([torch.randn(5, 3)], [torch.randn(5, 3)], [torch.randn(5, 3)], []),
        (
            [torch.randn(7).bfloat16(), torch.zeros(0)],
            [torch.randn(7).bfloat16(), torch.zeros(0)],
            [torch.randn(7), torch.zeros(0)],
            [torch.rand(7).half(), torch.zeros(0)],
        ),
    ],
)
def test_opcheck(args) -> None:
    results = torch.library.opcheck(OP, args)
    assert set(results.values()) == {"SUCCESS"}, results


@needs_kernel
def test_torch_compile_traces_the_op_through_its_fake_kernel() -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)

    def lost(b: torch.Tensor, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return amp_inspect.update_stats([b], [a], [g]).lost

    compiled = torch.compile(lost, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(before, after, grad), lost(before, after, grad))


def test_the_binary_reports_the_schema_columns() -> None:
    if not _ops.extension_loaded():
        pytest.skip(f"no compiled extension: {_ops.LOAD_ERROR}")
    from amp_inspect import _C
    from amp_inspect.core.statistics import update_layout_problem

    native = _C.layout()
    if "update" not in native:
        pytest.skip("a binary built before update_stats")
    assert update_layout_problem(native) is None
    swapped = dict(
        native, update=dict(native["update"], counts=("numel", "lost", "with_grad", *native["update"]["counts"][3:]))
    )
    assert "update counts columns" in (update_layout_problem(swapped) or "")
