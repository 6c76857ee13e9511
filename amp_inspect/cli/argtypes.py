"""argparse types and options shared by the ``amp-inspect`` commands: a bad value is a one-line usage error (exit
2). Torch-free, so building the command line does not load torch."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def count(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``low``; anything else is refused with a one-line message.

    Example::

        parser.add_argument("--steps", type=count(1), default=200)
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its error for other exceptions
    return parse


DEMO_STEPS = 120  # the demo's length (amp_inspect/cli/demo.py), here so that --help needs no torch
DEMO_TROUBLE_FROM = 50


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, for ``amp-inspect demo`` and ``python -m amp_inspect.cli.demo`` alike."""
    parser.add_argument("--steps", type=count(1), default=DEMO_STEPS, help=f"training steps (default {DEMO_STEPS})")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("amp_inspect_demo"),
        help="output folder (one that holds files is kept: then <out>-2, <out>-3, ... is used)",
    )
    parser.add_argument(
        "--trouble-from",
        type=count(0),
        default=DEMO_TROUBLE_FROM,
        help=f"first step that may spike (default {DEMO_TROUBLE_FROM})",
    )
