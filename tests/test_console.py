"""The console's tables and the summary it prints (amp_inspect/render/console.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from amp_inspect.cli import commands as cli
from tests.run_logs import log_record, write_log

# ---- rich markup in module names prints literally ----


MARKUP_NAMES = ["[/bold]", "[red]x[/red]", "a[b]c", ":smile:", "[link=http://x]y[/link]"]


def test_markup_in_module_names_prints_literally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = []
    for step, name in enumerate(MARKUP_NAMES):
        r = log_record(step, skipped=True, name=name)
        records.append(r)
    last = records[-1]
    for name in MARKUP_NAMES:  # the last record holds all names, each in trouble
        last["modules"][name] = dict(last["modules"][MARKUP_NAMES[-1]])
    path = write_log(tmp_path / "run.jsonl", records)
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    flat = "".join(out.split())
    for name in MARKUP_NAMES:
        assert "".join(name.split()) in flat, (name, out)


def test_console_tables_print_markup_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from amp_inspect.render.console import print_table

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        print_table("[bold]title[/bold]", ["[red]module", "n"], [["[/bold]", 1], ["[red]x[/red]", 2]])
    out = capsys.readouterr().out
    for text in ("[bold]title[/bold]", "[red]module", "[/bold]", "[red]x[/red]"):
        assert text in out
