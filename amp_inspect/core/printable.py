"""Names from users' models and logs made safe to print: the one function every text output runs names through.

A module name is whatever a model (or a log someone handed you) says it is, so printed raw it can move the
cursor, recolour or retitle the terminal (``"\\x1b[31m"``, OSC sequences), forge report lines (a newline),
render reversed (bidi overrides such as U+202E) or crash the print (a lone surrogate). ``shown_name`` writes
every character ``str.isprintable`` refuses (control, format/bidi, line and paragraph separators, surrogates,
unassigned and private-use code points, spaces other than U+0020) as a Python-style escape (``\\x1b``,
``\\u202e``), and shortens a name longer than ``MAX_SHOWN`` characters in its middle, saying how many characters
it left out, so a hostile 30-million-character name costs one slice, not a 30-million-character table cell.

Every string read from a log (a dtype, a scale decision's reason, a hardware note), not only names, is printed
through it; ``mpl_text`` is the same for figures and ``html_text`` for the HTML page (the same escapes, then the
HTML ones: in a browser a bidi override reverses a table cell just as it does a terminal line).

Torch-free, so the log readers and the console use it without loading torch.
"""

from __future__ import annotations

import html

MAX_SHOWN = 160  # characters of a name shown at most (module paths of real models are far shorter)
_HEAD = 100  # kept from the start of a longer name ...
_TAIL = 40  # ... and from its end (the layer)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped(text: str) -> str:
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def shown_name(name: object, limit: int | None = MAX_SHOWN) -> str:
    """``name`` as text safe to print: unprintable characters escaped, a name longer than ``limit`` characters
    cut in its middle (``limit=None``: never cut, for whole messages that quote a name or a path)."""
    text = name if isinstance(name, str) else str(name)
    if limit is None or len(text) <= max(limit, _HEAD + _TAIL):
        return _escaped(text)
    left_out = len(text) - _HEAD - _TAIL
    return f"{_escaped(text[:_HEAD])}…[{left_out} characters]…{_escaped(text[-_TAIL:])}"


def mpl_text(text: object) -> str:
    """``text`` safe for a matplotlib label (every figure's text from a log goes through it): ``shown_name``'s
    escapes, uncut (control and format characters: terminal escapes, newlines, bidi controls such as U+2066 and
    U+202E), and ``$`` escaped, which would otherwise start mathtext (an unfinished ``$\\frac$`` stops the drawing).
    A label's own line breaks go in after this."""
    return shown_name(text, limit=None).replace("$", r"\$")


def html_text(text: object) -> str:
    """``text`` for an HTML page: ``shown_name``'s escapes, uncut, then HTML-escaped (quotes too, so it is safe
    inside attributes as well)."""
    return html.escape(shown_name(text, limit=None), quote=True)


def plural(n: int, word: str) -> str:
    """``plural(1, "step")`` is "1 step", ``plural(2, "step")`` "2 steps"."""
    return f"{n} {word}{'' if n == 1 else 's'}"
