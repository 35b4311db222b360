"""How long `gpulayer resources detect` takes, next to the floor and a heavy import.

    python bench/resources_detect.py [-n 7] [--refresh]

Prints median and min wall time of N runs of each command and the ratio of the medians to
the `python -c "import gpulayer"` baseline. The first detect run fills the framework probe
cache (unless --refresh, which measures the uncached path every time). Nothing asserts on
these numbers; they are for reading.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7, help="runs per command (default 7)")
    parser.add_argument("--refresh", action="store_true", help="bypass the probe cache")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    env = {**os.environ, "GPULAYER_HOME": home}
    py = sys.executable
    detect = [py, "-m", "gpulayer.cli", "resources", "detect"] + (["--refresh"] if args.refresh else [])
    cases = [
        ('python -c "import gpulayer"', [py, "-c", "import gpulayer"]),
        ("gpulayer resources detect" + (" --refresh" if args.refresh else ""), detect),
        ('python -c "import torch"', [py, "-c", "import torch"]),
    ]
    try:
        timed(detect, env)  # warm the OS file cache and the probe cache
        results = []
        for label, argv in cases:
            try:
                runs = [timed(argv, env) for _ in range(args.n)]
            except subprocess.CalledProcessError:
                results.append((label, None, None))
                continue
            results.append((label, statistics.median(runs), min(runs)))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    base = results[0][1] or 1.0
    width = max(len(r[0]) for r in results)
    print(f"{'command':<{width}}  {'median':>9}  {'min':>9}  {'x import gpulayer':>17}")
    for label, med, low in results:
        if med is None or low is None:
            print(f"{label:<{width}}  {'failed':>9}")
            continue
        print(f"{label:<{width}}  {med * 1000:>7.0f}ms  {low * 1000:>7.0f}ms  {med / base:>16.1f}x")
    print(f"({args.n} runs each, python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
