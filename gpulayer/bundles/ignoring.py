"""Source bundles, ignore rules: the defaults, and the patterns of ``.gitignore`` and
``.gpulayerignore`` files read as git reads them (see :mod:`gpulayer.bundles`)."""

from __future__ import annotations

import functools

import pathspec

from gpulayer.errors import BundleError

__all__ = ["DEFAULT_EXCLUDES", "IGNORE_FILES"]

#: Excluded from every bundle (gitignore syntax); a ``!pattern`` in an ignore file re-includes.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    "node_modules/",
)

#: Ignore files read in every directory, in this order (a later one overrides an earlier one).
IGNORE_FILES: tuple[str, ...] = (".gitignore", ".gpulayerignore")


class _Layer:
    """The rules of one ignore source, anchored at a folder (``base``, "" or ``"a/b/"``)."""

    def __init__(self, base: str, label: str, lines: list[str], *, numbered: bool) -> None:
        self.base = base
        self.label = label
        self.lines = lines
        self.numbered = numbered
        # blank lines give no pattern in pathspec; a comment keeps indexes equal to lines
        given = [ln if ln else "#" for ln in lines]
        self.spec = _compile([_as_git_reads(ln, folder=False) for ln in given])
        for_folders = [_as_git_reads(ln, folder=True) for ln in given]
        self.folder_spec = self.spec if for_folders == given else _compile(for_folders)
        if len(self.spec.patterns) != len(lines):  # pragma: no cover - pathspec changed
            raise BundleError(f"cannot read ignore rules from {label}")

    def check(self, rel: str) -> tuple[bool, str] | None:
        """``(excluded, rule)`` when a rule of this layer matches ``rel``, else None."""
        if not rel.startswith(self.base):
            return None
        spec = self.folder_spec if rel.endswith("/") else self.spec
        result = spec.check_file(rel[len(self.base):])
        if result.include is None or result.index is None:
            return None
        line = self.lines[result.index].strip()
        where = f"{self.label}:{result.index + 1}" if self.numbered else self.label
        rule = f"{where}: {line}"
        return bool(result.include), rule


def _as_git_reads(line: str, *, folder: bool) -> str:
    """``line`` as pathspec must read it to match a folder (``folder``) or a file as git
    does. pathspec's ``data/**`` matches ``data/`` itself, which git's does not (it matches
    what is inside), so ``!data/keep.txt`` could not re-include: for a folder it is read as
    ``data/**/*``, the same but for ``data/`` itself. Its ``logs/**/`` (folders inside
    ``logs/``) matches ``logs/`` and the files directly in it: it is read as ``logs/**/*/``."""
    body = line.rstrip(" ")
    negated = body.startswith("!")
    pattern = body[1:] if negated else body
    if pattern.endswith("/**/"):
        head, tail = pattern[:-4], "/**/*/"
    elif folder and pattern.endswith("/**"):
        head, tail = pattern[:-3], "/**/*"
    else:
        return line
    if line.startswith("#") or not head.strip("*/"):  # (a comment; "/**", "**/**": everything)
        return line
    return ("!" if negated else "") + head + tail


def _compile(lines: list[str]) -> pathspec.GitIgnoreSpec:
    """The rules of these lines. A line that is no pattern (a lone ``!``, a trailing
    backslash) is ignored, as git ignores it: the rest of the file still applies."""
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except ValueError:  # (pathspec's GitIgnorePatternError: find the lines it refused)
        return pathspec.GitIgnoreSpec.from_lines([ln if _is_pattern(ln) else "#" for ln in lines])


def _is_pattern(line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except ValueError:
        return False
    return True


@functools.cache
def _default_layer() -> _Layer:
    """The built-in rules, compiled once (a layer is not changed after it is made; compiling
    these was most of a ``.remote()``'s walk of an unchanged directory)."""
    return _Layer("", "default", list(DEFAULT_EXCLUDES), numbered=False)


def _verdict(layers: list[_Layer], rel: str) -> str | None:
    """The rule that excludes ``rel`` (a directory ends in ``/``), or None if it is included."""
    excluded_by: str | None = None
    for layer in layers:
        hit = layer.check(rel)
        if hit is not None:
            excluded, rule = hit
            excluded_by = rule if excluded else None
    return excluded_by
