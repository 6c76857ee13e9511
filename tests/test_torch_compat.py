"""torch's private names amp_inspect relies on (amp_inspect/core/torch_compat.py), each checked against the installed
torch: a torch release that renames or changes one fails here with a sentence naming it, not later as a wrong
report. And no private torch name is used anywhere else in the package."""

from __future__ import annotations

import inspect
import re
import tokenize
from pathlib import Path

import pytest
import torch
from torch import nn

from amp_inspect.core import torch_compat as compat

ROOT = Path(__file__).resolve().parents[1]


def _changed(name: str, what: str) -> str:
    return (
        f"torch {torch.__version__} changed {name} ({what}): amp_inspect/core/torch_compat.py relies on it and needs "
        "updating for this torch"
    )


def _scaled_step() -> tuple[torch.amp.GradScaler, torch.optim.Optimizer, nn.Linear]:
    lin = nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    scaler.scale(lin(torch.randn(2, 3)).sum()).backward()
    return scaler, opt, lin


def test_gradscaler_scale_tensor_init_scale_and_growth_tracker() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    assert compat.loss_scale_tensor(scaler) is None, _changed("GradScaler._scale", "None before the first scale()")
    assert compat.init_scale(scaler) == 512.0, _changed("GradScaler._init_scale", "the init_scale given")
    compat.set_init_scale(scaler, 8.0)
    scaler.scale(torch.ones(()))
    scale = compat.loss_scale_tensor(scaler)
    assert isinstance(scale, torch.Tensor) and float(scale) == 8.0, _changed(
        "GradScaler._scale / _init_scale", "the device tensor scale() starts from _init_scale"
    )
    assert scale is compat.loss_scale_tensor(scaler), _changed("GradScaler._scale", "one tensor, updated in place")
    tracker = scaler._growth_tracker
    assert isinstance(tracker, torch.Tensor), _changed("GradScaler._growth_tracker", "a device tensor")
    tracker.fill_(3)
    compat.reset_growth_tracker(scaler)
    assert int(tracker) == 0


def test_gradscaler_per_optimizer_states_and_its_stage() -> None:
    from torch.amp.grad_scaler import OptState

    scaler, opt, _ = _scaled_step()
    states = compat.optimizer_states(scaler)
    assert states.get(id(opt)) is None, _changed("GradScaler._per_optimizer_states", "empty before unscale_")
    scaler.unscale_(opt)
    state = compat.optimizer_states(scaler).get(id(opt))
    assert state is not None and state["stage"] is OptState.UNSCALED, _changed(
        "GradScaler._per_optimizer_states", "id(optimizer) -> {'stage': OptState.UNSCALED, ...} after unscale_"
    )
    assert "found_inf_per_device" in state, _changed(
        "GradScaler._per_optimizer_states", "'found_inf_per_device', which step() reads"
    )


def test_gradscaler_hooks_keep_their_parameters() -> None:
    for name, params in compat.GRADSCALER_HOOKS.items():
        method = getattr(torch.amp.GradScaler, name, None)
        assert callable(method), _changed(f"GradScaler.{name}", "InspectingGradScaler overrides or wraps it")
        got = list(inspect.signature(method).parameters)[1 : 1 + len(params)]
        assert got == list(params), _changed(f"GradScaler.{name}", f"parameters {params}, now {got}")
    scaler, opt, _ = _scaled_step()
    with pytest.raises((AssertionError, RuntimeError)):
        compat.check_scale_growth_tracker(torch.amp.GradScaler("cpu"), "test")  # no scale() yet: GradScaler refuses
    compat.check_scale_growth_tracker(scaler, "test")


def test_sparse_stored_values_of_an_uncoalesced_tensor() -> None:
    t = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2]]), torch.tensor([1.0, 2.0, 3.0]), (4,))
    values = compat.sparse_stored_values(t)
    assert values.tolist() == [1.0, 2.0, 3.0], _changed("Tensor._values", "the stored values, uncoalesced")
    values.mul_(2)
    assert compat.sparse_stored_values(t).tolist() == [2.0, 4.0, 6.0], _changed("Tensor._values", "a view")


def test_torch_compile_wrapper_and_module_compile() -> None:
    lin = nn.Linear(2, 2)
    wrapped = torch.compile(lin)
    assert isinstance(wrapped, compat.compiled_module_type()), _changed(
        "torch._dynamo.eval_frame.OptimizedModule", "the type torch.compile returns"
    )
    assert compat.compile_wrapped(wrapped) is lin, _changed("OptimizedModule._orig_mod", "the wrapped module")
    assert "_orig_mod" in dict(wrapped.named_children()), _changed("OptimizedModule._orig_mod", "a child's name")
    assert compat.compile_wrapped(lin) is lin
    inner = nn.Linear(2, 2)
    assert not compat.compiled_in_place(inner)
    inner.compile()
    assert compat.compiled_in_place(inner), _changed("Module._compiled_call_impl", "set by Module.compile()")


def test_wrapper_components_are_the_wrappers_child_names() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wrapped = checkpoint_wrapper(nn.Linear(2, 2))
    children = set(dict(wrapped.named_children()))
    assert children & compat.WRAPPER_COMPONENTS, _changed("checkpoint_wrapper", f"child names {children}")


def test_ddp_keeps_its_comm_hooks_list() -> None:
    source = inspect.getsource(nn.parallel.DistributedDataParallel.register_comm_hook)
    assert "self._comm_hooks.append" in source, _changed(
        "DistributedDataParallel._comm_hooks", "the list register_comm_hook appends (hook, state) to"
    )


def test_fused_kernels_chunk_cat_foreach_norm_and_unscale() -> None:
    a, b = torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert [float(n) for n in compat.foreach_norm([a, b])] == [5.0, 2.0], _changed("torch._foreach_norm", "L2 each")
    flat = compat.chunk_cat([a, b.view(-1)], 0, 1)
    assert flat.view(-1).tolist() == [3.0, 4.0, 1.0, 1.0, 1.0, 1.0], _changed("torch._chunk_cat", "one buffer")
    found = torch.zeros(())
    grads = [torch.tensor([2.0, float("inf")])]
    compat.non_finite_check_and_unscale_(grads, found, torch.tensor(0.5))
    assert float(found) == 1.0 and grads[0][0] == 1.0, _changed(
        "torch._amp_foreach_non_finite_check_and_unscale_", "unscale in place, found_inf set"
    )
    assert "cpu" in compat.fused_optimizer_devices(), _changed(
        "torch.utils._foreach_utils._get_fused_kernels_supported_devices", "the fused optimizers' device types"
    )


def test_public_replacements_behave_as_the_private_names_did() -> None:
    scaler, opt, lin = _scaled_step()
    assert scaler.get_growth_factor() == scaler._growth_factor and scaler.get_backoff_factor() == 0.5
    assert scaler.is_enabled() is scaler._enabled is True
    # clip_grads_with_norm_ clamps the coefficient at 1 (never scales gradients up), as amp_inspect's clip did.
    lin.weight.grad = torch.ones(1, 3)
    torch.nn.utils.clip_grads_with_norm_([lin.weight], 10.0, torch.tensor(1.0))
    assert torch.equal(lin.weight.grad, torch.ones(1, 3)), _changed("clip_grads_with_norm_", "min(1, coefficient)")
    torch.nn.utils.clip_grads_with_norm_([lin.weight], 0.5, torch.tensor(2.0))
    assert lin.weight.grad[0, 0] == pytest.approx(0.5 / (2.0 + 1e-6))
    stance = torch.compiler.set_stance("force_eager")  # takes effect at once; its exit puts the one before back
    stance.__exit__(None, None, None)


def test_the_kernels_the_build_lists_are_the_ones_the_dispatcher_has() -> None:
    """_ops.OP_KERNELS comes from the public OpOverload.has_kernel_for_dispatch_key; this asks torch's private
    dispatcher query (torch._C, allowed in a test) that the two agree for every op, and that the build's list
    (build_info, what _native loaded) says the same of tensor_stats."""
    from amp_inspect.core import ops as _ops

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, kernels in _ops.OP_KERNELS.items():
        registered = {key.lower() for key in ("CPU", "CUDA") if has(f"amp_inspect::{op}", key)}
        assert registered == kernels, f"{op}: OP_KERNELS says {set(kernels)}, the dispatcher {registered}"
        assert "cpu" in kernels  # the worktree's _C holds the CPU kernels: the comparison is not vacuous
    built = _ops.build_info()
    listed = {d for d, on in (("cpu", built.get("cpu") == "1"), ("cuda", _ops.CUDA_LOADED)) if on}
    assert listed == _ops.OP_KERNELS["tensor_stats"]


# Nowhere outside core/torch_compat.py may a private torch name appear (comments and docstrings aside).
PRIVATE = re.compile(
    r"torch(?:\.\w+)*\._(?!_)\w+|\._(?:values|scale|init_scale|growth_\w+|backoff_factor|enabled|per_optimizer_states"
    r"|orig_mod|compiled_call_impl|comm_hooks|maybe_opt_step)\b|\"_(?:device|scale|init_scale|orig_mod|comm_hooks"
    r"|per_optimizer_states|compiled_call_impl|stance|set_stance)\""
)


def _code_by_line(path: Path) -> dict[int, str]:
    """Each line's code without comments and docstrings (which name these names to explain them)."""
    lines: dict[int, str] = {}
    with path.open() as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type == tokenize.COMMENT:
                continue
            if tok.type == tokenize.STRING and tok.string.lstrip("rbfuRBFU")[:3] in ('"""', "'''"):
                continue
            lines[tok.start[0]] = lines.get(tok.start[0], "") + tok.string
    return lines


def test_no_private_torch_name_outside_the_compat_module() -> None:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "amp_inspect").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "amp_inspect/core/torch_compat.py":
            continue
        for code in _code_by_line(path).values():
            if "sys.modules.get(" in code:
                continue  # asks only whether torch imported one of its modules
            for match in PRIVATE.findall(code):
                found.setdefault(rel, set()).add(match)
    assert not found, f"private torch names outside amp_inspect/core/torch_compat.py: {found}"
