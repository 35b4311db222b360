"""Source bundles: determinism, ignore rules, limits, safe and once-only extraction, CLI
(malicious and broken archives: test_bundle_archives.py)."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpulayer import bundles
from gpulayer.bundles import (
    Bundle,
    BundleFile,
    BundleTooLarge,
    build_bundle,
    compute_digest,
    extract_bundle,
    inspect_directory,
    verify_digest,
)
from gpulayer.errors import BundleError, InvalidInput
from tests.bundle_attacks import cache_is_clean


def write(root: Path, rel: str, content: bytes | str = b"x", mode: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        path.chmod(mode)
    return path


def tree_of(directory: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under ``directory``: content and whether it is executable."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            out[path.relative_to(directory).as_posix()] = (
                path.read_bytes(), bool(path.stat().st_mode & stat.S_IXUSR),
            )
    return out


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    write(root, "main.py", "print('hi')\n")
    write(root, "pkg/__init__.py", "")
    write(root, "pkg/model.py", "X = 1\n")
    write(root, "run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    write(root, "data/small.csv", "a,b\n1,2\n")
    return root


# --------------------------------------------------------------------------------------------
# building and determinism


def test_bundle_basics(project: Path) -> None:
    bundle = build_bundle(project)
    assert isinstance(bundle, Bundle)
    assert len(bundle.digest) == 64 and bundle.digest == hashlib.sha256(bundle.data).hexdigest()
    assert bundle.size == len(bundle.data)
    assert [f.path for f in bundle.files] == [
        "data/small.csv", "main.py", "pkg/__init__.py", "pkg/model.py", "run.sh",
    ]
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == [f.path for f in bundle.files]  # sorted, no dirs
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        modes = {i.filename: (i.external_attr >> 16) for i in infos}
        assert modes["run.sh"] == stat.S_IFREG | 0o755
        assert modes["main.py"] == stat.S_IFREG | 0o644
        assert zf.read("pkg/model.py") == b"X = 1\n"


def test_same_tree_same_digest_despite_mtimes_order_and_permissions(tmp_path: Path) -> None:
    files = {"b/z.py": "z", "a.py": "a", "b/c/d.txt": "d" * 1000, "tool": "#!/bin/sh\n"}
    one, two = tmp_path / "one", tmp_path / "two"
    for rel, content in files.items():
        write(one, rel, content, mode=0o755 if rel == "tool" else 0o644)
    for rel, content in reversed(list(files.items())):  # a different order of creation
        write(two, rel, content, mode=0o700 if rel == "tool" else 0o600)  # a different umask
    first = build_bundle(one)
    assert build_bundle(two).digest == first.digest
    for path in one.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    time.sleep(0.01)
    (two / "a.py").touch()
    assert build_bundle(one).digest == first.digest
    assert build_bundle(two).digest == first.digest
    assert build_bundle(one).data == first.data


def test_content_name_or_executable_bit_change_the_digest(project: Path) -> None:
    base = build_bundle(project).digest
    (project / "main.py").chmod(0o755)
    exec_digest = build_bundle(project).digest
    assert exec_digest != base
    (project / "main.py").chmod(0o644)
    assert build_bundle(project).digest == base
    (project / "main.py").write_text("print('bye')\n")
    assert build_bundle(project).digest != base



#: the racy window the tests below use, and a pause longer than it: what the tree holds then
#: is read and remembered (the default window is seconds long)
WINDOW = 0.05
SETTLE = 0.1


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundles.building, "RACY_SECONDS", WINDOW)


class Listings:
    """Counts the folders listed (``os.scandir``) while it is on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folders: list[str] = []
        real = os.scandir

        def spy(path: Any) -> Any:
            self.folders.append(os.fspath(path))
            return real(path)

        monkeypatch.setattr(bundles.building.os, "scandir", spy)

    def take(self) -> list[str]:
        out, self.folders[:] = sorted(self.folders), []
        return out


def from_scratch(root: Path) -> bundles.Inspection:
    """An inspection of ``root`` that reuses no remembered listing (and forgets none)."""
    kept = dict(bundles.building._listings)
    bundles.building._listings.clear()
    try:
        return inspect_directory(root)
    finally:
        bundles.building._listings.clear()
        bundles.building._listings.update(kept)


def same(a: bundles.Inspection, b: bundles.Inspection) -> bool:
    return (a.included, a.excluded, a.stamps, a.sources) == (b.included, b.excluded, b.stamps, b.sources)


def test_an_unchanged_tree_is_not_zipped_again_and_a_changed_one_is(project: Path, settled: None) -> None:
    """build_bundle keeps the last bundles it built: an unchanged tree gives the same bundle
    without zipping; a change of content (even with the old mtime put back), a new file, a
    removed file or a new ignore rule gives a new one."""
    time.sleep(SETTLE)
    first = build_bundle(project)
    assert build_bundle(project) is first  # not rebuilt
    main = project / "main.py"
    before = main.stat()
    main.write_text("print('changed, same mtime')\n")
    os.utime(main, ns=(before.st_atime_ns, before.st_mtime_ns))
    changed = build_bundle(project)
    assert changed.digest != first.digest
    (project / "extra.py").write_text("x = 1\n")
    added = build_bundle(project)
    assert "extra.py" in {f.path for f in added.files}
    (project / ".gpulayerignore").write_text("extra.py\n")
    assert "extra.py" not in {f.path for f in build_bundle(project).files}
    (project / ".gpulayerignore").unlink()
    (project / "extra.py").unlink()
    assert build_bundle(project).digest == changed.digest


def test_a_bundle_of_files_changed_just_now_is_built_again(project: Path) -> None:
    """A file changed within the racy window of the build (seconds by default) could change
    again without its timestamps moving: that bundle is not kept."""
    first = build_bundle(project)
    again = build_bundle(project)
    assert again is not first and again.digest == first.digest


def test_an_unchanged_folder_is_not_listed_again(project: Path, settled: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk of a tree walked lately lists only the folders that changed (an entry added,
    removed or renamed) or whose ignore rules did; each file is still looked at."""
    write(project, "pkg/sub/deep.py", "D = 1\n")
    time.sleep(SETTLE)
    first = inspect_directory(project)
    listed = Listings(monkeypatch)
    assert same(inspect_directory(project), first)
    assert listed.take() == []
    write(project, "pkg/new.py", "N = 1\n")  # (pkg/ changes; the top and pkg/sub/ do not)
    added = inspect_directory(project)
    assert listed.take() == [str(project / "pkg")]
    assert "pkg/new.py" in {f.path for f in added.included} and same(added, from_scratch(project))
    listed.take()  # (from scratch: all of them)
    (project / "pkg" / "model.py").write_text("X = 2\n")  # (content: no folder changes)
    edited = inspect_directory(project)
    assert listed.take() in ([], [str(project / "pkg")])  # (pkg/ was listed just now: again, once)
    assert edited.stamps["pkg/model.py"] != first.stamps["pkg/model.py"] and same(edited, from_scratch(project))


def test_a_rule_changed_above_a_remembered_folder_is_applied_there(project: Path, settled: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "pkg/sub/keep.tmp", "t")
    write(project, "pkg/sub/code.py", "c")
    time.sleep(SETTLE)
    inspect_directory(project)
    listed = Listings(monkeypatch)
    write(project, ".gitignore", "*.tmp\n")  # (a new file at the top: pkg/sub/ itself unchanged)
    excluded = dict(inspect_directory(project).excluded)
    assert excluded["pkg/sub/keep.tmp"] == ".gitignore:1: *.tmp"
    assert str(project / "pkg" / "sub") in listed.take()
    time.sleep(SETTLE)
    inspect_directory(project)
    listed.take()
    (project / ".gitignore").write_text("*.py\n")  # (its content alone)
    now = inspect_directory(project)
    assert dict(now.excluded)["pkg/sub/code.py"] == ".gitignore:1: *.py"
    assert "pkg/sub/keep.tmp" in {f.path for f in now.included}
    assert same(now, from_scratch(project))


def test_folders_with_links_or_changed_just_now_are_listed_every_time(project: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "pkg" / "alias.py").symlink_to("model.py")
    listed = Listings(monkeypatch)
    monkeypatch.setattr(bundles.building, "RACY_SECONDS", WINDOW)
    time.sleep(SETTLE)
    inspect_directory(project)
    listed.take()
    linked = inspect_directory(project)  # (a link's target may change with no folder's stamp moving)
    assert listed.take() == [str(project / "pkg")]
    assert linked.source("pkg/alias.py") == project / "pkg" / "model.py"
    bundles.building._listings.clear()
    monkeypatch.setattr(bundles.building, "RACY_SECONDS", 3600.0)  # (every folder changed "just now")
    inspect_directory(project)
    inspect_directory(project)
    assert len(listed.take()) == 2 * 3  # (the top, pkg/, data/: at each walk)


def test_a_folder_whose_entry_is_another_thing_now_is_listed_again(project: Path, settled: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount on an entry (GPULAYER_HOME bound onto ``data/``, say) changes what it is but
    neither its name nor its folder's stamp: the folders an entry's verdict came from what it
    is (subfolders, special files) are looked at again, by device and inode."""
    time.sleep(SETTLE)
    inspect_directory(project)
    listed = Listings(monkeypatch)
    kept = bundles.building._listings[str(project.resolve())][str(project.resolve())]
    entries = [(n, k, w, (i[0], i[1] + 1) if n == "data" else i) for n, k, w, i in kept.entries]
    bundles.building._listings[str(project.resolve())][str(project.resolve())] = kept._replace(entries=entries)
    walked = inspect_directory(project)
    assert listed.take() == [str(project.resolve())]  # (the top only: data/ itself is as it was)
    assert same(walked, from_scratch(project))


def test_a_file_dated_in_the_future_is_remembered_once_it_settled(project: Path, settled: None) -> None:
    """A time far from now (a skewed clock, an archive's dates) cannot be a change that the
    next one would hide: a later change gives a time of now."""
    a_day = 86400 * 10**9
    main = project / "main.py"
    os.utime(main, ns=(time.time_ns() + a_day, time.time_ns() + a_day))
    time.sleep(SETTLE)
    first = build_bundle(project)
    assert build_bundle(project) is first
    inspection = inspect_directory(project)
    assert inspection.sources["main.py"] == inspection.source("main.py") == project.resolve() / "main.py"


def test_a_remembered_tree_matches_a_fresh_walk_through_many_changes(tmp_path: Path, settled: None) -> None:
    """Random changes (files and folders added, removed, renamed, replaced by each other,
    edited; ignore files written), each walk remembered or not as time allows: what the walk
    finds is always what a walk from scratch finds."""
    import random

    rng = random.Random(11)
    root = tmp_path / "tree"
    names = ["a", "b", "c.tmp", "d.py", "e.log"]
    for folder in ("", "x/", "x/y/", "z/"):
        for name in names[:3]:
            write(root, folder + name, name)

    def pick_folder() -> Path:
        folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
        return rng.choice(sorted(folders))

    for step in range(60):
        folder = pick_folder()
        what = rng.choice(["add", "remove", "edit", "mkdir", "rmdir", "rename", "replace", "ignore", "chmod"])
        entries = sorted(folder.iterdir())
        files = [p for p in entries if p.is_file()]
        if what == "add":
            write(folder, rng.choice([n for n in names if not (folder / n).is_dir()] or ["f"]), str(step))
        elif what == "remove" and files:
            rng.choice(files).unlink()
        elif what == "edit" and files:
            rng.choice(files).write_text(f"edit {step}")
        elif what == "mkdir":
            write(folder, f"d{step}/{rng.choice(names)}", "new")
        elif what == "rmdir" and folder != root:
            subprocess.run(["rm", "-rf", str(folder)], check=True)
        elif what == "rename" and entries:
            rng.choice(entries).rename(folder / f"r{step}")
        elif what == "replace" and files:  # (a file becomes a folder of the same name)
            victim = rng.choice(files)
            victim.unlink()
            write(victim, "inside.py", "i")
        elif what == "ignore" and (rules := [n for n in (".gitignore", ".gpulayerignore")
                                             if not (folder / n).is_dir()]):
            (folder / rng.choice(rules)).write_text(
                rng.choice(["*.tmp\n", "*.py\n", "x/\n", "!c.tmp\n", "b\n", ""]))
        elif what == "chmod" and files:
            rng.choice(files).chmod(rng.choice([0o644, 0o755]))
        if rng.random() < 0.5:
            time.sleep(SETTLE)  # (then the walk below is remembered)
        walked = inspect_directory(root)
        assert same(walked, from_scratch(root)), f"step {step}: {what} in {folder}"


def trees(alphabet: str) -> st.SearchStrategy[dict[tuple[str, ...], tuple[bytes, bool]]]:
    """Trees of up to 8 files (paths of up to 3 names of ``alphabet``: content, executable),
    none of whose paths would need a file to be a folder too."""
    names = st.text(alphabet=alphabet, min_size=1, max_size=6).filter(
        lambda s: s not in (".", "..") and not s.endswith(".pyc"))
    return st.dictionaries(
        st.lists(names, min_size=1, max_size=3).map(tuple),
        st.tuples(st.binary(max_size=300), st.booleans()),
        min_size=1, max_size=8,
    ).map(lambda files: {k: v for k, v in files.items() if not any(o != k and o[:len(k)] == k for o in files)})


def write_tree(root: Path, files: dict[tuple[str, ...], tuple[bytes, bool]], order: list[tuple[str, ...]]) -> None:
    for parts in order:
        content, executable = files[parts]
        write(root, "/".join(parts), content, mode=0o755 if executable else 0o644)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=trees("abcxyz_-.0123"))
def test_property_determinism_and_round_trip(tmp_path_factory: pytest.TempPathFactory,
                                              files: dict) -> None:
    base = tmp_path_factory.mktemp("prop")
    one, two = base / "one", base / "two"
    write_tree(one, files, sorted(files))
    write_tree(two, files, sorted(files, reverse=True))
    b1, b2 = build_bundle(one), build_bundle(two)
    assert b1.digest == b2.digest
    extracted = extract_bundle(b1.data, b1.digest, base / "cache")
    assert tree_of(extracted) == tree_of(one)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=trees("abcé€_-.0"))
def test_the_zip_is_written_byte_for_byte_as_zipfile_writes_it(tmp_path_factory: pytest.TempPathFactory,
                                                               files: dict) -> None:
    """The archive is written here (to reuse unchanged files' compressed bytes), and is what
    Python's zipfile writes of the same files: the addresses of bundles do not change."""
    root = tmp_path_factory.mktemp("zip")
    write_tree(root, files, sorted(files))
    inspection = inspect_directory(root)
    ours, theirs = io.BytesIO(), io.BytesIO()
    assert bundles.zipping._write_deflated(ours, inspection, 10**9, None)[1]
    assert bundles.zipping._write_zipfile(theirs, inspection, 10**9)[1]
    assert ours.getvalue() == theirs.getvalue()


def test_a_large_file_and_many_small_ones_are_zipped_as_zipfile_does(tmp_path: Path) -> None:
    """Past the 1 MiB a file is read at a time, and with a compressed length that needs the
    whole of its field."""
    import random

    rng = random.Random(5)
    write(tmp_path, "big.bin", rng.randbytes(2_500_000))
    write(tmp_path, "zeros.bin", b"\0" * 3_000_000)
    for i in range(300):
        write(tmp_path, f"pkg/m{i}.py", f"X = {i}\n" * rng.randint(0, 50))
    inspection = inspect_directory(tmp_path)
    ours, theirs = io.BytesIO(), io.BytesIO()
    bundles.zipping._write_deflated(ours, inspection, 10**9, None)
    bundles.zipping._write_zipfile(theirs, inspection, 10**9)
    assert ours.getvalue() == theirs.getvalue()


def test_an_edit_rezips_only_the_files_that_changed(project: Path, settled: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    time.sleep(SETTLE)
    first = build_bundle(project)
    opened: list[str] = []
    real = open

    def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundles.zipping, "open", spy, raising=False)
    (project / "pkg" / "model.py").write_text("X = 2\n")
    edited = build_bundle(project)
    assert opened == [str(project.resolve() / "pkg" / "model.py")]  # (the others' bytes reused)
    bundles.building._built.clear()
    assert edited.data == build_bundle(project).data  # (as a build from scratch)
    assert edited.digest != first.digest
    extracted = extract_bundle(edited.data, edited.digest, project.parent / "cache")
    assert (extracted / "pkg" / "model.py").read_text() == "X = 2\n"


def test_a_file_written_while_it_is_zipped_goes_in_as_read_and_is_read_again_next_time(
        project: Path, settled: None) -> None:
    time.sleep(SETTLE)
    first = build_bundle(project)
    inspection = inspect_directory(project)
    (project / "main.py").write_text("print('longer now than it was')\n")  # (after the look)
    # with the last bundle: an unchanged file's bytes are those its stamp names (the look's)
    assert bundles.building.build_from_inspection(inspection, previous=first).data == first.data
    grown = bundles.building.build_from_inspection(inspection)  # (read: as it is now)
    assert "main.py" not in grown.entries  # (not what its stamp says: not to be reused)
    with zipfile.ZipFile(io.BytesIO(grown.data)) as zf:
        assert zf.read("main.py") == b"print('longer now than it was')\n"
    bundles.check_archive(grown.data)
    assert build_bundle(project).digest == grown.digest


def test_a_bundle_allowed_past_a_gibibyte_is_written_by_zipfile_the_same(project: Path) -> None:
    assert build_bundle(project, max_bytes=2 << 30).data == build_bundle(project).data


# --------------------------------------------------------------------------------------------
# what goes in


def test_default_excludes(project: Path) -> None:
    write(project, ".git/HEAD", "ref")
    write(project, ".venv/bin/python", "py")
    write(project, "venv/lib/x.py", "x")
    write(project, "pkg/__pycache__/model.cpython-311.pyc", "c")
    write(project, "stray.pyc", "c")
    write(project, "web/node_modules/left-pad/index.js", "js")
    write(project, "web/app.js", "js")
    inspection = inspect_directory(project)
    excluded = dict(inspection.excluded)
    assert excluded == {
        ".git/": "default: .git",
        ".venv/": "default: .venv/",
        "venv/": "default: venv/",
        "pkg/__pycache__/": "default: __pycache__/",
        "stray.pyc": "default: *.pyc",
        "web/node_modules/": "default: node_modules/",
    }
    included = [f.path for f in inspection.included]
    assert "web/app.js" in included and "main.py" in included
    assert not any("node_modules" in p or p.startswith(".git") for p in included)
    assert [f.path for f in build_bundle(project).files] == included


def test_gitignore_rules_are_named(project: Path) -> None:
    write(project, ".gitignore", "# build output\n\n*.log\n/build/\nsecret.txt\n")
    write(project, "app.log", "l")
    write(project, "pkg/deep.log", "l")
    write(project, "build/out.bin", "b")
    write(project, "pkg/build/kept.py", "anchored /build/ only matches at the top")
    write(project, "secret.txt", "s")
    inspection = inspect_directory(project)
    excluded = dict(inspection.excluded)
    assert excluded["app.log"] == ".gitignore:3: *.log"
    assert excluded["pkg/deep.log"] == ".gitignore:3: *.log"
    assert excluded["build/"] == ".gitignore:4: /build/"
    assert excluded["secret.txt"] == ".gitignore:5: secret.txt"
    included = {f.path for f in inspection.included}
    assert {"pkg/build/kept.py", ".gitignore", "main.py"} <= included


def test_ignore_files_are_read_as_git_reads_them(project: Path) -> None:
    # a line git cannot read as a pattern (a lone "!", a trailing backslash) is ignored, the
    # rest still applies; a byte order mark (Windows editors write one) is skipped
    write(project, ".gitignore", "!\n*.log\nweights\\\n")
    write(project, ".gpulayerignore", b"\xef\xbb\xbfdata.csv\n")
    write(project, "app.log", "l")
    write(project, "data.csv", "d")
    excluded = dict(inspect_directory(project).excluded)
    assert excluded["app.log"] == ".gitignore:2: *.log"
    assert excluded["data.csv"] == ".gpulayerignore:1: data.csv"
    assert "app.log" not in {f.path for f in build_bundle(project).files}


def test_a_folder_pattern_ending_in_double_star_matches_what_is_inside_as_in_git(project: Path) -> None:
    # git's data/** matches what is inside data/, not data/ itself: data/ is entered and a
    # later !data/keep.txt re-includes; logs/**/ matches the folders inside logs/ only
    write(project, ".gpulayerignore", "data/**\n!data/keep.txt\nlogs/**/\n")
    write(project, "data/keep.txt", "k")
    write(project, "data/big.bin", "b")
    write(project, "data/raw/part.bin", "r")
    write(project, "logs/summary.txt", "s")
    write(project, "logs/run1/out.txt", "o")
    inspection = inspect_directory(project)
    included = {f.path for f in inspection.included}
    excluded = dict(inspection.excluded)
    assert {"data/keep.txt", "logs/summary.txt"} <= included
    assert excluded["data/big.bin"] == excluded["data/raw/"] == ".gpulayerignore:1: data/**"
    assert excluded["logs/run1/"] == ".gpulayerignore:3: logs/**/"
    assert "data/" not in excluded and "logs/" not in excluded


def test_nested_gitignore_applies_below_its_folder(project: Path) -> None:
    write(project, "sub/.gitignore", "*.tmp\n/local.txt\n")
    write(project, "sub/a.tmp", "t")
    write(project, "sub/inner/b.tmp", "t")
    write(project, "sub/local.txt", "l")
    write(project, "sub/inner/local.txt", "anchored to sub/, so kept")
    write(project, "top.tmp", "not under sub/")
    excluded = dict(inspect_directory(project).excluded)
    assert excluded["sub/a.tmp"] == "sub/.gitignore:1: *.tmp"
    assert excluded["sub/inner/b.tmp"] == "sub/.gitignore:1: *.tmp"
    assert excluded["sub/local.txt"] == "sub/.gitignore:2: /local.txt"
    assert "sub/inner/local.txt" not in excluded
    assert "top.tmp" not in excluded


def test_gpulayerignore_excludes_and_negation_reincludes(project: Path) -> None:
    write(project, ".gitignore", "*.log\nweights/\n")
    write(project, ".gpulayerignore", "data/\n!important.log\n!venv/\n")
    write(project, "debug.log", "d")
    write(project, "important.log", "keep me")
    write(project, "weights/model.bin", "w")
    write(project, "venv/tool.py", "a folder the user really wants, despite the default")
    inspection = inspect_directory(project)
    excluded = dict(inspection.excluded)
    included = {f.path for f in inspection.included}
    assert excluded["data/"] == ".gpulayerignore:1: data/"
    assert excluded["debug.log"] == ".gitignore:1: *.log"
    assert excluded["weights/"] == ".gitignore:2: weights/"
    assert "important.log" in included
    assert "venv/tool.py" in included
    assert ".gpulayerignore" in included


def test_symlinks(project: Path, tmp_path: Path) -> None:
    outside = write(tmp_path, "outside/secret.txt", "do not ship")
    (project / "link_in.py").symlink_to("main.py")
    (project / "link_out.txt").symlink_to(outside)
    (project / "link_rel_out").symlink_to("../outside/secret.txt")
    (project / "link_dir").symlink_to("pkg", target_is_directory=True)
    (project / "broken").symlink_to("nope")
    (project / "tool").symlink_to("run.sh")
    inspection = inspect_directory(project)
    excluded = dict(inspection.excluded)
    assert excluded["link_out.txt"] == "symlink to outside the directory (not followed)"
    assert excluded["link_rel_out"] == "symlink to outside the directory (not followed)"
    assert excluded["link_dir/"] == "symlink to a directory (not followed)"
    assert excluded["broken"] == "broken symlink"
    bundle = build_bundle(project)
    with zipfile.ZipFile(io.BytesIO(bundle.data)) as zf:
        assert zf.read("link_in.py") == (project / "main.py").read_bytes()
        assert zf.getinfo("tool").external_attr >> 16 == stat.S_IFREG | 0o755
        assert not any(b"do not ship" in zf.read(n) for n in zf.namelist())


def test_a_tree_too_deep_to_send_is_refused_naming_it_however_deep_it_is(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    folder = root
    for _ in range(bundles.MAX_DEPTH + 1):
        folder = folder / "d"
        folder.mkdir(parents=folder.parent == root)
    (folder / "f.txt").write_text("deep")
    write(root, "main.py", "print(1)\n")
    # deeper than Python's stack allows here: the walk is a loop, not a recursion
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        with pytest.raises(bundles.BundleRefused, match=r"'d/d/d/.../f.txt' lies 257 folders deep, more than the 256"):
            build_bundle(root)
    finally:
        sys.setrecursionlimit(limit)


def test_inspection_largest_and_total(project: Path) -> None:
    write(project, "big.bin", b"\0" * 5000)
    write(project, "mid.bin", b"\0" * 3000)
    inspection = inspect_directory(project)
    assert [f.path for f in inspection.largest(2)] == ["big.bin", "mid.bin"]
    assert inspection.total_size == sum(f.size for f in inspection.included)
    assert inspection.largest(0) == []


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_bad_directory_is_named(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "nowhere"
    if kind == "file":
        target.write_text("x")
    with pytest.raises(BundleError, match="nowhere") as info:
        build_bundle(target)
    assert isinstance(info.value, InvalidInput)
    assert ("does not exist" if kind == "missing" else "is not a directory") in str(info.value)


# --------------------------------------------------------------------------------------------
# size limit


def test_size_limit_names_limit_size_and_largest_files(project: Path) -> None:
    write(project, "weights/huge.bin", os.urandom(20_000))
    write(project, "weights/medium.bin", os.urandom(8_000))
    with pytest.raises(BundleTooLarge) as info:
        build_bundle(project, max_bytes=10_000)
    message = str(info.value)
    assert "10000 bytes" in message and "9.8 KB" in message  # the limit
    assert "weights/huge.bin (19.5 KB)" in message  # the largest files, largest first
    assert message.index("huge.bin") < message.index("medium.bin")
    assert "GPULAYER_MAX_BUNDLE_MB" in message and ".gpulayerignore" in message
    assert info.value.limit == 10_000 and info.value.size > 10_000
    assert info.value.largest[0].path == "weights/huge.bin"
    assert isinstance(info.value, BundleError)


def test_size_limit_from_environment(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "blob.bin", os.urandom(4000))
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_MB", "0.001")  # 1048 bytes
    with pytest.raises(BundleTooLarge, match="1048 bytes"):
        build_bundle(project)
    assert build_bundle(project, max_bytes=1_000_000).size < 1_000_000
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_MB", "lots")
    with pytest.raises(InvalidInput, match="GPULAYER_MAX_BUNDLE_MB"):
        build_bundle(project)


def test_bundle_just_under_the_limit_is_accepted(project: Path) -> None:
    size = build_bundle(project).size
    assert build_bundle(project, max_bytes=size).size == size
    with pytest.raises(BundleTooLarge, match=f"{size} bytes"):
        build_bundle(project, max_bytes=size - 1)


# --------------------------------------------------------------------------------------------
# extraction


def test_extract_round_trip_and_reuse(project: Path, tmp_path: Path) -> None:
    bundle = build_bundle(project)
    cache = tmp_path / "cache"
    where = extract_bundle(bundle.data, bundle.digest, cache)
    assert where == cache / bundle.digest
    assert tree_of(where) == tree_of(project)
    assert os.access(where / "run.sh", os.X_OK)
    assert not os.access(where / "main.py", os.X_OK)
    assert {p.name for p in cache.iterdir()} == {bundle.digest}  # no temp dir, no lock file
    (where / "marker").write_text("extracted once")
    assert extract_bundle(bundle.data, bundle.digest, cache) == where
    assert (where / "marker").exists()


def test_verify_digest(project: Path) -> None:
    bundle = build_bundle(project)
    verify_digest(bundle.data, bundle.digest)
    with pytest.raises(BundleError, match="does not match its address"):
        verify_digest(bundle.data + b"!", bundle.digest)
    with pytest.raises(BundleError, match="64 lowercase hex"):
        verify_digest(bundle.data, bundle.digest.upper())


def test_extract_once_under_a_thread_race(project: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = build_bundle(project)
    cache = tmp_path / "cache"
    calls = []
    real = bundles.archive._extract_members

    def slow_extract(*args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.05)  # widen the window for a race
        return real(*args, **kwargs)

    monkeypatch.setattr(bundles.archive, "_extract_members", slow_extract)
    barrier = threading.Barrier(8)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(extract_bundle(bundle.data, bundle.digest, cache))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(calls) == 1
    assert set(results) == {cache / bundle.digest}
    assert {p.name for p in cache.iterdir()} == {bundle.digest}
    assert tree_of(cache / bundle.digest) == tree_of(project)


def test_extract_once_under_a_process_race(project: Path, tmp_path: Path) -> None:
    bundle = build_bundle(project)
    blob = tmp_path / "bundle.zip"
    blob.write_bytes(bundle.data)
    cache, counter, go = tmp_path / "cache", tmp_path / "count", tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        import gpulayer.bundles.archive as archive; from gpulayer import bundles
        real = archive._extract_members
        def counted(*a, **k):
            with open({str(counter)!r}, "a") as f:
                f.write("x")
            time.sleep(0.1)
            return real(*a, **k)
        archive._extract_members = counted
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        data = Path({str(blob)!r}).read_bytes()
        print(bundles.extract_bundle(data, {bundle.digest!r}, Path({str(cache)!r})))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(0.3)
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert {out.strip() for out, _ in outputs} == {str(cache / bundle.digest)}
    assert counter.read_text() == "x"
    assert {p.name for p in cache.iterdir()} == {bundle.digest}
    assert tree_of(cache / bundle.digest) == tree_of(project)


def test_digest_mismatch_and_garbage(tmp_path: Path, project: Path) -> None:
    bundle = build_bundle(project)
    cache = tmp_path / "cache"
    other = "0" * 64
    with pytest.raises(BundleError, match="does not match its address"):
        extract_bundle(bundle.data, other, cache)
    with pytest.raises(BundleError, match="not a SHA-256 address"):
        extract_bundle(bundle.data, "../../etc", cache)
    garbage = b"not a zip at all"
    with pytest.raises(BundleError, match="not a valid zip"):
        extract_bundle(garbage, compute_digest(garbage), cache)
    assert cache_is_clean(cache)


# --------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def cli() -> typer.Typer:
    from gpulayer.cli import bundle as bundle_cli

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    bundle_cli.register(app)
    return app


def test_cli_inspect_text(cli: typer.Typer, project: Path) -> None:
    write(project, ".gitignore", "*.log\n")
    write(project, "debug.log", "l")
    write(project, "node_modules/x/index.js", "j")
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project), "--top", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    digest = build_bundle(project).digest
    assert f"sha256:{digest}" in out
    assert "main.py" in out and "run.sh" in out and "(executable)" in out
    assert "debug.log" in out and ".gitignore:1: *.log" in out
    assert "node_modules/" in out and "default: node_modules/" in out
    assert "Largest files (top 2)" in out
    assert "Total:" in out


def test_cli_inspect_text_shows_control_characters_in_names_escaped(cli: typer.Typer, project: Path) -> None:
    # a name of a cloned project must not rewrite the terminal that lists what will be sent
    write(project, "evil\x1b[2K\rmain.py", "e")
    write(project, "skip\x1b]0;title\x07.log", "l")
    write(project, ".gitignore", "*.log\n")
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\r" not in result.output and "\x07" not in result.output
    assert "evil\\x1b[2K\\rmain.py" in result.output
    assert "skip\\x1b]0;title\\x07.log  .gitignore:1: *.log" in result.output


def test_cli_inspect_text_lines_up_names_in_cjk_and_with_combining_marks(cli: typer.Typer, project: Path) -> None:
    """Names were padded by their count of characters: a name in CJK (two columns a
    character) or with a decomposed accent (a mark of no width) pushed its size out of line
    with the others. Now each row's size ends in the same column of the terminal."""
    from gpulayer.cli.display import columns

    for name in ("训练.py", "cafe\u0301.txt", "plain.txt"):
        write(project, name, "x")
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project)])
    assert result.exit_code == 0, result.output
    included = result.output.split("Included")[1].split("\n\n")[0].splitlines()[1:]
    assert len(included) > 3 and "  cafe\u0301.txt " in result.output  # (the name as the directory has it)
    assert len({columns(row.removesuffix("  (executable)")) for row in included}) == 1, included


def test_cli_inspect_json(cli: typer.Typer, project: Path) -> None:
    write(project, "x.pyc", "c")
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project), "--json", "--top", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    bundle = build_bundle(project)
    assert doc["digest"] == bundle.digest
    assert doc["bundle_bytes"] == bundle.size
    assert [f["path"] for f in doc["included"]] == [f.path for f in bundle.files]
    assert {"path": "x.pyc", "rule": "default: *.pyc"} in doc["excluded"]
    assert len(doc["largest"]) == 1
    assert doc["total_bytes"] == sum(f.size for f in bundle.files)
    assert doc["error"] is None


def test_cli_inspect_missing_directory(cli: typer.Typer, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(missing)])
    assert result.exit_code == 2
    assert "no-such-dir" in result.output and "does not exist" in result.output


def test_cli_inspect_over_limit(cli: typer.Typer, project: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "big.bin", os.urandom(5000))
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_MB", "0.001")
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project)])
    assert result.exit_code == 1
    assert "big.bin" in result.output and "too large" in result.output
    assert "over the limit" in result.output


def test_cli_inspect_of_a_bundle_every_receiver_would_refuse_lists_it_and_says_why(
        cli: typer.Typer, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It printed nothing, exit 2, and told the user to run `gpulayer bundle inspect`."""
    write(project, "zeros.dat", bytes(3_000_000))  # a compression ratio far over 200:1
    result = CliRunner().invoke(cli, ["bundle", "inspect", str(project)])
    assert result.exit_code == 1, result.output
    assert "zeros.dat" in result.output and "Bundle:  it would be refused (below); no digest" in result.output
    assert "compression ratio" in result.output and "check with `gpulayer bundle inspect" not in result.output
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "1")
    doc, _ = json.JSONDecoder().raw_decode(CliRunner().invoke(cli, ["bundle", "inspect", str(project), "--json"]).output)
    assert doc["digest"] is None and "would be refused" in doc["error"] and doc["file_count"] > 1


def test_cli_registered_in_main_app(project: Path) -> None:
    from gpulayer.cli import app

    result = CliRunner().invoke(app, ["bundle", "inspect", str(project), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["digest"] == build_bundle(project).digest


def test_bundle_file_record() -> None:
    assert BundleFile("a", 1, 0o755).executable
    assert not BundleFile("a", 1, 0o644).executable


def test_gpulayer_home_inside_the_directory_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project that keeps its GPUlayer state inside (GPULAYER_HOME=./.gpulayer) must not
    ship its database in every bundle (a new address, and a larger upload, at every job)."""
    from gpulayer.bundles.building import HOME_EXCLUDED

    project = tmp_path / "project"
    write(project, "main.py", "print('hi')\n")
    write(project, "state/gpulayer.db", b"\0" * 1000)
    write(project, ".gpulayerignore", "!state/\n")  # (not even put back by an ignore file)
    write(project, "sub/run.py", "")
    monkeypatch.setenv("GPULAYER_HOME", str(project / "sub" / ".." / "state"))
    inspection = inspect_directory(project)
    assert dict(inspection.excluded) == {"state/": HOME_EXCLUDED}
    assert [f.path for f in inspection.included] == [".gpulayerignore", "main.py", "sub/run.py"]
    first = build_bundle(project).digest
    write(project, "state/gpulayer.db", b"\1" * 2000)  # the database changes: the bundle does not
    assert build_bundle(project).digest == first
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "elsewhere"))  # a home outside: nothing to leave out
    (tmp_path / "elsewhere").mkdir()
    assert "state/gpulayer.db" in [f.path for f in inspect_directory(project).included]
