"""Developer sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s types``, ``nox -s docs``, ``nox -s bench``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "types", "docs"]


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
    session.install("mypy")
    session.run("mypy")  # files: gpulayer and plugins (pyproject.toml)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs checks: every hook documented, every relative link and cited test exists."""
    _install(session)
    session.run("python", "-m", "pytest", "-q", "tests/unit/test_docs.py", "tests/unit/test_doc_references.py")


@nox.session
def bench(session: nox.Session) -> None:
    _install(session)
    for script in ("placement.py", "resources_detect.py", "submit_latency.py", "provisioning.py"):
        session.run("python", f"bench/{script}")
