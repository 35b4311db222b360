"""Every benchmark in ``bench/`` still runs: each script, with the smallest arguments it
takes, exits 0 and prints its table. Nothing here reads a figure (tests never assert on
time); a script that no longer matches the code it measures (a renamed function, a changed
record) fails here instead of on the day someone measures with it.

``bench/slurm_join.py`` is not run here: it needs the local Slurm (``scripts/local-slurm.sh``)
and its pilots' workers use ``~/.gpulayer``; ``tests/providers`` run the same path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpulayer.testing import no_real_devices_env
from tests.server_support import CLEAN_ENV
from tests.support import stop_strays

ROOT = Path(__file__).resolve().parents[2]

#: script, its smallest arguments, a line its table prints
SCRIPTS = [
    ("submit_latency.py", ["--jobs", "2", "--cli", "1", "--throughput", "10"], "the same, worker start's CLI server"),
    ("cli_startup.py", ["-n", "1"], "gpulayer --help"),
    ("resources_detect.py", ["-n", "1"], "gpulayer resources detect"),
    ("cancel.py", ["--jobs", "2"], "handle.cancel() -> tree gone"),
    ("cancel_many.py", ["--jobs", "20", "--runs", "1"], "cancel() of each"),
    ("prune.py", ["--jobs", "50", "--chunks", "2", "--runs", "1", "--kept", "20", "--bundles", "5"],
     "the same, during its bundle pass"),
    ("log_throughput.py", ["--runs", "1", "--mb", "1", "--lines-mb", "0.1"], "MB in 100-byte lines"),
    ("log_reads.py", ["--runs", "1", "--rows", "2000", "--chunks", "20", "--jobs", "5", "--plans"],
     "--follow's read after the last"),
    ("server_output.py", ["--runs", "1", "--waiters", "2", "--chunks", "5"], "the appends took"),
    ("server_latency.py", ["--jobs", "2"], "stored -> task started"),
    ("follow_latency.py", ["--runs", "1", "--lines", "2", "--gap", "0.05"], "a server (HTTP, SQLite): worst"),
    ("result_size.py", ["--runs", "1", "--mb", "0.01", "--list", "2"], "MB result, .remote().result()"),
    ("argument_size.py", ["--runs", "1", "--mb", "0.01"], "of arguments, through a server"),
    ("artifacts.py", ["--runs", "1", "--mb", "0.1"], "MB, download via a server"),
    ("distributed_launch.py", ["--runs", "1"], "its torchrun commands by hand"),
    ("bundle_walk.py", ["--runs", "1", "--files", "60", "--settle", "0"], ".remote().result() in the project"),
    ("preload.py", ["--runs", "1", "--rounds", "1", "--module", "decimal"], "--preload decimal"),
    ("placement.py", ["--runs", "1", "--jobs", "200", "--workers", "20"], "floor: pairs"),
    ("placement_incremental.py", ["--runs", "2", "--jobs", "200", "--workers", "20"], "pass after a task ended"),
    ("fork_server.py", ["--tasks", "5", "--rounds", "1"], "page faults of the server"),
    ("transactions.py", ["--rounds", "1", "--n", "50"], "Store.write"),
    ("server_heartbeats.py", ["--workers", "20", "--seconds", "3", "--jobs", "2"], "heartbeat p99"),
    ("server_throughput.py", ["--jobs", "20", "--rounds", "1"], "gl.as_completed"),
    ("provisioning.py", ["--runs", "1", "--jobs", "20", "--cap", "5"], "steady pass"),
    ("recovery.py", ["--runs", "1", "--timeout", "2"], "worker kill -9 -> retry started"),
    ("peers.py", ["--jobs", "2", "--throughput", "10", "--only", "gpulayer"], "no-op"),
]


def test_every_bench_script_is_listed_here_or_said_why_not() -> None:
    listed = {name for name, _, _ in SCRIPTS} | {"slurm_join.py", "_stats.py", "_served.py"}
    assert {p.name for p in (ROOT / "bench").glob("*.py")} == listed


@pytest.mark.parametrize(("script", "args", "prints"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_the_bench_script_runs_and_prints_its_table(script: str, args: list[str], prints: str) -> None:
    # each script makes its homes with mkdtemp: here, in a folder short enough for the CLI
    # server's socket path (pytest's tmp_path under xdist is not: submit_latency.py would
    # leave its CLI server rows out)
    tmp = Path(tempfile.mkdtemp(prefix="glb-", dir="/tmp" if os.path.isdir("/tmp") else None))
    env = {k: v for k, v in os.environ.items() if k not in (*CLEAN_ENV, "GPULAYER_HOME")}
    env.update(no_real_devices_env(), TMPDIR=str(tmp))
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)
    finally:
        stop_strays(tmp, below=True)
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert prints in proc.stdout, proc.stdout[-2000:]
    assert "no CLI server rows" not in proc.stdout
