"""Rewrites the demo's figures quoted in the docs from a demo run, so that they are measured, not typed.

Each quoted figure sits between two markers in its page, ``<!-- demo:NAME -->`` and ``<!-- /demo:NAME -->``; this
script replaces what is between them with what the demo's run log says now (``figures``) and leaves the rest of
the page alone. tests/test_docs.py runs the demo once and checks that every page equals what this script would
write, so a change to the demo that moves a figure fails there until the script is run.

    .venv/bin/python docs/regenerate_demo_figures.py                  # runs the demo (seconds), rewrites the docs
    .venv/bin/python docs/regenerate_demo_figures.py --log run.jsonl  # from an existing run log of the demo
    .venv/bin/python docs/regenerate_demo_figures.py --check          # says which page is stale, exit 1; writes nothing

The figures are the demo's on the CPU (a GPU's fp16 matmuls round differently); they depend on its seed and
settings, and through fp16 rounding on the CPU's matmul kernels: an AVX-512 CPU's kernels sum in another order
than an AVX2 CPU's, so a few updates land the other side of a rounding boundary. A page is stale when its words
differ from the run's or a number differs by more than ``CPU_ROUNDING`` (relative); column widths that follow a
number's length are not words. Pages that agree are left as they are, so a run on another CPU rewrites nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHOWN_LOG = "amp_inspect_demo/run.jsonl"  # the demo's log as a user who ran `make demo` names it
UPDATES_ROWS = 3  # the first rows of `amp-inspect updates` quoted in docs/usage.md
SPIKING = "blocks.3.attn.scores"  # the demo's planted logit spike (amp_inspect/cli/demo.py)
HEAD = "head"  # the module closest to the output: the loss scale's ceiling overflows there first
# How far a quoted figure may sit from the run's: the demo on an AMD EPYC (AVX2) and on an Intel Ice Lake
# (AVX-512) differed by at most 2.2% in a figure (0.135% against 0.132% of a module's updates lost); a change to
# the demo moves its figures further than that, or changes the words.
CPU_ROUNDING = 0.05
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


def _updates_block(log: Path) -> str:
    """`amp-inspect updates` on the demo's log, its headline and first rows as the command prints them."""
    from amp_inspect.cli import commands
    from amp_inspect.runlog.log import read_log

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        commands.main(["updates", str(log)])
    lines = out.getvalue().splitlines()[: 3 + UPDATES_ROWS]  # headline, column names, rule, rows
    measured = [r["step"] for r in read_log(log) if "update" in r]
    return "\n".join(
        [
            "```sh",
            f"$ amp-inspect updates {SHOWN_LOG}",
            *lines,
            f"$ amp-inspect updates {SHOWN_LOG} --step {measured[-1]}     # one measured step",
            "```",
        ]
    )


def _blame_sentence(log: Path) -> str:
    """Where the skipped steps' NaN/Inf started in the demo, in the words of docs/usage.md's blame section."""
    from amp_inspect.diagnosis.history import StepRecord, nonfinite_blame
    from amp_inspect.evidence.attribution import LOSS_OR_FORWARD
    from amp_inspect.runlog.log import read_log

    blame = nonfinite_blame([StepRecord.from_log_record(r) for r in read_log(log)])
    told = {LOSS_OR_FORWARD, HEAD, SPIKING}
    if set(blame.origins) - told:
        raise ValueError(
            f"the demo's skipped steps started in {sorted(set(blame.origins) - told)} too, which docs/usage.md's "
            "sentence does not tell: rewrite the sentence (and this script) for the demo's new story"
        )
    return (
        f"In the demo, {blame.origins[LOSS_OR_FORWARD]} of the {blame.steps} skipped steps read so (the planted logit "
        f"spike, on steps the hooks were not armed), {blame.origins[HEAD]} are the head's own overflow at the top of "
        f"the scale and {blame.origins[SPIKING]} the hooks' finding."
    )


# Which figures each page quotes: page -> {marker name: how to make its text from the demo's log}.
FIGURES: dict[str, dict[str, Callable[[Path], str]]] = {
    "docs/usage.md": {"updates": _updates_block, "blame": _blame_sentence},
}


def marked(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- demo:{name} -->\n?)(.*?)(\n?<!-- /demo:{name} -->)", re.S)


def rewrite(text: str, figures: dict[str, str], page: str = "the page") -> str:
    """``text`` with what is between each figure's markers replaced by the figure; a missing marker is an error."""
    for name, figure in figures.items():
        pattern = marked(name)
        if len(pattern.findall(text)) != 1:
            raise ValueError(f"{page} must hold the markers <!-- demo:{name} --> and <!-- /demo:{name} --> once each")
        text = pattern.sub(lambda m, figure=figure: m.group(1) + figure + m.group(3), text)
    return text


def _numbers_and_words(text: str) -> tuple[list[str], list[str]]:
    """The numbers in ``text`` and the words between them, runs of blanks made one (a table's padding)."""
    words = [re.sub(r"[ \t]+", " ", part) for part in NUMBER.split(text)]
    return NUMBER.findall(text), words


def _close(quoted: str, measured: str, rel: float) -> bool:
    """Two numbers as written: the same text, or values within ``rel`` of each other (both finite)."""
    if quoted == measured:
        return True
    q, m = float(quoted.replace(",", "")), float(measured.replace(",", ""))
    return math.isfinite(q) and math.isfinite(m) and abs(q - m) <= rel * max(abs(q), abs(m))


def agree(quoted: str, measured: str, rel: float = CPU_ROUNDING) -> bool:
    """Whether a page quoting ``quoted`` tells the run ``measured``: the same words, each number within ``rel``."""
    quoted_numbers, quoted_words = _numbers_and_words(quoted)
    numbers, words = _numbers_and_words(measured)
    if quoted_words != words:
        return False
    return all(_close(q, m, rel) for q, m in zip(quoted_numbers, numbers, strict=True))


def rewritten_pages(log: Path, root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """For each page that quotes the demo: (its text now, its text with the figures of ``log``)."""
    pages = {}
    for page, makers in FIGURES.items():
        text = (root / page).read_text()
        pages[page] = (text, rewrite(text, {name: make(log) for name, make in makers.items()}, page))
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="a run log of the demo (default: run the demo now)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = args.log
        if log is None:
            from amp_inspect.cli.demo import run

            with contextlib.redirect_stdout(io.StringIO()):  # the figures, not the demo's own printing
                log = run(out_dir=Path(tmp) / "demo", device="cpu")
        stale = []
        for page, (now, new) in rewritten_pages(log).items():
            if agree(now, new):
                continue
            stale.append(page)
            if not args.check:
                (ROOT / page).write_text(new)
    verb = "stale" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "the docs' demo figures are up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
