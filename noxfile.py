"""Developer sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s types``, ``nox -s docs``, ``nox -s ec2``,
``nox -s bench``, ``nox -s peers``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "types", "docs", "ec2"]


def _install(session: nox.Session) -> None:
    session.install("torch==2.13.0")
    session.install("-e", ".[test]")


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "gpulayer", "plugins", "tests", "bench", "examples")


@nox.session
def types(session: nox.Session) -> None:
    _install(session)
    session.install("mypy", "types-psutil", "types-paramiko")  # (the stubs the dev extra names)
    session.run("mypy")  # files: gpulayer, plugins and tests/typing (pyproject.toml)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs checks: every hook documented, every relative link and cited test exists, and
    every snippet runs as written (or says why not)."""
    _install(session)
    session.run("python", "-m", "pytest", "-q", "tests/unit/test_docs.py", "tests/unit/test_doc_references.py",
                "tests/integration/test_doc_snippets.py", "tests/integration/test_readme.py")


@nox.session
def ec2(session: nox.Session) -> None:
    """The example provider package: installed from its own folder, tested and typed there."""
    session.install("-e", ".")
    session.chdir("examples/gpulayer-provider-ec2")
    session.install("-e", ".[test]", "mypy")
    session.run("python", "-m", "pytest", "-q", *session.posargs)
    session.run("mypy")  # strict, files: src (its own pyproject.toml)


@nox.session
def bench(session: nox.Session) -> None:
    _install(session)
    for script in ("placement.py", "placement_incremental.py", "resources_detect.py", "cli_startup.py",
                   "submit_latency.py", "fork_server.py", "server_throughput.py", "cancel.py", "cancel_many.py", "prune.py",
                   "provisioning.py", "transactions.py", "log_throughput.py", "log_reads.py", "server_output.py", "server_latency.py",
                   "follow_latency.py", "result_size.py", "argument_size.py", "artifacts.py", "distributed_launch.py",
                   "bundle_walk.py", "preload.py"):
        session.run("python", f"bench/{script}")


@nox.session
def peers(session: nox.Session) -> None:
    """bench/peers.py: the same workloads on Ray, Dask and GPUlayer, in an environment of
    their own (Ray and Dask are not dependencies of GPUlayer)."""
    session.install("-e", ".")
    session.install("ray", "dask[distributed]")
    session.run("python", "bench/peers.py", *session.posargs)
