"""A project of many files: what each job's bundle costs, next to the least work that does
the same, in the same run.

    python bench/bundle_walk.py [--files 3000] [--runs 15] [--no-remote] [--settle S]

A temporary project of ``--files`` small Python files in folders of 50 (about 4 kB each,
a ``.gitignore`` at the top and one in every tenth folder), built here once:

* ``build_bundle`` of the unchanged tree (what every ``.remote()`` and every submit with a
  bundle pays to learn that nothing changed), next to a stat of every file the walk keeps
  (``os.walk`` and ``os.stat``: the least that notices an edit);
* ``build_bundle`` after one file was edited (the zip made again), next to a plain
  ``zipfile`` of the same files;
* with the remote rows (default), a no-op ``@gl.remote`` function's ``.remote().result()``
  whose module is at the project's top (so the project is its bundle), next to the same
  function in a folder of its own file alone, embedded (a temporary home, the SDK's worker);
  then the same after an edit of one file each time (each call a new bundle: built,
  stored, extracted by the worker, and the worker's cache kept within its limits), next to
  the lone file edited each time.

The project is left alone for ``--settle`` seconds (default ``RACY_SECONDS``) after it was
written, as a user's tree is between two edits (a file changed within that window of its
last read is read again).
Prints the table of bench/_stats.py.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import function_home
from _stats import table

FUNCTION = '''
import gpulayer as gl


@gl.remote
def noop():
    return None
'''


def make_project(root: Path, files: int) -> None:
    """``files`` Python files in folders of 50 under ``root``, and ignore files."""
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    for i in range(files):
        folder = root / "pkg" / f"part{i // 50}"
        if i % 50 == 0:
            folder.mkdir(parents=True)
            if (i // 50) % 10 == 0:
                (folder / ".gitignore").write_text("*.tmp\n")
        (folder / f"mod{i}.py").write_text(f"VALUE_{i} = {i}\n" + "# padding\n" * 400)


def samples(fn: Callable[[], object], runs: int, before: Callable[[], None] | None = None) -> list[float]:
    out = []
    for _ in range(runs):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def stat_every_file(root: Path) -> None:
    for folder, _dirs, names in os.walk(root):
        for name in names:
            os.stat(os.path.join(folder, name))


def plain_zip(paths: list[Path], root: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in paths:
            zf.write(path, path.relative_to(root).as_posix())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--remote", action=argparse.BooleanOptionalAction, default=True,
                        help="the .remote() rows too (default)")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds the tree is left alone before it is measured (default: RACY_SECONDS)")
    args = parser.parse_args()
    tmp, code, module = function_home("bench_bundle_walk", FUNCTION)
    make_project(code, args.files)
    lone = tmp / "lone"
    lone.mkdir()
    (lone / "bench_bundle_lone.py").write_text(FUNCTION)
    sys.path.insert(0, str(lone))

    from gpulayer.bundles import build_bundle, building

    racy = getattr(building, "RACY_SECONDS", 0.0) if args.settle is None else args.settle
    time.sleep(racy)  # (a tree a user is not editing this very moment)
    first = build_bundle(code)
    kept = [code / f.path for f in first.files]
    print(f"project: {len(first.files)} files, {sum(f.size for f in first.files) / 1e6:.1f} MB, "
          f"a bundle of {first.size / 1e6:.2f} MB", flush=True)

    rows = [("build_bundle, tree unchanged", samples(lambda: build_bundle(code), args.runs),
             "stat of every file", samples(lambda: stat_every_file(code), args.runs))]
    edited = kept[len(kept) // 2]
    counter = iter(range(10**9))
    rows.append(("build_bundle, one file edited",
                 samples(lambda: build_bundle(code), args.runs,
                         before=lambda: edited.write_text(f"EDITED = {next(counter)}\n")),
                 "zipfile of the same files", samples(lambda: plain_zip(kept, code), args.runs)))
    if args.remote:
        import bench_bundle_lone

        time.sleep(racy)
        module.noop.remote().result(timeout=120)  # (the worker, its fork server, the bundle)
        bench_bundle_lone.noop.remote().result(timeout=120)
        in_project, alone = [], []
        for _ in range(args.runs):  # in turn, so that a slower moment weighs on both
            in_project += samples(lambda: module.noop.remote().result(timeout=120), 1)
            alone += samples(lambda: bench_bundle_lone.noop.remote().result(timeout=120), 1)
        rows.append((".remote().result() in the project", in_project,
                     "the same, its file alone", alone))
        lone_file = lone / "bench_bundle_lone.py"
        edits = iter(range(10**9))
        after_edit, alone_edit = [], []
        for _ in range(args.runs):  # (each a new bundle: built, stored, extracted by the worker)
            after_edit += samples(lambda: module.noop.remote().result(timeout=120), 1,
                                  before=lambda: edited.write_text(f"EDITED = {next(edits)}\n"))
            alone_edit += samples(lambda: bench_bundle_lone.noop.remote().result(timeout=120), 1,
                                  before=lambda: lone_file.write_text(FUNCTION + f"# edit {next(edits)}\n"))
        rows.append((".remote().result() after an edit", after_edit,
                     "the same, its file alone", alone_edit))
    print(table(f"A project of {args.files} files, {args.runs} runs", rows))


if __name__ == "__main__":
    main()
