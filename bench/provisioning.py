"""The provisioning pass: 500 queued cloud jobs against a provider capped at 50 machines.

    .venv/bin/python bench/provisioning.py [--runs 7] [--jobs 500] [--cap 50]

The provider is instant (``gpulayer.testprovider`` with ``start_workers = false``: a launch
writes a file and returns), so what is measured is the core's own work: reading the queue
and the machines, matching jobs against the cached offers, writing every machine (and its
bootstrap token) before its launch, and the events. A fresh SQLite database per run.

Prints, per kind of pass, the median and minimum time over the runs and the adapter calls
it made (by method): the first pass launches ``--cap`` machines and must make exactly that
many launch calls (plus one check, one offers and one list); a steady pass (the cap
reached, every job still queued) must make none. ``floor: read`` is reading the queue and
the machines alone, the least a pass does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer import testprovider
from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.provider_config import parse
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, mapping, queries


def one_run(jobs: int, cap: int, tmp: Path) -> dict[str, tuple[float, Counter[str]]]:
    adapters = {testprovider.NAME: next(iter(testprovider.gpulayer_provider_adapters()))}
    configured = parse(f'[bench]\ntype = "local-process"\nmax_machines = {cap}\nstart_workers = false\n'
                       f'state_dir = "{tmp / "machines"}"\n[[bench.shapes]]\nname = "cpu"\nprice_per_hour = 0.1\n',
                       "bench.toml", adapters=adapters)
    store = Store(f"sqlite:///{tmp / 'bench.db'}")
    ps = ProviderSet(configured, control_url="http://127.0.0.1:1")
    cp = ControlPlane(store, providers=ps, serving=True)
    ps.check()
    ps.refresh_offers()
    for _ in range(jobs):
        cp.submit(CommandJob(command=["true"], placement=Placement(target="cloud", on_unschedulable="wait")))
    out: dict[str, tuple[float, Counter[str]]] = {}
    for name in ("first pass", "steady pass"):
        before = Counter(ps.calls)
        started = time.perf_counter()
        cp.provision()
        took = time.perf_counter() - started
        out[name] = (took, Counter(ps.calls) - before)
    started = time.perf_counter()
    with store.read() as s:
        [mapping.spec(r.spec) for r in queries.queued_jobs(s)]
        queries.machines(s, live_only=True)
    out["floor: read"] = (time.perf_counter() - started, Counter())
    with store.read() as s:
        assert len(queries.machines(s, live_only=True)) == cap
    ps.close()
    store.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--cap", type=int, default=50)
    args = ap.parse_args()
    results: dict[str, list[float]] = {}
    calls: dict[str, Counter[str]] = {}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            for name, (took, made) in one_run(args.jobs, args.cap, Path(tmp)).items():
                results.setdefault(name, []).append(took)
                calls[name] = made
    print(f"provisioning pass: {args.jobs} queued cloud jobs, cap {args.cap} machines, instant provider, "
          f"{args.runs} runs")
    print(f"{'pass':<14}{'median ms':>11}{'min ms':>9}  adapter calls")
    for name, times in results.items():
        made = calls[name]
        shown = ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in sorted(made.items()) if k != "total")
        counted = "-" if name.startswith("floor") else f"{made['total']}" + (f" ({shown})" if shown else "")
        print(f"{name:<14}{statistics.median(times) * 1000:>11.1f}{min(times) * 1000:>9.1f}  {counted}")


if __name__ == "__main__":
    main()
