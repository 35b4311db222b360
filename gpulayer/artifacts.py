"""Artifacts: the files a task leaves in its artifacts folder (``GPULAYER_ARTIFACTS_DIR``),
stored with its job when it ends (docs/concepts.md, "Artifacts"). This module is what a
reader does with them (:func:`download`: ``gpulayer jobs artifacts``, ``handle.artifacts()``)
and the limits that the worker, the control plane and the reader share; the worker's side
is :mod:`gpulayer.worker.artifacts`, the store's :mod:`gpulayer.control.artifacts`.

Imports the standard library and GPUlayer's light modules only (a worker and the CLI use it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gpulayer import config
from gpulayer.bundles.archive import Limits, extract_into, format_size
from gpulayer.errors import BundleError, GpulayerError, InvalidInput, NotFound
from gpulayer.wire import TaskArtifacts

if TYPE_CHECKING:
    from gpulayer.api import ClientAPI

__all__ = ["Downloaded", "download", "format_size", "latest", "limits", "older_server", "too_large", "usable_folder"]


def limits() -> Limits:
    """What a task's artifacts may hold: as many files as a bundle, and as many bytes once
    extracted as the larger of a bundle's and the artifacts' own limit; a compression ratio
    is not limited (a task's own file of zeros is no attack on the reader who asked for it)."""
    env = config.settings()
    unpacked = max(config.max_artifacts_bytes(), int(env.max_bundle_unpacked_mb * 2**20))
    return Limits(max_entries=env.max_bundle_files, max_unpacked=unpacked, max_ratio=float("inf"))


def too_large(size: int | None = None) -> str:
    """Why artifacts over the limit are refused (``size``: their zip's bytes, when known)."""
    most = config.max_artifacts_bytes()
    got = "" if size is None else f"{format_size(size)} zipped; "
    return (f"artifacts are over the control plane's limit: {got}the limit is {format_size(most)} "
            f"({most} bytes, GPULAYER_MAX_ARTIFACTS_MB)")


def older_server(exc: NotFound, location: str) -> str | None:
    """What a server from before artifacts answers (404, ``no such route``) means, as a reader
    of them is told and a task's output says (None: ``exc`` is another 404)."""
    if not str(exc).endswith(": no such route"):
        return None
    return f"the control plane at {location} keeps no artifacts: its server is older than artifacts; upgrade it"


def latest(listing: list[TaskArtifacts]) -> list[TaskArtifacts]:
    """Of a job's artifacts, those of its last attempt that left any, by node."""
    if not listing:
        return []
    attempt = max(t.attempt for t in listing)
    return sorted((t for t in listing if t.attempt == attempt), key=lambda t: t.node_rank)


class Downloaded(NamedTuple):
    job_id: str
    #: the folder they were extracted into
    to: Path
    attempt: int
    #: each file's path under ``to``
    files: list[str]
    #: bytes of the files
    unpacked: int


def download(api: ClientAPI, job_id: str, to: str | os.PathLike[str] | None, *, nodes: int = 1,
             where: str = "to") -> Downloaded:
    """Extract the job's artifacts (its last attempt's that left any) into ``to`` (default:
    a folder named after the job in the working directory), which must not exist or be
    empty; a job of several ``nodes`` gets a folder per node (``node-0``, ``node-1``, ...).
    One cut short (an outage) leaves the folder as it was, to be tried again.
    ``where``: how the caller names ``to`` in errors (``--to``)."""
    listing = api.list_artifacts(job_id)
    chosen = latest(listing)
    if not chosen:
        raise NotFound(f"{job_id} has no artifacts: none of its tasks left a file in $GPULAYER_ARTIFACTS_DIR")
    dest = Path(job_id if to is None else to)
    # (named as given; the default, which no one typed, as the default)
    shown = f"{where} {dest}" if to is not None else \
        f"{dest} (the folder by default; give {where + ' DIR' if where.startswith('-') else where + '=...'} for another)"
    made = not usable_folder(dest, shown)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"{shown}: {exc.strerror or exc}") from None
    files: list[str] = []
    try:
        for t in chosen:
            data = api.get_artifacts(job_id, t.task_id)
            inner = dest / f"node-{t.node_rank}" if nodes > 1 else dest
            inner.mkdir(exist_ok=True)
            try:
                got = extract_into(data, t.digest, inner, limits=limits())
            except BundleError as exc:
                raise GpulayerError(f"the artifacts of {job_id} (task {t.task_id}) cannot be extracted: {exc}") \
                    from None
            prefix = f"node-{t.node_rank}/" if nodes > 1 else ""
            files += [prefix + f for f in got]
    except BaseException:  # (an outage, a Ctrl-C: the folder as it was, new or empty, to be tried again)
        _undo(dest, made)
        raise
    return Downloaded(job_id, dest, chosen[0].attempt, files, sum(t.unpacked for t in chosen))


def usable_folder(dest: Path, shown: str) -> bool:
    """Whether ``dest`` exists, refusing (:class:`InvalidInput`, naming it as ``shown``) one
    that is a file or a folder that is not empty: artifacts go into a new or empty folder."""
    try:
        if not dest.exists():
            return False
        if not dest.is_dir() or any(dest.iterdir()):
            raise InvalidInput(f"{shown}: {'is not a folder' if not dest.is_dir() else 'is not empty'}; "
                               "artifacts go into a new or empty folder")
    except OSError as exc:
        raise InvalidInput(f"{shown}: {exc.strerror or exc}") from None
    return True


def _undo(dest: Path, made: bool) -> None:
    """Remove what a download cut short wrote into ``dest``: the folder, which it ``made``, or
    what it put in it (it was empty)."""
    if made:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for entry in list(dest.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
