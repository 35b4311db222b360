"""A ``gpulayer server start`` (HTTP, SQLite) with one ``gpulayer worker start`` joined to it,
for the benches that run a function through a server next to the same embedded."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def function_home(module: str, source: str) -> tuple[Path, Path, Any]:
    """A temporary folder with the embedded home (``GPULAYER_HOME`` set to it) and, in a
    folder of its own (a function's folder is its bundle: not the home), ``module`` written
    from ``source`` and imported: (the folder, the code's folder, the module)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    os.environ["GPULAYER_HOME"] = str(tmp / "home")
    code = tmp / "code"
    code.mkdir()
    (code / f"{module}.py").write_text(source)
    sys.path.insert(0, str(code))
    return tmp, code, importlib.import_module(module)


def served_function(tmp: Path, code: Path, remote: Any, warm: Any) -> tuple[Any, Callable[[], None]]:
    """The server and its worker (``code``, the function's module's folder, on the worker's
    ``PYTHONPATH``), once ``remote.spec(warm)`` ran there (the worker's fork server up): an
    HTTP client of it with the admin token, and what stops both."""
    from gpulayer.client import http_client
    from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

    server = ServerProc(tmp / "server").start()
    admin = Api(server.url, server.admin_token)
    worker = start_remote_worker(server.url, admin.token_for("join")["token"], tmp / "worker",
                                 env={"PYTHONPATH": str(code)})

    def stop() -> None:
        stop_proc(worker)
        server.stop()

    try:
        wait_workers(admin, 1)
        client = http_client(server.url, token=server.admin_token)
        client.wait(client.submit(on_remote(remote.spec(warm))).id, timeout=120)
    except BaseException:
        stop()
        raise
    return client, stop


def on_remote(spec: Any) -> Any:
    """``spec`` for the server's workers (the ``remote`` target)."""
    from gpulayer.specs import Placement

    return spec.model_copy(update={"placement": Placement(target="remote")})
