"""Text that is not ASCII, end to end: names, labels, arguments and results past U+FFFF, and
the text a function cannot send (a lone surrogate), on every control plane.

Tests that take the ``plane`` fixture run on the embedded control plane and against a real
server process on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpulayer.testing import no_real_devices_env
from tests.integration.conftest import Plane
from tests.support import cli, seed_probe_cache, stop_strays


def test_a_functions_text_past_the_bmp_and_its_lone_surrogates_end_as_said(plane: Plane, tmp_path: Path) -> None:
    """An exception whose message holds a lone surrogate (bytes decoded with surrogateescape)
    ended its task as "worker error: ValidationError ...", the function's error lost; a result
    that held one was stored, and every read of its job through a server failed with
    pydantic's "lone leading surrogate in hex escape". Now the error is kept, its lone
    surrogate as the escape stderr shows, and such a result is refused naming where it is."""
    plane.ensure_worker()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "run.py").write_text(textwrap.dedent("""
        import json
        import gpulayer as gl

        @gl.remote
        def text():
            return {"训练-✓": ["😀", "𝄞"]}

        @gl.remote
        def raw_error():
            raise ValueError(b"bad \\xff".decode("utf-8", "surrogateescape") + " 训练 😀")

        @gl.remote
        def lone_result():
            return {"name": "a\\udcffb"}

        if __name__ == "__main__":
            out = {"text": text.remote().result(timeout=60)}
            for f in (raw_error, lone_result):
                h = f.remote()
                try:
                    h.result(timeout=60)
                except gl.RemoteError as e:
                    out[f.__name__] = [h.id, e.remote_type, e.remote_message, e.remote_traceback]
            print(json.dumps(out))
    """))
    proc = subprocess.run([sys.executable, "run.py"], cwd=proj, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["text"] == {"训练-✓": ["😀", "𝄞"]}
    job_id, kind, message, tb = out["raw_error"]
    assert (kind, message) == ("ValueError", "bad \\udcff 训练 😀")
    assert tb.endswith("ValueError: bad \\udcff 训练 😀\n")
    job_id, kind, message, _ = out["lone_result"]
    assert kind == "ValueError"
    assert message == ("result of run:lone_result at result[\"name\"]: 'a\\udcffb' is not valid UTF-8 "
                       "(a lone surrogate '\\udcff' at index 1); accepted: valid Unicode text")
    shown = cli("jobs", "show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "failed"


def test_a_worker_whose_home_is_not_utf8_runs_jobs_embedded_and_joins_a_server(
        tmp_path: Path, probed_frameworks: Path) -> None:
    """A ``$GPULAYER_HOME`` whose path is not UTF-8 (its byte 0xff, which Python holds as the
    lone surrogate ``'\\udcff'``) is in the worker's capabilities ("free space under HOME"):
    they could not be stored (an embedded ``submit`` failed with pydantic's "surrogates not
    allowed") nor sent (``worker start --url`` failed in httpx's JSON encoding). Now the path
    is stored and sent with that byte as its escape, as an error's text is."""
    from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

    home = Path(os.fsdecode(os.fsencode(tmp_path) + b"/\xff-home"))
    shown = f"free space under {tmp_path}/\\udcff-home"
    home.mkdir()
    seed_probe_cache(home, probed_frameworks)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(no_real_devices_env(), GPULAYER_HOME=str(home))
    ran = cli("submit", "--", "echo", "hello", env=env, timeout=180)
    assert (ran.returncode, ran.stdout) == (0, "hello\n"), ran.stderr
    started = cli("worker", "start", "--cpu-slots", "1", "--idle-exit", "0.5", "--json", env=env, timeout=180)
    assert started.returncode == 0, started.stderr
    wid = json.loads(started.stdout.splitlines()[0])["id"]
    listed = json.loads(cli("worker", "list", "--json", env=env, check=True).stdout)
    assert [w["capabilities"]["provenance"]["host.disk_free_bytes"]["source"] for w in listed if w["id"] == wid] == [shown]

    server = ServerProc(tmp_path / "server").start()
    worker = None
    try:
        admin = Api(server.url, server.admin_token)
        join = admin.token_for("join")["token"]
        worker = start_remote_worker(server.url, join, home)
        joined = wait_workers(admin, 1)
        assert joined[0]["capabilities"]["provenance"]["host.disk_free_bytes"]["source"] == shown
        # (a client of its own that sends the byte as JSON's escape of the lone surrogate)
        caps = joined[0]["capabilities"]
        caps["host"]["python_path"] = "/opt/\udcff-py"
        body = json.dumps({"capabilities": caps})  # (written "\\udcff", as JSON escapes it)
        answer = Api(server.url, join)("POST", "/v1/workers/join", content=body,
                                       headers={"content-type": "application/json"})
        assert answer.status_code == 201, answer.text
        assert answer.json()["worker"]["capabilities"]["host"]["python_path"] == "/opt/\\udcff-py"
    finally:
        stop_proc(worker)
        server.stop()
        stop_strays(home)
