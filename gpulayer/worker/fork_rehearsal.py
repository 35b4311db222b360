"""Imported by a fork server's spare child while it waits for its task, never by a task.

It does what a job's module typically does (imports GPUlayer and decorates a function with
``@gl.remote``), so the spare has touched, and so copied from the server, the memory that
importing the job's own module touches: the task's import then costs a third of what it did
(see :func:`gpulayer.worker.fork_server._rehearse`). Standard library only when GPUlayer is
not installed in the job's Python.
"""

from __future__ import annotations

try:
    import gpulayer as gl
except ImportError:  # pragma: no cover - the job's Python without GPUlayer
    gl = None  # type: ignore[assignment]

if gl is not None:

    @gl.remote
    def rehearsal() -> None:
        return None
