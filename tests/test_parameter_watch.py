"""parameter_watch.ParameterWatch: the parameters under their current names; an added or removed one warned
about by name, a module wrapped in place renamed silently."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from amp_inspect.model.parameter_watch import ParameterWatch


class Wrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


def test_added_and_removed_parameters_are_named_in_a_warning() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    watch = ParameterWatch(model)
    assert [e.name for e in watch.entries] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watch.refresh() is False  # nothing changed: no warning, no new entries
    first = watch.entries[0].param
    model.append(nn.Linear(1, 1))
    del model[0]
    # Sequential renumbers after a del: the kept layer is "0" now, the new one "1".
    with pytest.warns(RuntimeWarning, match=r"added 1\.weight, 1\.bias; removed 0\.weight, 0\.bias"):
        assert watch.refresh() is True
    assert watch.module_of(first) is None and watch.module_of(model[1].weight) == "1"


def test_a_module_wrapped_in_place_is_renamed_silently() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    watch = ParameterWatch(model)
    model[0] = Wrap(model[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watch.refresh() is True
    assert [e.module for e in watch.entries] == ["0.inner", "0.inner"]
    assert watch.module_of(model[0].inner.weight) == "0.inner"
    assert watch.module_of(torch.zeros(1)) is None
