"""The package face is light: reading a run log, ``amp-inspect summary`` and ``amp-inspect report`` never import
torch, and the lazily imported names are the same objects as before.

Each check runs in a fresh interpreter whose ``sys.path`` starts with a poisoned ``torch`` (importing it raises,
even inside a ``try: import torch / except ImportError``), and which also reports whether ``torch`` reached
``sys.modules``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import amp_inspect
from amp_inspect.runlog.log import RunLog

REPO = Path(__file__).resolve().parent.parent
POISON = "raise RuntimeError('torch was imported')\n"
# The modules that read, summarise and draw a run log: none may import torch.
TORCH_FREE = (
    "amp_inspect._lazy",
    "amp_inspect._moved",
    "amp_inspect._version",
    "amp_inspect.evidence.attribution",
    "amp_inspect.scaling._checked",
    "amp_inspect.render.console",
    "amp_inspect.core.formats",
    "amp_inspect.evidence.headroom",
    "amp_inspect.diagnosis.history",
    "amp_inspect.core.printable",
    "amp_inspect.core.advice",
    "amp_inspect.readiness.report",
    "amp_inspect.core.recipes",
    "amp_inspect.runlog.log",
    "amp_inspect.scaling.policies",
    "amp_inspect.scaling.timeline",
    "amp_inspect.render.series",
    "amp_inspect.evidence.spikes",
    "amp_inspect.evidence.weights",
    "amp_inspect.diagnosis.incident",
    "amp_inspect.core.statistics",
    "amp_inspect.core.table",
    "amp_inspect.updates.report",
)


def _log(path: Path) -> Path:
    """A small run log of a headroom-policy run: a start decision, a skipped NaN step, headroom moves."""
    decision = {"margin": 2, "room_from": "this step", "offenders": []}
    steps = [
        (1.0, 8192.0, "start", None, 14),
        (8192.0, 4096.0, "nonfinite_not_from_scale", "nonfinite_not_from_scale", 2),
        (4096.0, 8192.0, "headroom", None, 3),
        (8192.0, 8192.0, "headroom", None, 2),
    ]
    with RunLog(path, hist_every=2) as log:
        for step, (scale, chosen, reason, skip, room) in enumerate(steps):
            skipped = skip is not None
            log.write(
                {
                    "step": step,
                    "scale": scale,
                    "skipped": skipped,
                    "total_norm": float("nan") if skipped else 1.0,
                    "offenders": ["head"] if skipped else [],
                    "headroom": {"up": room, "down": 9},
                    "formats": ["fp16"],
                    "modules": {
                        "head": {"numel": 8, "nan": int(skipped), "posinf": 0, "neginf": 0, "zero": 0}
                        | {"overflow": 0, "subnormal": 1, "underflow": 0, "amax": 0.5, "grad_norm": 1.0}
                    },
                    "hist": {"head": {"120": 8}},
                    "scale_decision": decision
                    | {"scale": chosen, "previous": scale, "reason": reason, "skip": skip, "room": room}
                    | ({"offenders": ["head"]} if skipped else {}),
                }
            )
    return path


def _run_without_torch(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter with a poisoned torch first on sys.path; the code's last line of
    output says whether torch is in sys.modules."""
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True, exist_ok=True)
    (poison / "__init__.py").write_text(POISON)
    script = tmp_path / "check.py"
    script.write_text(
        textwrap.dedent(code) + "\nimport sys\nprint('torch in sys.modules:', 'torch' in sys.modules, flush=True)\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison.parent), str(REPO)]), "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def _assert_torch_free(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert "torch was imported" not in result.stderr
    assert result.stdout.rstrip().splitlines()[-1] == "torch in sys.modules: False", result.stdout


def test_the_poison_works(tmp_path: Path) -> None:
    result = _run_without_torch(tmp_path, "import amp_inspect\namp_inspect.tensor_stats")
    assert result.returncode != 0 and "torch was imported" in result.stderr


@pytest.mark.parametrize("statement", ["import amp_inspect", *(f"import {m}" for m in TORCH_FREE)])
def test_imports_leave_torch_out(tmp_path: Path, statement: str) -> None:
    _assert_torch_free(_run_without_torch(tmp_path, statement))


def test_read_log_and_version_without_torch(tmp_path: Path) -> None:
    log = _log(tmp_path / "run.jsonl")
    code = f"""
        import amp_inspect
        records = amp_inspect.read_log({str(log)!r})
        print(len(records), amp_inspect.__version__)
    """
    result = _run_without_torch(tmp_path, code)
    _assert_torch_free(result)
    assert result.stdout.splitlines()[0] == f"4 {amp_inspect.__version__}"


@pytest.mark.parametrize("command", ["summary", "report", "readiness"])
def test_summary_and_report_commands_leave_torch_out(tmp_path: Path, command: str) -> None:
    if command == "report":
        pytest.importorskip("matplotlib", reason="the report needs matplotlib")
    log = _log(tmp_path / "run.jsonl")
    argv = ["amp-inspect", command, str(log)] + (
        ["-o", str(tmp_path / "out" / "r.html")] if command == "report" else []
    )
    code = f"""
        import runpy, sys
        sys.argv = {argv!r}
        try:
            runpy.run_module("amp_inspect", run_name="__main__", alter_sys=True)
        except SystemExit as end:
            print("exit", end.code)
    """
    result = _run_without_torch(tmp_path, code)
    _assert_torch_free(result)
    assert ("exit 1" if command == "readiness" else "exit 0") in result.stdout  # this log has no readiness table
    if command == "summary":
        assert "4 inspected steps, 1 skipped" in result.stdout
        assert "non-finite, not explained" in result.stdout  # a table cell: the rest wraps
    elif command == "report":
        assert (tmp_path / "out" / "r.html").is_file()


def test_face_names_are_the_modules_objects() -> None:
    import importlib

    for name in amp_inspect.__all__:
        module = importlib.import_module(f"amp_inspect.{amp_inspect._MODULE_OF[name]}")
        assert getattr(amp_inspect, name) is getattr(module, name), name
    assert set(amp_inspect.__all__) <= set(dir(amp_inspect))
    assert len(dir(amp_inspect)) == len(set(dir(amp_inspect)))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        amp_inspect.nope  # noqa: B018


def test_integrations_names_are_listed_once_after_use() -> None:
    import amp_inspect.integrations as integrations

    assert integrations.WandbLogger is importlib.import_module("amp_inspect.integrations.wandb").WandbLogger
    assert set(integrations.__all__) <= set(dir(integrations))
    assert len(dir(integrations)) == len(set(dir(integrations)))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        integrations.nope  # noqa: B018


def test_doctor_stays_the_function_after_its_module_is_imported(tmp_path: Path) -> None:
    # In a fresh interpreter the doctor's module is imported before the name is first read: the package attribute
    # must still be the function, and the package a plain module (no class swapped in to keep it so).
    code = """
        import amp_inspect.diagnosis.doctor
        import amp_inspect
        from amp_inspect.diagnosis.doctor import watch_clipping
        print(callable(amp_inspect.doctor) and not isinstance(amp_inspect.doctor, type(amp_inspect)))
        print(amp_inspect.doctor is amp_inspect.diagnosis.doctor.doctor)
        print(type(amp_inspect) is type(amp_inspect.diagnosis.doctor))
    """
    script = tmp_path / "doctor_name.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]
    assert not isinstance(amp_inspect.doctor, types.ModuleType)


def test_torch_free_modules_list_matches_what_the_log_commands_load(tmp_path: Path) -> None:
    """The summary command loads only torch-free modules of the package (a new import of a torch module there
    would fail the tests above; this names what it loads, so the list above stays honest)."""
    log = _log(tmp_path / "run.jsonl")
    code = f"""
        import json, runpy, sys
        sys.argv = ["amp-inspect", "summary", {str(log)!r}]
        try:
            runpy.run_module("amp_inspect", run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("amp_inspect."))))
    """
    result = _run_without_torch(tmp_path, code)
    _assert_torch_free(result)
    loaded = json.loads(result.stdout.rstrip().splitlines()[-2])
    faces = {f"amp_inspect.{name}" for name in amp_inspect._SUBPACKAGES}  # each __init__ imports nothing eagerly
    commands = {"amp_inspect.__main__", "amp_inspect.cli.commands", "amp_inspect.cli.argtypes"}
    assert set(loaded) - commands - faces <= set(TORCH_FREE)


def test_the_face_is_small_and_the_rest_lives_by_job() -> None:
    """About a dozen names at the top (the verbs and the types users hold); the extension points and the
    statistics' types in the subpackage of their job, each the same object as in its module."""
    assert 8 <= len(amp_inspect.__all__) <= 12, amp_inspect.__all__
    from amp_inspect.core.tensor_stats import TensorStats
    from amp_inspect.scaling.policies import HeadroomPolicy, register_policy

    assert amp_inspect.scaling.HeadroomPolicy is HeadroomPolicy
    assert amp_inspect.scaling.register_policy is register_policy
    assert amp_inspect.core.TensorStats is TensorStats


def test_old_paths_and_names_import_for_one_release_with_a_warning() -> None:
    """0.1's flat module paths (the docs taught amp_inspect.checks, amp_inspect.scale_policy ...) and the names
    the 0.1 face held still give the same objects, each with a DeprecationWarning naming the new place."""
    code = """
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from amp_inspect.checks import Finding, check
            from amp_inspect.scale_policy import ScaleDecision, register_policy
            import amp_inspect.table
            from amp_inspect.readiness import ReadinessStats
            import amp_inspect
            headroom = amp_inspect.HeadroomPolicy
        from amp_inspect.diagnosis.findings import Finding as F
        from amp_inspect.scaling.policies import HeadroomPolicy, ScaleDecision as S
        from amp_inspect.core.format_readiness import ReadinessStats as R
        assert (Finding, ScaleDecision, ReadinessStats, headroom) == (F, S, R, HeadroomPolicy)
        assert amp_inspect.table is __import__("amp_inspect.core.table").core.table
        said = [str(w.message) for w in caught if w.category is DeprecationWarning]
        print(len(said))
        print("\\n".join(said))
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    count, *said = result.stdout.splitlines()
    assert int(count) == 5, said
    assert any("amp_inspect.checks moved to amp_inspect.diagnosis.doctor" in s for s in said)
    assert any("amp_inspect.HeadroomPolicy moved to amp_inspect.scaling.policies" in s for s in said)
    assert any("amp_inspect.readiness.ReadinessStats is amp_inspect.core.format_readiness" in s for s in said)
