"""``gpulayer bundle``: look at the source bundle a directory would become."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpulayer import config
from gpulayer.cli.commands import help_of
from gpulayer.cli.display import cell, columns, printable
from gpulayer.errors import BundleError, GpulayerError

if TYPE_CHECKING:
    from gpulayer import bundles

bundle_app = typer.Typer(
    name="bundle",
    help=help_of("bundle"),
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {printable(message)}", err=True)
    return typer.Exit(code)


@bundle_app.command("inspect")
def inspect_cmd(
    given: str = typer.Argument(..., metavar="DIRECTORY", help="the directory to bundle, or a bundle (.zip) to check",
                                show_default=False),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of text"),
    top: int = typer.Option(10, "--top", min=0, metavar="N", help="how many of the largest files to list"),
) -> None:
    """List what goes into DIRECTORY's bundle, what is left out and by which rule, the largest
    files, the total size and the bundle's SHA-256 address.

    Given a zip file instead, check it as a worker would before extracting it (entry names,
    kinds, number, sizes, compression ratio; see docs/bundles.md) and list its files.

    Exits 1 when the bundle is over the size limit (GPULAYER_MAX_BUNDLE_MB) or would be refused
    (too many files, too much unpacked, too compressible), the listing printed all the same;
    2 on bad input (an unsafe archive included).
    """
    from gpulayer import bundles

    if not given:  # (a Path of '' is '.': `bundle inspect "$DIR"` with DIR unset inspected the folder it ran in)
        raise _fail("DIRECTORY '': empty; accepted: the path of a directory, or of a bundle (.zip)")
    directory = Path(given)
    if directory.is_file():
        _inspect_archive(directory, as_json)
        return
    try:
        limit = config.max_bundle_bytes()
        inspection = bundles.inspect_directory(directory)
    except GpulayerError as exc:
        raise _fail(str(exc)) from None

    digest: str | None = None
    bundle_size: int | None = None
    problem: str | None = None
    refused = False
    try:
        bundle = bundles.build_from_inspection(inspection, max_bytes=limit)
        digest, bundle_size = bundle.digest, bundle.size
    except bundles.BundleTooLarge as exc:
        problem = str(exc)
    except bundles.BundleRefused as exc:  # (listed as for one too large: what to leave out)
        problem = f"{exc.reason}; exclude what the job does not need with a .gpulayerignore file"
        refused = True
    except BundleError as exc:
        raise _fail(str(exc)) from None

    largest = inspection.largest(top)
    if as_json:
        doc: dict[str, Any] = {
            "directory": str(inspection.root),
            "digest": digest,
            "bundle_bytes": bundle_size,
            "limit_bytes": limit,
            "total_bytes": inspection.total_size,
            "file_count": len(inspection.included),
            "included": [
                {"path": f.path, "size": f.size, "mode": oct(f.mode)} for f in inspection.included
            ],
            "excluded": [{"path": e.path, "rule": e.rule} for e in inspection.excluded],
            "largest": [{"path": f.path, "size": f.size} for f in largest],
            "error": problem,
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print_text(inspection, largest, digest, bundle_size, limit, refused=refused)
    if problem:
        raise _fail(problem, code=1)


def _inspect_archive(path: Path, as_json: bool) -> None:
    from gpulayer import bundles

    limit = config.max_bundle_bytes()
    try:
        size = path.stat().st_size
        if size > limit:
            raise BundleError(f"bundle {str(path)!r} is {size} bytes, over the limit of {limit} bytes "
                              "(GPULAYER_MAX_BUNDLE_MB)")
        data = path.read_bytes()
        files = bundles.check_archive(data)
    except OSError as exc:
        raise _fail(f"cannot read bundle {str(path)!r}: {exc.strerror or exc}") from None
    except GpulayerError as exc:
        raise _fail(f"bundle {str(path)!r} refused: {exc}") from None
    digest = bundles.compute_digest(data)
    if as_json:
        typer.echo(json.dumps({"archive": str(path), "digest": digest, "bundle_bytes": len(data),
                               "file_count": len(files), "files": files, "error": None}, indent=2))
        return
    typer.echo(f"Bundle archive {path}: {len(files)} files, {bundles.format_size(len(data))}, safe to extract")
    for name in files:
        typer.echo(f"  {printable(name)}")
    typer.echo(f"Digest:  sha256:{digest}")


def _print_text(
    inspection: bundles.Inspection, largest: list[bundles.BundleFile], digest: str | None,
    bundle_size: int | None, limit: int, *, refused: bool = False,
) -> None:
    from gpulayer import bundles

    echo = typer.echo
    size = bundles.format_size
    # (names as the directory has them: a control character in one, an escape sequence,
    # would rewrite the terminal that shows what is about to be sent)
    included = [(printable(f.path), f) for f in inspection.included]
    echo(f"Bundle of {printable(str(inspection.root))}")
    echo("")
    echo(f"Included ({len(inspection.included)} files, {size(inspection.total_size)}):")
    width = max((columns(shown) for shown, _ in included), default=0)
    for shown, f in included:
        flag = "  (executable)" if f.executable else ""
        echo(f"  {cell(shown, width)}  {size(f.size):>10}{flag}")
    if not inspection.included:
        echo("  (nothing)")
    echo("")
    echo(f"Excluded ({len(inspection.excluded)}):")
    excluded = [(printable(e.path), printable(e.rule)) for e in inspection.excluded]
    width = max((columns(shown) for shown, _ in excluded), default=0)
    for shown, rule in excluded:
        echo(f"  {cell(shown, width)}  {rule}")
    if not inspection.excluded:
        echo("  (nothing)")
    if largest:
        echo("")
        echo(f"Largest files (top {len(largest)}):")
        width = max(columns(printable(f.path)) for f in largest)
        for f in largest:
            echo(f"  {cell(printable(f.path), width)}  {size(f.size):>10}")
    echo("")
    total = size(inspection.total_size)
    echo(f"Total:   {len(inspection.included)} files, {total} before compression")
    if bundle_size is not None:
        echo(f"Bundle:  {size(bundle_size)} ({bundle_size} bytes), limit {size(limit)}")
        echo(f"Digest:  sha256:{digest}")
    elif refused:
        echo("Bundle:  it would be refused (below); no digest")
    else:
        echo(f"Bundle:  over the limit of {size(limit)}; no digest")


def register(app: typer.Typer) -> None:
    """Add the ``bundle`` group to the ``gpulayer`` app."""
    app.add_typer(bundle_app, name="bundle")
