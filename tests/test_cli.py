"""The command line: every subcommand has --help, and demo, summary, report, bench and info run."""

from __future__ import annotations

import importlib.util

import pytest

from amp_inspect import cli, read_log

COMMANDS = ["demo", "report", "summary", "bench", "info"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert "usage: amp-inspect" in capsys.readouterr().out


def test_demo_finds_the_planted_trouble(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--steps", "60", "--trouble-from", "5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    records = read_log(out / "run.jsonl")
    assert len(records) == 60
    skipped = [r for r in records if r["skipped"]]
    assert skipped, "the planted overflow made GradScaler skip steps"
    findings = {r["first_nonfinite"] for r in records if r.get("first_nonfinite")}
    assert any(f.startswith("blocks.3.attn.scores: forward output") for f in findings), findings
    assert "skipped" in text and "blocks.3.attn.scores" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "report.html").stat().st_size > 10_000

    assert cli.main(["summary", str(out / "run.jsonl")]) == 0
    assert "inspected steps" in capsys.readouterr().out


def test_summary_of_an_empty_log(tmp_path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert cli.main(["summary", str(log)]) == 1


def test_bench_builtin_and_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--builtin"]) == 0
    out = capsys.readouterr().out
    assert "76 gradient tensors" in out and "per_tensor_python" in out
    assert cli.main(["info"]) == 0
    assert "CUDA kernel" in capsys.readouterr().out
