"""A FunctionJob whose module imports a large library, with and without the worker's preload
of it (``--preload``), next to the import itself in a fresh process, in the same run.

    python bench/preload.py [--module torch] [--runs 8] [--rounds 3]

Embedded (a temporary home): a ``@gl.remote`` function in a module that imports ``--module``
at its top, its ``.remote().result()`` timed ``--runs`` times through a worker started
without preloads, then through one started with ``preload=(MODULE,)`` (what ``gpulayer
worker start --preload MODULE`` and ``GPULAYER_PRELOAD`` give), then the floor
``python -c "import MODULE"``; ``--rounds`` times in turn, one worker at a time, each after one
call that starts its fork server. Prints the table of bench/_stats.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import function_home
from _stats import table

JOB = '''
import {module}


def touch():
    return len(dir({top}))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--module", default="torch", help="the library the job's module imports (default torch)")
    parser.add_argument("--runs", type=int, default=8, help="calls a worker, each round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _tmp, _code, job = function_home("bench_preload_job", JOB.format(module=args.module,
                                                                       top=args.module.partition(".")[0]))

    import gpulayer as gl
    from gpulayer.client import connect
    from gpulayer.worker.agent import Agent

    touch = gl.remote(job.touch)
    client = connect()
    assert client.control is not None
    client.ensure_local_worker()  # (its capabilities, without a detection of our own)
    caps = client._agent.capabilities
    client._agent.stop(grace=5)  # the bench's workers do the work, one at a time
    times: dict[str, list[float]] = {"without": [], "with": [], "floor": []}
    floor = [sys.executable, "-c", f"import {args.module}"]
    for _ in range(args.rounds):
        for mode, preload in (("without", ()), ("with", (args.module,))):
            agent = Agent(client.control, name=f"bench-preload-{mode}", capabilities=caps, preload=preload)
            agent.start()
            client._agent = agent
            try:
                touch.remote().result(timeout=300)  # its fork server up (and the module imported there)
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    touch.remote().result(timeout=300)
                    times[mode].append(time.perf_counter() - t0)
            finally:
                agent.stop(grace=5)
                client._agent = None
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(floor, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times["floor"].append(time.perf_counter() - t0)
    name = f"python -c 'import {args.module}'"
    print(table(f"a @gl.remote function whose module imports {args.module}, .remote().result(); "
                f"{args.rounds} rounds of {args.runs}",
                [("no preload", times["without"], name, times["floor"]),
                 (f"--preload {args.module}", times["with"], name, times["floor"])]))


if __name__ == "__main__":
    main()
