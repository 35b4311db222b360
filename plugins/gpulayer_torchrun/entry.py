"""Run ``package.module:function ARGS...`` in one rank of a torchrun group.

torchrun runs this file by path in every rank (``python .../entry.py pkg.mod:fn A B``);
it imports ``pkg.mod`` from the working directory (the job's source bundle) and calls
``fn("A", "B")``. The return value is ignored; an exception ends the rank with exit code 1
after printing its traceback. Standard library only: the job's Python need not have
GPUlayer installed.
"""

from __future__ import annotations

import importlib
import os
import sys


def main(argv: list[str]) -> int:
    if not argv or ":" not in argv[0]:
        print("usage: entry.py package.module:function [ARGS...]", file=sys.stderr)
        return 2
    target, args = argv[0], argv[1:]
    module_name, _, attr = target.partition(":")
    # Python put this file's folder first on sys.path; the job's code lives in the
    # working directory instead, and this folder must not shadow the job's modules.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.getcwd())
    # while the module's top-level code runs, a gl.submit() in it refuses (it would submit
    # the job again from every rank): the name is GPUlayer's documented marker
    os.environ["GPULAYER_IMPORTING_JOB_MODULE"] = target
    try:
        obj = importlib.import_module(module_name)
    finally:
        os.environ.pop("GPULAYER_IMPORTING_JOB_MODULE", None)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        print(f"entry {target!r}: {attr} is not callable", file=sys.stderr)
        return 2
    sys.argv = [target, *args]
    obj(*args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
