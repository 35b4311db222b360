"""Source bundles, a worker's cache of extracted ones: held while a task uses one, and kept
within its limits.

The cache (``$GPULAYER_HOME/bundles``) keeps one folder per digest (see
:func:`gpulayer.bundles.archive.extract_bundle`). A task holds a shared lock on its bundle's
folder while it runs (:func:`bundle_in_use`); :func:`evict_cache` deletes folders unused for
``GPULAYER_BUNDLE_CACHE_DAYS`` and, while the cache is over ``GPULAYER_BUNDLE_CACHE_MB``, the
least recently used, never one whose lock is held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpulayer import config
from gpulayer.bundles.archive import _DigestLock, is_digest
from gpulayer.bundles.building import _settled

__all__ = ["bundle_in_use", "evict_cache"]


def _use_lock(cache: Path, digest: str) -> Path:
    return cache / f".{digest}.inuse"


@contextlib.contextmanager
def bundle_in_use(cache_dir: str | os.PathLike[str], digest: str) -> Iterator[None]:
    """Hold bundle ``digest``'s folder in the cache while a task uses it: :func:`evict_cache`
    (in this process or another) leaves it alone. Marks the bundle as used now."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    path = _use_lock(cache, digest)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:  # else an evictor removed it between our open and our lock: again
            break
        os.close(fd)
    try:
        os.utime(path)  # the last use, which eviction goes by
        yield
    finally:
        os.close(fd)


def _tree_size(path: Path) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
    return total


#: the sizes of extracted bundles measured lately: (cache folder, digest) -> (the bundle's
#: last use when measured, its size). Only a task writes into a bundle's folder, and each
#: task's use moves the last use (see :func:`bundle_in_use`), so a size measured while no
#: task held the bundle holds until its last use moves: a worker that has extracted many
#: bundles does not walk each of their trees at every new one.
_sizes: dict[tuple[str, str], tuple[int, int]] = {}
_sizes_lock = threading.Lock()


def _held(cache: Path, digest: str) -> bool:
    """Whether a task holds the bundle now (see :func:`bundle_in_use`)."""
    try:
        fd = os.open(_use_lock(cache, digest), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (closing releases a lock it took)
    return False


def _bundle_size(cache: Path, digest: str, used: int) -> int:
    key = (str(cache), digest)
    with _sizes_lock:
        known = _sizes.get(key)
    if known is not None and known[0] == used:
        return known[1]
    held = _held(cache, digest)
    size = _tree_size(cache / digest)
    # kept where no task held it, then or meanwhile, and its last use is older than a tick of
    # the file system's clock could hide (a use within the same tick would not move it)
    if not held and not _held(cache, digest) and _settled([(used, used)], time.time_ns()):
        with _sizes_lock:
            _sizes[key] = (used, size)
    return size


#: tries at a bundle's exclusive lock before it is taken to be in use (another process's
#: :func:`_held` holds it for a moment)
_LOCK_TRIES = 5
#: a folder an eviction renamed a bundle into and was stopped before it removed it (its
#: process ended), or an extraction's that was, is removed once it is this old
_LEFTOVER_AGE = 3600.0


def evict_cache(cache_dir: str | os.PathLike[str], *, max_bytes: int | None = None,
                max_age: float | None = None, now: float | None = None) -> list[str]:
    """Delete extracted bundles unused for ``max_age`` seconds, then the least recently used
    while the cache holds more than ``max_bytes`` (defaults: ``GPULAYER_BUNDLE_CACHE_DAYS``,
    ``GPULAYER_BUNDLE_CACHE_MB``). A bundle a task holds (:func:`bundle_in_use`) is kept.
    Returns the digests deleted. A bundle's size (its tree's files, what its tasks wrote
    included) is measured again only after a task used it since."""
    env = config.settings()
    limit = int(env.bundle_cache_mb * 1024 * 1024) if max_bytes is None else max_bytes
    age = env.bundle_cache_days * 86400 if max_age is None else max_age
    now = time.time() if now is None else now
    cache = Path(cache_dir)
    if not cache.is_dir():
        return []
    entries = []
    seen = set()
    for folder in cache.iterdir():
        if folder.name.startswith(".") and (".evict-" in folder.name or ".tmp-" in folder.name):
            _remove_leftover(folder, now)
            continue
        if not (is_digest(folder.name) and folder.is_dir()):
            continue
        seen.add(folder.name)
        lock = _use_lock(cache, folder.name)
        try:
            used_ns = lock.stat().st_mtime_ns
        except FileNotFoundError:
            try:
                used_ns = folder.stat().st_mtime_ns
            except FileNotFoundError:  # (evicted meanwhile, by another worker of this home)
                continue
        entries.append((used_ns / 1e9, folder.name, _bundle_size(cache, folder.name, used_ns)))
    with _sizes_lock:  # (those gone meanwhile: another process evicted them)
        for key in [k for k in _sizes if k[0] == str(cache) and k[1] not in seen]:
            del _sizes[key]
    entries.sort()  # least recently used first
    total = sum(size for _, _, size in entries)
    removed: list[str] = []
    for used, digest, size in entries:
        if now - used <= age and total <= limit:
            break
        if _remove_unused(cache, digest):
            removed.append(digest)
            total -= size
            with _sizes_lock:
                _sizes.pop((str(cache), digest), None)
    return removed


def _remove_leftover(folder: Path, now: float) -> None:
    """Remove what an eviction or an extraction left when its process ended midway (see
    :data:`_LEFTOVER_AGE`)."""
    try:
        old = now - folder.stat().st_mtime > _LEFTOVER_AGE
    except OSError:
        return
    if old:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_unused(cache: Path, digest: str) -> bool:
    path = _use_lock(cache, digest)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for attempt in range(_LOCK_TRIES):  # (another evictor's look at it holds it a moment)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == _LOCK_TRIES - 1:
                    return False  # a task uses it
                time.sleep(0.002)
        with _DigestLock(cache / f".{digest}.lock"):  # no extraction of it meanwhile
            target = cache / digest
            if not target.is_dir():  # someone else evicted it
                return False
            # renamed first, so no one finds a half-deleted folder at the digest's path
            doomed = Path(tempfile.mkdtemp(prefix=f".{digest}.evict-", dir=cache))
            try:
                os.rename(target, doomed / "tree")
            finally:
                shutil.rmtree(doomed, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)
