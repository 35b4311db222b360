"""The file of the current folder that a job names and would not find.

A job runs in a folder of its own on its worker, with only the files of its source bundle.
``python train.py`` submitted without one fails there with python's "can't open file",
``module:function`` with "no module named": true, and no help to someone who sees
``train.py`` right there. ``gpulayer submit`` and the SDK's ``gl.submit`` say so as they
submit (the CLI on stderr, the SDK as an :class:`UnsentFileWarning`), naming the file and the
way to send it. A note, not an error: the job may well find another copy (an absolute path,
the job's own ``PYTHONPATH``, an installed module). Standard library only: the CLI imports
it on its way to every submit.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from typing import Any


class UnsentFileWarning(UserWarning):
    """A job names a file of the current folder but sends no bundle, so it will not find it."""


#: commands that run a script they read from a file (a version may follow: python3.11)
_SCRIPT_RUNNER = re.compile(r"(python|pypy)[0-9.]*|bash|sh|zsh|torchrun|accelerate|deepspeed")
#: python's options that take a value as the next word
_PYTHON_VALUED = ("-X", "-W", "--check-hash-based-pycs")


def unsent_file(command: list[str], *, distributed: bool = False, env: dict[str, str] | None = None,
                local: bool = False) -> str | None:
    """The file (or module) of the current folder that ``command`` names and that a job
    submitted without a bundle would not find, or None: the script after ``python`` (or
    ``bash``, ``torchrun``, ...), the package or module after ``python -m``, a
    ``./program``, a distributed job's entry (``train.py``, ``pkg.mod:fn``). Only a relative
    name inside this folder that exists here: the job runs in a folder of its own. A module
    is not named when the job's ``env`` sets ``PYTHONPATH`` or when this Python would import
    it from elsewhere too (installed), as the job's may; with ``local`` (the job runs on this
    machine only), an editable install of this folder counts too."""

    def inside(word: str) -> bool:
        return not os.path.isabs(word) and not os.path.normpath(word).startswith(os.pardir)

    def module(name: str) -> str | None:
        top = name.partition(":")[0].split(".")[0]
        if not top or not inside(top) or "PYTHONPATH" in (env or {}):
            return None
        # (a folder without __init__.py or __main__.py is no package: an installed one of the
        # same name is imported instead, `python -m build` beside a build/ folder)
        package = any(os.path.isfile(os.path.join(top, f)) for f in ("__init__.py", "__main__.py"))
        if not (package or os.path.isfile(top + ".py")) or installed(top, here_too=local):
            return None
        return top if package else top + ".py"

    def script(word: str) -> str | None:
        return word if word and inside(word) and os.path.isfile(word) else None

    if not command:
        return None
    if distributed:
        entry = command[0]
        return script(entry) if entry.endswith(".py") or os.sep in entry else module(entry)
    if command[0].startswith(("./", "../")):
        return script(command[0])
    first = os.path.basename(command[0])
    if not _SCRIPT_RUNNER.fullmatch(first):
        return None
    python = first.startswith(("python", "pypy"))
    words = iter(command[1:])
    for word in words:
        if word == "-c":
            return None
        if python and word == "-m":
            return module(next(words, ""))
        if python and word in _PYTHON_VALUED:
            next(words, None)  # (its value)
        elif not word.startswith("-"):
            found = script(word)
            if python or found is not None:  # (python's first word is its script; torchrun's options take values)
                return found
    return None


def installed(top: str, *, here_too: bool = False) -> bool:
    """Would this Python import the top-level module ``top`` (a module or a regular package:
    a namespace package's part is not the module) from somewhere other than the current
    folder: installed, a folder of ``sys.path``, an editable install's finder? With
    ``here_too``, an editable install of the current folder counts (the job runs on this
    machine, with this Python's packages)."""
    here = os.path.realpath(os.getcwd())

    def elsewhere(i: int, entry: str) -> bool:
        if not entry:
            return False
        if os.path.realpath(entry) != here:
            return True
        # this folder, as a job on this machine would have it too: an absolute entry that
        # is not the script's own folder (sys.path[0]), such as an editable install's .pth
        # adds (a relative one, PYTHONPATH=., is the job's own folder there)
        return here_too and i > 0 and os.path.isabs(entry)

    path = [p for i, p in enumerate(sys.path) if elsewhere(i, p)]
    for finder in sys.meta_path:
        try:
            if finder is importlib.machinery.PathFinder:
                spec = finder.find_spec(top, path)
            else:
                find = getattr(finder, "find_spec", None)
                spec = find(top, None) if find is not None else None
        except Exception:  # (a finder of someone else's that fails: no answer from it)
            continue
        if spec is None or spec.loader is None or spec.origin in (None, "namespace"):
            continue
        if here_too or spec.origin in ("built-in", "frozen"):
            return True
        if not os.path.realpath(spec.origin).startswith(here + os.sep):
            return True
    return False


def unsent_in_specs(specs: Any, default_target: str = "local") -> list[str]:
    """:func:`unsent_in_spec` for many specs, each name once; specs that name the same thing
    are looked at once (the 10,000 calls of a ``.map()``: ~110 us each where the file is here)."""
    seen: set[tuple[Any, ...]] = set()
    found: list[str] = []
    for spec in specs:
        what = (spec.kind, getattr(spec, "function", None), tuple(getattr(spec, "command", ())),
                getattr(spec, "entry", None), tuple(getattr(spec, "args", ())) if spec.kind == "distributed" else (),
                "PYTHONPATH" in spec.env, "target" in spec.placement.model_fields_set, tuple(spec.placement.targets),
                spec.bundle, spec.bundle_digest)
        if what in seen:
            continue
        seen.add(what)
        name = unsent_in_spec(spec, default_target)
        if name is not None and name not in found:
            found.append(name)
    return found


def unsent_in_spec(spec: Any, default_target: str = "local") -> str | None:
    """:func:`unsent_file` for a job spec that sends no bundle: a CommandJob's command, a
    DistributedJob's entry, a FunctionJob's module. ``default_target``: the target of a spec
    that names none (the client's: ``remote`` for a self-hosted control plane)."""
    if spec.bundle is not None or spec.bundle_digest is not None:
        return None
    target = spec.placement.target if "target" in spec.placement.model_fields_set else default_target
    local = [target, *spec.placement.fallback_targets] == ["local"]
    try:
        if spec.kind == "function":
            return unsent_file([spec.function], distributed=True, env=spec.env, local=local)
        if spec.kind == "distributed":
            return unsent_file([spec.entry, *spec.args], distributed=True, env=spec.env, local=local)
        return unsent_file(list(spec.command), env=spec.env, local=local)
    except OSError:  # (the current folder was removed: nothing of it to name; the submit goes on)
        return None


def note(name: str, *, cli: bool) -> str:
    """What to tell the user about ``name``, in the spelling of the CLI or of the SDK."""
    sends, here = ("--bundle DIR", "--bundle .") if cli else ("bundle=DIR", "bundle='.'")
    return (f"{name} is in this folder, and the job will not find it: a job runs in a folder of its "
            f"own, with only the files {sends} sends ({here} sends this one)")


def entry_not_sent(spec: Any, sent: Any) -> str | None:
    """Why a distributed job's script entry (``train.py``, ``src/train.py``) will not be
    found on its nodes although it sends a bundle: the bundle's files (``sent``, their
    ``/``-separated paths) do not hold it. None when they do, or when the entry is no script
    of the bundle's folder (a module, a function, an absolute path). Every node would fail
    with python's "can't open file" once the whole group was placed."""
    if spec.kind != "distributed":
        return None
    entry = spec.entry.replace(os.sep, "/")
    if not entry.endswith(".py") or ":" in entry or entry.startswith("/"):
        return None
    path = os.path.normpath(entry).replace(os.sep, "/")
    if path.startswith("../") or path in {f.path for f in sent}:
        return None
    here = os.path.isfile(os.path.join(spec.bundle, path))
    why = ("the folder has it, but its ignore rules (.gitignore, .gpulayerignore) leave it out" if here
           else "no such file there")
    return (f"entry {spec.entry!r}: not in the bundle of {spec.bundle!r}: {why}; a script entry is "
            "a path relative to the bundle's folder")
