"""The schema of statistics (amp_inspect/core/statistics.py): the compiled tables and Python's copy agree, and every
place that slices, allocates, merges or records the statistics follows the schema: the op's outputs, the fake
kernel, the reference, TensorStats, the per-module views, the ranks' reduction and the run log's fields."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core import statistics
from amp_inspect.core.formats import FORMAT_BOUNDS, HIST_BINS, float32_from_bits, float64_from_bits
from amp_inspect.core.references import tensor_stats as reference
from amp_inspect.core.statistics import OUTPUTS, PER_BIN, PER_FORMAT, PER_TENSOR, STATISTICS, layout_problem
from amp_inspect.core.tensor_stats import TensorStats
from amp_inspect.distributed.combine import reduce_stats
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.runlog import log as runlog
from tests.conftest import emulated_ops_missing

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("fp16", "bf16", "fp8_e4m3")
needs_extension = pytest.mark.skipif(not _ops.extension_loaded(), reason=f"amp_inspect._C: {_ops.LOAD_ERROR}")


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(20)
    return [
        torch.randn(700, generator=g) * 1e4,
        torch.tensor([math.nan, math.inf, -math.inf, 0.0, 1e-30, 5e-8, 70000.0, -3.0]),
        torch.randn(33, generator=g, dtype=torch.float64) * 1e-6,
        torch.randn(9, 5, generator=g).bfloat16().t(),
        torch.zeros(0),
    ]


def _native() -> dict:
    from amp_inspect import _C

    return _C.layout()


# ---------------------------------------------------------------------------------------------- one table


@needs_extension
def test_compiled_tables_equal_the_python_copy() -> None:
    native = _native()
    assert layout_problem(native) is None
    assert native["formats"] == tuple(FORMAT_BOUNDS)
    assert native["format_bounds"] == tuple(b.bits for b in FORMAT_BOUNDS.values())
    assert native["hist_bins"] == HIST_BINS
    counts = OUTPUTS[0]
    assert native["fixed_count_columns"] == sum(s.per == PER_TENSOR for s in counts.statistics)
    assert native["count_columns_per_format"] == sum(s.per == PER_FORMAT for s in counts.statistics)
    assert [o[:2] for o in native["outputs"]] == [(o.name, o.dtype) for o in OUTPUTS]


@needs_extension
def test_the_op_schema_returns_the_schema_outputs() -> None:
    ops = torch.ops.amp_inspect
    checked = [ops.tensor_stats, ops.unscale_stats_]
    if emulated_ops_missing() is None:  # the test-only library, where this build has it
        checked += [ops._tensor_stats_emulated, ops._unscale_stats_emulated_]
    for op in checked:
        assert [r.name for r in op.default._schema.returns] == list(statistics.OUTPUT_NAMES)


def _changed(native: dict, **changes) -> dict:
    return {**native, **changes}


@needs_extension
@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda n: _changed(n, formats=n["formats"][::-1]), "its formats are fp8_e5m2"),
        (
            lambda n: _changed(
                n, format_bounds=((n["format_bounds"][0][0] + 1, *n["format_bounds"][0][1:]),) + n["format_bounds"][1:]
            ),
            "its fp16 bounds",
        ),
        (lambda n: _changed(n, hist_bins=128), "128 bins"),
        (lambda n: _changed(n, count_columns_per_format=4), "5 + 4 per format"),
        (lambda n: _changed(n, outputs=n["outputs"][1:] + n["outputs"][:1]), "its outputs are"),
    ],
)
def test_a_binary_of_other_tables_is_named(change, said: str) -> None:
    assert said in (layout_problem(change(_native())) or "")


@needs_extension
def test_a_binary_of_other_tables_is_not_used(tmp_path: Path) -> None:
    """The extension whose tables differ from the package's is refused at load time, and the exact reference
    serves, with the one warning that says why: not counts in the wrong columns."""
    code = """
        import warnings
        from amp_inspect.core import formats
        import dataclasses
        formats.FORMAT_BOUNDS["fp16"] = dataclasses.replace(formats.FORMAT_BOUNDS["fp16"], zero_upto=0x33000001)
        import torch, amp_inspect
        from amp_inspect.core import ops as _ops
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stats = amp_inspect.tensor_stats([torch.ones(3)])
        print(_ops.extension_loaded(), int(stats.numel[0]))
        print(_ops.LOAD_ERROR)
        print(" | ".join(str(w.message) for w in caught))
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    loaded, error, warned = result.stdout.splitlines()[:3]
    assert loaded == "False 3"
    assert "its fp16 bounds" in error and "rebuild" in error
    assert "pure-torch reference" in warned and "its fp16 bounds" in warned


def test_float64_bounds_hold_the_float32_bounds_values() -> None:
    """The float64 bounds are the same real numbers as the float32 ones (so a float64 value is judged as its
    cast would be), except e4m3fn's overflow: "above 464" is from the next double after 464, not the next float."""
    for name, b in FORMAT_BOUNDS.items():
        for bits32, bits64 in ((b.normal_from, b.normal_from64), (b.zero_upto, b.zero_upto64)):
            assert float64_from_bits(bits64) == float32_from_bits(bits32), name
        if name == "fp8_e4m3":
            assert float64_from_bits(b.overflow_from64 - 1) == 464.0 and float32_from_bits(b.overflow_from - 1) == 464.0
        else:
            assert float64_from_bits(b.overflow_from64) == float32_from_bits(b.overflow_from), name


# ---------------------------------------------------------------------------------------------- what follows it


def test_schema_rules() -> None:
    names = [s.name for s in STATISTICS]
    assert len(set(names)) == len(names)
    for o in OUTPUTS:
        assert len({(s.dtype, s.merge) for s in o.statistics}) == 1, o.name
    for s in STATISTICS:
        assert s.merge in (statistics.SUM, statistics.MAX, statistics.MIN)
        assert s.per in (PER_TENSOR, PER_FORMAT, PER_BIN)
        assert hasattr(torch, s.dtype) and hasattr(torch, s.ufunc) and hasattr(__import__("numpy"), s.ufunc)


@pytest.mark.parametrize("kernel", ["op", "reference", "fake"])
def test_outputs_have_the_schema_shapes_and_dtypes(kernel: str) -> None:
    tensors = _inputs()
    if kernel == "op":
        outputs = _ops.tensor_stats_op(tensors, None, None, list(FORMATS))
    elif kernel == "reference":
        outputs = reference.tensor_stats_reference(tensors, None, None, list(FORMATS))
    else:  # the fake kernel is also the op's Meta kernel
        if not _ops.extension_loaded():
            pytest.skip(f"amp_inspect._C: {_ops.LOAD_ERROR}")
        outputs = torch.ops.amp_inspect.tensor_stats([t.to("meta") for t in tensors], None, None, list(FORMATS))
    assert len(outputs) == len(OUTPUTS)
    for o, t in zip(OUTPUTS, outputs, strict=True):
        assert tuple(t.shape) == o.shape(len(tensors), len(FORMATS)), o.name
        assert t.dtype == getattr(torch, o.dtype), o.name


def test_tensor_stats_has_every_statistic_and_round_trips() -> None:
    stats = amp_inspect.tensor_stats(_inputs(), formats=FORMATS)
    t, f = len(stats), len(FORMATS)
    for s in STATISTICS:
        value = getattr(stats, s.name)
        shape = {PER_TENSOR: (t,), PER_FORMAT: (t, f), PER_BIN: (t, HIST_BINS)}[s.per]
        assert tuple(value.shape) == shape and value.dtype == getattr(torch, s.dtype), s.name
    assert list(stats.as_dict()) == [s.name for s in STATISTICS]
    again = TensorStats.from_op_outputs(stats.outputs(), stats.formats)
    for s in STATISTICS:
        assert torch.equal(getattr(again, s.name), getattr(stats, s.name)), s.name
    assert torch.equal(stats.nonfinite, stats.nan + stats.posinf + stats.neginf)
    assert torch.equal(stats.norm, stats.sumsq.sqrt())
    for copied in (copy.deepcopy(stats), pickle.loads(pickle.dumps(stats))):
        assert copied.formats == stats.formats and torch.equal(copied.hist, stats.hist)
    with pytest.raises(AttributeError, match="immutable"):
        stats.numel = stats.nan
    with pytest.raises(TypeError, match="missing"):
        TensorStats(FORMATS, numel=stats.numel)
    with pytest.raises(AttributeError, match="no statistic"):
        stats.nope  # noqa: B018


def test_an_empty_tensor_holds_each_statistics_empty_value() -> None:
    empty = [torch.zeros(0), torch.zeros(0, dtype=torch.float64)]
    for stats in (
        amp_inspect.tensor_stats(empty, formats=FORMATS),
        TensorStats.from_op_outputs(reference.tensor_stats_reference(empty, None, None, list(FORMATS)), FORMATS),
    ):
        for s in STATISTICS:
            assert (getattr(stats, s.name) == s.empty).all(), s.name


def _merged(stats: TensorStats, rows: list[int]) -> dict[str, torch.Tensor]:
    """Rows merged by each statistic's declared merge."""
    out = {}
    for s in STATISTICS:
        values = getattr(stats, s.name)[rows]
        out[s.name] = {"sum": values.sum(0), "max": values.amax(0), "min": values.amin(0)}[s.merge]
    return out


@pytest.mark.parametrize("scale", [None, 1024.0])
def test_the_declared_merge_of_pieces_is_the_statistic_of_their_union(scale: float | None) -> None:
    """What "merge" means: the statistics of disjoint pieces, merged by the schema, are those of the whole
    (exact for every statistic but sumsq, whose float32 partial sums round: 2e-6, as documented)."""
    pieces = [t.float() for t in _inputs() if t.numel()]
    whole = torch.cat([p.flatten() for p in pieces])
    parts = amp_inspect.tensor_stats(pieces, formats=FORMATS, scale=scale)
    union = amp_inspect.tensor_stats([whole], formats=FORMATS, scale=scale)
    merged = _merged(parts, list(range(len(pieces))))
    for s in STATISTICS:
        got, want = merged[s.name], getattr(union, s.name)[0]
        if s.name == "sumsq":
            assert math.isclose(float(got), float(want), rel_tol=2e-6)
        else:
            assert torch.equal(got, want), s.name


def test_merging_the_statistics_of_two_pieces_gives_those_of_the_whole() -> None:
    """TensorStats.merge (steps, micro-batches): the same T tensors' pieces merged row by row by the schema."""
    tensors = [t.float().flatten() for t in _inputs() if t.numel() > 1]
    firsts, seconds = [t[: len(t) // 2] for t in tensors], [t[len(t) // 2 :] for t in tensors]
    merged = amp_inspect.tensor_stats(firsts, formats=FORMATS).merge(amp_inspect.tensor_stats(seconds, formats=FORMATS))
    whole = amp_inspect.tensor_stats(tensors, formats=FORMATS)
    for s in STATISTICS:
        if s.name == "sumsq":
            assert torch.allclose(merged.sumsq, whole.sumsq, rtol=2e-6, atol=0)
        else:
            assert torch.equal(getattr(merged, s.name), getattr(whole, s.name)), s.name
    with pytest.raises(ValueError, match="cannot merge"):
        merged.merge(amp_inspect.tensor_stats(tensors[:1], formats=FORMATS))


def test_the_module_record_merges_rows_by_the_schema_and_keeps_its_field_order() -> None:
    """report.by_module: a module's rows merged by the schema, then unscaled (amax) and derived (grad_norm, unknown
    with any NaN/Inf; amax unknown with no finite value); the fields in the run log's order, format by format."""
    tensors = [*_inputs(), torch.tensor([math.nan, math.inf])]
    modules = ["a", "b", "a", "b", "a", "c"]
    scale = 256.0
    stats = amp_inspect.tensor_stats(tensors, formats=FORMATS)
    report = StepReport(3, stats, modules, torch.tensor(scale))
    keys = ["numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow"]
    keys += [f"{k}/{fmt}" for fmt in FORMATS[1:] for k in ("overflow", "subnormal", "underflow")]
    keys += ["amax", "grad_norm"]
    assert [key for key, _, _ in statistics.module_record_fields(FORMATS)] == keys
    for name in ("a", "b", "c"):
        record = report.by_module[name]
        assert list(record) == keys
        merged = _merged(stats, [i for i, m in enumerate(modules) if m == name])
        for key, _, column in statistics.module_record_fields(FORMATS)[:-2]:
            base = key.split("/")[0]
            want = merged[base] if merged[base].dim() == 0 else merged[base][column]
            assert record[key] == int(want) and isinstance(record[key], int), (name, key)
        bad, numel = int(merged["nan"] + merged["posinf"] + merged["neginf"]), int(merged["numel"])
        if bad >= numel:
            assert math.isnan(record["amax"])
        else:
            assert record["amax"] == float(merged["amax"]) / scale
        if bad:
            assert math.isnan(record["grad_norm"])
        else:
            assert record["grad_norm"] == math.sqrt(float(merged["sumsq"])) / scale
        assert (report.module_hist(name) == merged["hist"].numpy()).all()
    assert [math.isnan(report.by_module[m]["grad_norm"]) for m in "abc"] == [False, True, True]
    assert [math.isnan(report.by_module[m]["amax"]) for m in "abc"] == [False, False, True]


def test_reduce_stats_on_one_rank_is_the_statistics_themselves() -> None:
    stats = amp_inspect.tensor_stats(_inputs(), formats=FORMATS)
    combined = reduce_stats(stats)
    assert combined.stats is stats
    assert torch.equal(combined.nonfinite_by_rank[0], stats.nonfinite)


def test_the_run_log_checks_the_schema_fields(tmp_path: Path) -> None:
    """read_log takes a module record's counts and floats from the schema: a count that is no count, or a float
    field that is no number, makes the line invalid (skipped with a warning)."""
    assert set(runlog.FLOAT_FIELDS) >= {s.name for s in STATISTICS if not s.is_count} | {"grad_norm"}
    assert list(statistics.MODULE_COUNT_FIELDS) == [s.name for s in STATISTICS if s.in_module_record and s.is_count]
    good = {"nan": 2, "overflow": 0, "amax": 1.5, "grad_norm": "nan"}
    bad = [{"nan": -1}, {"overflow": 1.5}, {"amax": "big"}, {"grad_norm": None}]
    lines = [{"schema": 1, "log": "amp_inspect", "step": i, "modules": {"m": m}} for i, m in enumerate([good, *bad])]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(RuntimeWarning, match="invalid"):
        records = runlog.read_log(path)
    assert [r["step"] for r in records] == [0]
    assert math.isnan(records[0]["modules"]["m"]["grad_norm"])


def test_a_broken_negative_scale_leaves_an_empty_modules_amax_at_plus_zero() -> None:
    """The module merge starts from each statistic's empty value, as the loop before the schema did: an empty
    module's amax over a (broken) negative scale is +0.0, not -0.0, in the run log."""
    stats = amp_inspect.tensor_stats([torch.zeros(0), torch.ones(2)])
    report = StepReport(1, stats, ["empty", "ones"], torch.tensor(-2.0))
    assert report.scale_problem is not None
    assert math.copysign(1.0, report.by_module["empty"]["amax"]) == 1.0


# ---------------------------------------------------------------------------------------------- format readiness
# The second table of the schema (statistics.READINESS): the format_readiness op's statistics, per tensor and recipe.


@needs_extension
def test_compiled_recipe_table_equals_recipes_py() -> None:
    from amp_inspect.core.recipes import ELEMENT_FORMATS, RECIPES, SCALE_RULES

    theirs = _native()["readiness"]
    assert statistics.readiness_layout_problem(_native()) is None
    assert [r[0] for r in theirs["recipes"]] == [r.name for r in RECIPES]
    assert [(r[2], r[3]) for r in theirs["recipes"]] == [(r.block, r.scale) for r in RECIPES]
    assert [float32_from_bits(e[4]) for e in theirs["element_formats"]] == [
        f.max_value for f in ELEMENT_FORMATS.values()
    ]
    assert theirs["scale_rules"] == SCALE_RULES
    assert [o[0] for o in theirs["outputs"]] == list(statistics.READINESS_OUTPUT_NAMES)


def _readiness_changed(native: dict, **changes) -> dict:
    return {**native, "readiness": {**native["readiness"], **changes}}


@needs_extension
@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: {"recipes": r["recipes"][::-1]}, "its recipes are (('nvfp4'"),
        (lambda r: {"recipes": ((*r["recipes"][0][:2], 64, r["recipes"][0][3]), *r["recipes"][1:])}, "'e4m3', 64,"),
        (lambda r: {"element_formats": ((*r["element_formats"][0][:4], 0x43E80000), *r["element_formats"][1:])},
         "its element formats"),
        (lambda r: {"scale_rules": r["scale_rules"][:-1]}, "its scale rules"),
        (lambda r: {"e8m0_exponents": (-126, 127)}, "E8M0 range"),
        (lambda r: {"columns": (3, 5, 1, 1)}, "its readiness columns are (3, 5, 1, 1)"),
        (lambda r: {"outputs": r["outputs"][::-1]}, "its readiness outputs"),
    ],
)  # fmt: skip
def test_a_binary_of_another_recipe_table_is_named_and_refused(change, said: str) -> None:
    native = _native()
    changed = _readiness_changed(native, **change(native["readiness"]))
    assert said in (statistics.readiness_layout_problem(changed) or "")
    assert said in (layout_problem(changed) or "")  # what core/_native.py asks at load time: the binary is refused


@needs_extension
def test_a_binary_without_one_of_the_ops_is_refused_whole() -> None:
    """A binary built before format readiness or update_stats is not half-used (tensor_stats from it, the other
    ops from the references): core/_native.py refuses it as it refuses one whose tables differ."""
    native = _native()
    assert layout_problem(native) is None
    for op, table in (("format_readiness", "readiness"), ("update_stats", "update")):
        older = {k: v for k, v in native.items() if k != table}
        assert f"it has no {op} op" in (layout_problem(older) or ""), op


@needs_extension
def test_the_readiness_op_schema_returns_the_readiness_outputs() -> None:
    returns = torch.ops.amp_inspect.format_readiness.default._schema.returns
    assert [r.name for r in returns] == list(statistics.READINESS_OUTPUT_NAMES)


def test_readiness_schema_rules_and_the_contracts_columns() -> None:
    """counts [T, 3 + 4R]: numel, nonzero, nonfinite, then per recipe flushed, saturated, blocks, scale_flushed;
    sums [T, 1 + R]: sq_signal, then sq_error per recipe (READINESS_CONTRACT's layout, from the schema)."""
    counts, sums, amax = statistics.READINESS_OUTPUTS
    assert counts.recipe_major and sums.recipe_major and amax.one_dimensional
    assert counts.shape(5, 3) == (5, 15) and sums.shape(5, 3) == (5, 4) and amax.shape(5, 3) == (5,)
    per_recipe = ("flushed", "saturated", "blocks", "scale_flushed")
    assert [statistics.output_column(counts, n, r, 3) for r in range(3) for n in per_recipe] == list(range(3, 15))
    assert [statistics.output_column(counts, n, 0, 3) for n in ("numel", "nonzero", "nonfinite")] == [0, 1, 2]
    assert [statistics.output_column(sums, "sq_error", r, 3) for r in range(3)] == [1, 2, 3]
    for s in statistics.READINESS:
        assert s.per in (PER_TENSOR, statistics.PER_RECIPE) and hasattr(torch, s.ufunc)
    assert {s.name for s in statistics.READINESS if s.merge == statistics.MAX} == {"amax"}


def test_readiness_stats_fields_are_the_schemas_statistics() -> None:
    import dataclasses

    from amp_inspect.core import format_readiness as readiness

    names = [f.name for f in dataclasses.fields(readiness.ReadinessStats) if f.name not in ("recipes", "delayed")]
    assert names == [s.name for s in statistics.READINESS]
    for s in statistics.READINESS:
        assert f"``{s.name}``" in (readiness.ReadinessStats.__doc__ or "")
    for d in statistics.READINESS_DERIVED:
        assert isinstance(getattr(readiness.ReadinessStats, d.name), property), d.name


def test_readiness_derived_values_agree_on_numbers_arrays_and_tensors() -> None:
    np = pytest.importorskip("numpy")
    rows = {"sq_signal": [4.0, 1.0, 0.0], "sq_error": [0.04, 0.0, 0.0], "nonzero": [5, 2, 0], "flushed": [1, 0, 0]}
    rows["saturated"] = [0, 2, 0]
    tensors = {k: torch.tensor(v) for k, v in rows.items()}
    arrays = {k: np.array(v) for k, v in rows.items()}
    for d in statistics.READINESS_DERIVED:
        on_tensors = statistics.derive_readiness(d.name, tensors).tolist()
        on_arrays = list(statistics.derive_readiness(d.name, arrays))
        on_numbers = [statistics.derive_readiness(d.name, {k: v[i] for k, v in rows.items()}) for i in range(3)]
        for a, b, c in zip(on_tensors, on_arrays, on_numbers, strict=True):
            assert (math.isnan(a) and math.isnan(b) and math.isnan(c)) or a == b == c, d.name
    assert statistics.derive_readiness("sqnr_db", tensors).tolist()[:2] == [20.0, math.inf]


@needs_extension
def test_the_readiness_fake_kernel_has_the_schema_shapes() -> None:
    tensors = [torch.randn(3, 5), torch.randn(7).bfloat16()]
    real = _ops.format_readiness_op(tensors, [0, 7], None)
    fake = torch.ops.amp_inspect.format_readiness([t.to("meta") for t in tensors], [0, 7], None)
    for o, r, f in zip(statistics.READINESS_OUTPUTS, real, fake, strict=True):
        assert tuple(r.shape) == tuple(f.shape) == o.shape(2, 2) and r.dtype == f.dtype == getattr(torch, o.dtype)
