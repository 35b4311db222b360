"""Prometheus metrics of one server process (``GET /metrics``, admin only)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from gpulayer.records import JobState

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(_BUCKETS) + 1))
    count: int = 0
    total: float = 0.0
    requests: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def placement(self, seconds: float) -> None:
        with self.lock:
            self.count += 1
            self.total += seconds
            for i, b in enumerate(_BUCKETS):
                if seconds <= b:
                    self.buckets[i] += 1
                    break
            else:
                self.buckets[-1] += 1

    def request(self, status: int) -> None:
        with self.lock:
            self.requests[status] = self.requests.get(status, 0) + 1

    def render(self, counts: dict[str, Any]) -> str:
        out = ["# HELP gpulayer_jobs Jobs by state.", "# TYPE gpulayer_jobs gauge"]
        for st in JobState:
            out.append(f'gpulayer_jobs{{state="{st.value}"}} {counts["jobs"].get(st.value, 0)}')
        out += ["# HELP gpulayer_workers_online Workers online.", "# TYPE gpulayer_workers_online gauge",
                f"gpulayer_workers_online {counts['workers_online']}",
                "# HELP gpulayer_queue_depth Jobs waiting for placement.", "# TYPE gpulayer_queue_depth gauge",
                f"gpulayer_queue_depth {counts['queue_depth']}",
                "# HELP gpulayer_placement_seconds Duration of placement passes.",
                "# TYPE gpulayer_placement_seconds histogram"]
        with self.lock:
            acc = 0
            for b, n in zip(_BUCKETS, self.buckets[:-1], strict=True):  # the last bucket is +Inf
                acc += n
                out.append(f'gpulayer_placement_seconds_bucket{{le="{b}"}} {acc}')
            out.append(f'gpulayer_placement_seconds_bucket{{le="+Inf"}} {self.count}')
            out.append(f"gpulayer_placement_seconds_sum {self.total:.6f}")
            out.append(f"gpulayer_placement_seconds_count {self.count}")
            out += ["# HELP gpulayer_http_responses_total API responses by status code.",
                    "# TYPE gpulayer_http_responses_total counter"]
            for code, n in sorted(self.requests.items()):
                out.append(f'gpulayer_http_responses_total{{code="{code}"}} {n}')
        return "\n".join(out) + "\n"
