"""Source bundles: how a job's code travels to a worker.

A directory becomes a **deterministic zip** addressed by the SHA-256 of its bytes (64 lowercase
hex characters). The same tree always gives the same address, whatever the files' mtimes, the
order they were created in or the user's umask, so a bundle is uploaded once and extracted once
per worker. See ``docs/bundles.md`` (for users) and ``docs/adr/0001-source-bundles.md`` (why).

What goes in
    Every regular file under the directory, except what the rules exclude:

    * defaults: ``.git``, ``.venv/``, ``venv/``, ``__pycache__/``, ``*.pyc``, ``node_modules/``;
    * ``GPULAYER_HOME`` when it is inside the directory (this machine's state: never included);
    * ``.gitignore`` and ``.gpulayerignore`` files, at the top and in any subdirectory, with git's
      semantics (pathspec): patterns are relative to the folder of the file that holds them, a
      deeper file overrides a shallower one, ``.gpulayerignore`` overrides the ``.gitignore``
      beside it, and the last matching pattern wins, so ``!pattern`` re-includes what an earlier
      rule (a default included) excluded. As in git, nothing inside an excluded directory can be
      re-included: the directory is never entered.

Symlinks
    A symlink to a regular file *inside* the directory is stored as a regular file holding the
    target's content and executable bit. Symlinks to directories, to anything outside the
    directory, and broken ones are never followed: they are excluded, and the inspection says so.
    Bundles therefore never contain symlink entries, and extraction refuses any.

The zip
    Entries sorted by path (``/`` separated), no directory entries, timestamps fixed at
    1980-01-01, permissions normalised to ``0644`` or ``0755`` (only the executable bit is kept,
    as in git), deflate at a fixed level: byte for byte what Python's ``zipfile`` writes of
    those entries, but written by :mod:`.building` itself, which reuses the compressed bytes
    of the files unchanged since the last build. The address depends on zlib's output, so two machines
    with different zlib builds may give the same tree different addresses; that costs one extra
    upload, never a wrong result, since every extraction checks the bytes against the address.

Checking and extraction
    :func:`check_archive` (uploads, ``gpulayer bundle inspect`` of an archive) and
    :func:`extract_bundle` (workers) check the SHA-256 first and refuse unsafe archives
    (absolute paths, ``..``, drive letters, backslashes, symlinks, duplicates, too many
    entries, too much content, too high a compression ratio) before writing anything; a
    worker extracts once per cache directory, atomically, under a lock, and
    :func:`evict_cache` keeps that cache within its size and age limits.

The code lives in five modules: :mod:`gpulayer.bundles.building` (what goes in, and a
build), :mod:`gpulayer.bundles.ignoring` (the ignore rules, read as git reads them),
:mod:`gpulayer.bundles.zipping` (the zip itself), :mod:`gpulayer.bundles.archive`
(addresses, limits, checking, extraction) and :mod:`gpulayer.bundles.cache` (a worker's
extracted bundles: held while in use, evicted).
"""

from __future__ import annotations

from gpulayer.bundles.archive import (
    DEFAULT_MAX_ENTRIES,
    MAX_DEPTH,
    RATIO_FLOOR,
    Limits,
    check_archive,
    compute_digest,
    extract_bundle,
    format_size,
    is_digest,
    verify_digest,
)
from gpulayer.bundles.building import (
    DEFAULT_EXCLUDES,
    IGNORE_FILES,
    Bundle,
    BundleFile,
    BundleRefused,
    BundleTooLarge,
    Excluded,
    Inspection,
    build_bundle,
    build_from_inspection,
    inspect_directory,
)
from gpulayer.bundles.cache import bundle_in_use, evict_cache

__all__ = [
    "DEFAULT_EXCLUDES",
    "DEFAULT_MAX_ENTRIES",
    "IGNORE_FILES",
    "MAX_DEPTH",
    "RATIO_FLOOR",
    "Bundle",
    "BundleFile",
    "BundleRefused",
    "BundleTooLarge",
    "Excluded",
    "Inspection",
    "Limits",
    "build_bundle",
    "build_from_inspection",
    "bundle_in_use",
    "check_archive",
    "compute_digest",
    "evict_cache",
    "extract_bundle",
    "format_size",
    "inspect_directory",
    "is_digest",
    "verify_digest",
]
