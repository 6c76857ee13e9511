"""argparse types shared by the ``amp-inspect`` commands: a bad value is a one-line usage error (exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
