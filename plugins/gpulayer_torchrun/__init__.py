"""Bundled GPUlayer plugin: the ``torchrun`` distributed launcher.

Turns one node of a :class:`~gpulayer.plugin.DistributedJob` plus the job's
:class:`~gpulayer.plugin.Rendezvous` into a ``python -m torch.distributed.run`` command line
with a *static* rendezvous: every node is told ``--nnodes``, its own ``--node-rank`` and
the rank-0 worker's ``--master-addr``/``--master-port`` (the control plane picked them when
it placed the whole group). torchrun then starts ``--nproc-per-node`` processes on each
node and gives each its own ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; whatever the worker's environment said about those, torchrun's values win.

Entries:

* ``train.py`` (anything ending in ``.py`` or containing a ``/``): the script runs in
  every rank, relative to the job's working directory (the extracted source bundle).
* ``package.module:function``: every rank runs :mod:`gpulayer_torchrun.entry` (a
  stdlib-only shim shipped next to this file, run by path so the job's Python does not need
  GPUlayer installed) which imports the function and calls ``function(*args)``; the
  arguments are strings, as on a command line. The return value is ignored; an exception
  fails the rank (and so the group).
* ``package.module``: run as ``python -m package.module`` in every rank.

Output: torchrun tees each rank's stdout and stderr to files under ``--log-dir`` (a folder
under the worker's temporary directory, named after the rendezvous id and node rank) and
to the console with each line prefixed ``[rankN]:``, where N is the *global* rank; the
worker stores the console per node, so ``gpulayer jobs logs JOB --node R`` shows one node
and the default view interleaves them as ``[node R] [rankN]:...``.

torchrun never restarts a failed group itself (``--max-restarts 0``): one failed rank ends
its node, the control plane cancels the other nodes, and a retry (``retries=``) is a whole
new group with a fresh rendezvous on whatever workers are free then.

This module imports only :mod:`gpulayer.plugin`, as a third-party launcher would.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpulayer import plugin

NAME = "torchrun"
#: the shim that runs ``package.module:function`` in each rank (stdlib only)
ENTRY_SHIM = str(Path(__file__).with_name("entry.py"))
#: torchrun reads this to prefix every console line of a rank; ``${rank}`` is the global rank
PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
PREFIX_TEMPLATE = "[rank${rank}]:"

_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: an entry that names the interpreter: every rank runs the entry with the job's Python already
_INTERPRETER_RE = re.compile(r"^(python|pypy)[0-9.]*$")
_ACCEPTED = "accepted: a script ('train.py'), a module ('pkg.train') or a function ('pkg.train:main')"

__all__ = ["ENTRY_SHIM", "NAME", "build", "check", "entry_argv", "gpulayer_distributed_launchers"]


def entry_argv(entry: str, args: list[str]) -> list[str]:
    """The part of torchrun's command line after its own options: what each rank runs
    (a :class:`ValueError` for an entry no rank could start)."""
    if ":" in entry and not entry.endswith(".py"):
        module, _, function = entry.partition(":")
        if not (_MODULE_RE.match(module) and _MODULE_RE.match(function)):
            raise ValueError(f"entry {entry!r}: a function is written 'package.module:function'; {_ACCEPTED}")
        return [ENTRY_SHIM, entry, *args]
    if entry.endswith(".py") or "/" in entry or os.sep in entry:
        return [entry, *args]
    if _INTERPRETER_RE.match(entry):
        meant = _meant(args)
        if meant is None:
            raise ValueError(f"entry {entry!r}: every rank runs the entry with the job's Python, and -c code "
                             "cannot be an entry; write it to a script in the bundle and give that ('train.py')")
        raise ValueError(f"entry {entry!r}: every rank runs the entry with the job's Python; give "
                         f"{meant!r} (or a module or function), not {entry!r} before it")
    if _MODULE_RE.match(entry):
        return ["--module", entry, *args]
    raise ValueError(f"entry {entry!r}: {_ACCEPTED}")


def _meant(args: list[str]) -> str | None:
    """What ``python ARGS`` would run: the script, or the module after ``-m``, past the
    interpreter's own options (read as Python reads them: ``-W ignore``, ``-X dev`` take a
    value, ``-um pkg`` is ``-u -m pkg``); None for ``-c`` code, 'train.py' when it names nothing."""
    words = iter(args)
    for word in words:
        if not word.startswith("-") or word == "-":
            return word
        for at, flag in enumerate(word[1:] if not word.startswith("--") else "", start=2):
            if flag == "c":
                return None
            if flag in "mWX":
                value = word[at:] or next(words, None)
                if flag == "m":
                    return value or "pkg.train"
                break
    return "train.py"


def check(job: plugin.DistributedJob) -> None:
    """Refuse, where the job is submitted, an entry that no rank could start."""
    entry_argv(job.entry, list(job.args))


def log_dir(rdzv: plugin.Rendezvous, node_rank: int) -> str:
    """Where torchrun keeps this node's per-rank log files (on the worker)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", rdzv.run_id)
    return os.path.join(tempfile.gettempdir(), "gpulayer-torchrun", safe, f"node{node_rank}")


def build(job: plugin.DistributedJob, rdzv: plugin.Rendezvous, node_rank: int, python: str) -> plugin.LaunchCommand:
    """One node's torchrun command line (static rendezvous at the rank-0 worker)."""
    if not 0 <= node_rank < rdzv.nnodes:
        raise ValueError(f"node_rank {node_rank}: expected 0..{rdzv.nnodes - 1}")
    argv = [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(rdzv.nnodes),
        "--node-rank", str(node_rank),
        "--nproc-per-node", str(job.nproc_per_node),
        "--rdzv-backend", "static",
        "--rdzv-id", rdzv.run_id,
        "--master-addr", rdzv.master_addr,
        "--master-port", str(rdzv.master_port),
        "--max-restarts", "0",
        "--role", f"node{node_rank}",
        "--log-dir", log_dir(rdzv, node_rank),
        "--tee", "3",
        *entry_argv(job.entry, list(job.args)),
    ]
    env = {
        "GPULAYER_RDZV_ID": rdzv.run_id,
        "GPULAYER_NNODES": str(rdzv.nnodes),
        "GPULAYER_NPROC_PER_NODE": str(job.nproc_per_node),
        "GPULAYER_MASTER_ADDR": rdzv.master_addr,
        "GPULAYER_MASTER_PORT": str(rdzv.master_port),
        PREFIX_ENV: PREFIX_TEMPLATE,
    }
    return plugin.LaunchCommand(argv=argv, env=env)


@plugin.hookimpl
def gpulayer_distributed_launchers() -> Iterator[plugin.DistributedLauncher]:
    yield plugin.DistributedLauncher(
        name=NAME,
        description="PyTorch's torchrun (torch.distributed.run), static rendezvous at node 0",
        build=build,
        check=check,
    )
