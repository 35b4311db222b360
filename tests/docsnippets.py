"""The code snippets of README.md and docs/*.md, and how each is to be run.

A snippet is a fenced block tagged ``python``, ``sh``, ``bash``, ``shell`` or ``console``, or
an untagged block with a line that starts with ``$ `` (a terminal transcript). Other blocks
(output, synopses, file layouts, TOML) are text. Every snippet is run by
tests/integration/test_doc_snippets.py exactly as written, unless the line just before its
fence (blank lines between allowed) is one of these HTML comments:

``<!-- not run: REASON -->``
    it is not run, and REASON (required) says why: needs an NVIDIA GPU, a real cloud, a
    server with TLS names, a file of yours, ...
``<!-- run: OPTION... -->``
    it is run with these options (space-separated):

    * ``exit=N``: every command exits N (default 0);
    * ``output``: each command's output (stdout and stderr) is exactly the lines shown
      after it (``console`` transcripts only);
    * ``until="TEXT"``: it keeps running (a server, a worker, a dashboard): it passes once
      TEXT appears in its output, then it is stopped with SIGTERM;
    * ``timeout=S``: seconds it may take (default 120);
    * ``by=tests/...py``: another test runs it (and checks more); that file must exist.

Shell snippets run with ``bash -e`` in a fresh directory that is also a fresh
``$GPULAYER_HOME``; a ``console`` transcript runs each ``$ `` line as a command (its other
lines are the output shown). Python snippets are written to ``main.py`` there and run with
this test's Python. ``gpulayer`` on PATH runs this checkout.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SHELLS = ("sh", "bash", "shell", "console")
RUN_OPTIONS = {"exit", "output", "until", "timeout", "by"}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*(not run|run)\s*:?((?:(?!-->).)*)-->\s*\Z", re.S)


@dataclass
class Snippet:
    page: str  # relative to the repository root
    line: int  # of the opening fence
    lang: str  # python or console (every shell dialect runs as bash)
    body: str
    marker: str | None = None  # "not run", "run" or None
    argument: str = ""  # the reason, or the options
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def transcript(self) -> bool:
        return self.lang == "console" and any(line.startswith("$ ") for line in self.body.splitlines())

    def commands(self) -> list[tuple[str, list[str]]]:
        """A transcript's commands, each with the output lines shown after it; a script is
        one command."""
        if not self.transcript:
            return [(self.body, [])]
        out: list[tuple[str, list[str]]] = []
        for line in self.body.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
        return out

    @property
    def exit_code(self) -> int:
        return int(self.options.get("exit", "0"))

    @property
    def timeout(self) -> float:
        return float(self.options.get("timeout", "120"))


def _options(text: str) -> dict[str, str]:
    out = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        out[key] = value
    return out


def snippets(pages: list[Path] | None = None) -> list[Snippet]:
    found = []
    for page in pages or PAGES:
        text = page.read_text()
        for m in _FENCE.finditer(text):
            tag, body = m.group(1), m.group(2)
            if tag == "python":
                lang = "python"
            elif tag in SHELLS:
                lang = "console"
            elif tag == "" and re.search(r"^\$ ", body, re.M):
                lang = "console"
            else:
                continue
            before = text[:m.start()].rstrip()
            name = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)
            snippet = Snippet(page=name, line=text[:m.start()].count("\n") + 1,
                              lang=lang, body=body)
            marker = _MARKER.search(before[-2000:])
            if marker is not None:
                snippet.marker = marker.group(1)
                snippet.argument = marker.group(2).strip()
                if snippet.marker == "run":
                    snippet.options = _options(snippet.argument)
            found.append(snippet)
    return found
