"""Text from users' jobs, made safe to print on a terminal.

A job's command, name or function comes from whoever submitted it; printed as it is, an
escape sequence in it (``\\x1b]0;...``, ``\\x1b[2J``) would retitle, clear or rewrite the
reader's terminal, and a newline or a bidirectional override would forge table rows.
:func:`printable` shows every such character as its Python escape instead (``\\x1b``,
``\\n``, ``\\u202e``); everything else is left as it is.
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.specs import Requirements

__all__ = ["cell", "columns", "printable", "printable_lines", "requirements_text"]


def _escape(ch: str) -> str:
    # control characters (C0, DEL, C1) and invisible format characters (bidi overrides,
    # zero-width marks), as their escapes; the ASCII ones by name (\n, \t), as Python writes them
    if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
        return repr(ch)[1:-1] if ord(ch) < 0x80 else (f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}")
    return ch


def printable(text: str) -> str:
    """``text`` with every control or invisible format character escaped."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)


def printable_lines(text: str, indent: str) -> str:
    """A message of several lines (an unschedulable job's reasons) as lines of the output,
    each made :func:`printable`, the second and later ones after ``indent``, so none can
    pass for a field of its own."""
    return ("\n" + indent).join(printable(line) for line in text.split("\n"))


def columns(text: str) -> int:
    """How many columns ``text`` takes on a terminal: a wide character (``训``, most emoji)
    two, a combining mark (the accent of a decomposed ``é``) none, anything else one."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def cell(text: str, width: int) -> str:
    """``text`` as a table cell ``width`` columns wide: cut to fit (``len`` counted
    characters, so a name in CJK or with a decomposed accent shifted every column after
    it), then padded with spaces."""
    while columns(text) > width:
        text = text[:-1]
    return text + " " * (width - columns(text))


def requirements_text(req: Requirements) -> str:
    """What a job needs, written as ``gpulayer submit``'s flags (the one way the CLI shows
    requirements): ``--accelerator cuda --gpus 2 --framework 'torch>=2.2'``."""
    import shlex

    from gpulayer.joboptions import CLI_SPELLING as spelling

    words: list[str] = []
    for path, value in req.model_dump(exclude_defaults=True).items():
        flag = spelling.name(f"requirements.{path}")
        if isinstance(value, dict) and path == "frameworks":
            words.extend(f"{flag} {shlex.quote(name + spec)}" for name, spec in value.items())
        elif isinstance(value, dict):
            words.extend(f"{flag} {shlex.quote(f'{k}={v}')}" for k, v in value.items())
        else:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            words.append(f"{flag} {shlex.quote(text)}")
    return " ".join(words)
