"""One Client interface, two implementations: embedded (in-process) and HTTP.

:func:`connect` picks one: ``GPULAYER_URL`` (and ``GPULAYER_TOKEN``) select a server;
otherwise the control plane runs embedded, on SQLite in ``$GPULAYER_HOME``.
The SDK, the CLI and the PyTorch API only ever talk to a :class:`Client`.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from gpulayer import bundles, config
from gpulayer.control import ControlPlane, LogChunk
from gpulayer.records import JobRecord, WorkerRecord
from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, JobSpec


class Client(ABC):
    """What users (SDK, CLI, PyTorch API) can do with a control plane."""

    #: "embedded" or the server URL
    location: str
    #: the target of a job that names none: local embedded, remote against a server
    default_target = "local"

    # -- the calls each implementation provides
    @abstractmethod
    def _submit(self, spec: JobSpec, idempotency_key: str) -> JobRecord: ...
    @abstractmethod
    def has_bundle(self, digest: str) -> bool: ...
    @abstractmethod
    def put_bundle(self, digest: str, data: bytes) -> bool: ...
    @abstractmethod
    def get_job(self, job_id: str) -> JobRecord: ...
    @abstractmethod
    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[JobRecord]: ...
    @abstractmethod
    def cancel(self, job_id: str) -> JobRecord: ...
    @abstractmethod
    def logs(self, job_id: str, *, after: int = 0, node: int | None = None) -> list[LogChunk]: ...
    @abstractmethod
    def wait_job(self, job_id: str, timeout: float | None = None) -> JobRecord: ...
    @abstractmethod
    def list_workers(self) -> list[WorkerRecord]: ...
    @abstractmethod
    def worker_usage(self) -> dict[str, dict[str, Any]]: ...
    @abstractmethod
    def events(self, job_id: str) -> list[dict[str, Any]]: ...

    def ensure_local_worker(self) -> None:  # noqa: B027 - a hook most clients leave empty
        """Start a worker in this process if local jobs need one (embedded only)."""

    # -- shared behaviour

    def prepare(self, spec: JobSpec) -> JobSpec:
        """Resolve the profile and upload the bundle; returns the spec the control plane stores."""
        from gpulayer.profiles import resolve_requirements

        update: dict[str, Any] = {"requirements": resolve_requirements(spec.requirements)}
        if "target" not in spec.placement.model_fields_set:
            update["placement"] = spec.placement.model_copy(update={"target": self.default_target})
        if spec.bundle is not None:
            bundle = bundles.build_bundle(spec.bundle)
            if not self.has_bundle(bundle.digest):
                self.put_bundle(bundle.digest, bundle.data)
            update["bundle"] = None
            update["bundle_digest"] = bundle.digest
        return spec.model_copy(update=update)

    def submit(self, spec: CommandJob | FunctionJob | DistributedJob, *,
               idempotency_key: str | None = None) -> JobRecord:
        prepared = self.prepare(spec)
        if "local" in prepared.placement.targets:
            self.ensure_local_worker()
        return self._submit(prepared, idempotency_key or uuid.uuid4().hex)

    def follow_logs(self, job_id: str, *, node: int | None = None, poll: float = 0.1) -> Iterator[LogChunk]:
        """Yield log chunks as they arrive until the job ends."""
        after = 0
        while True:
            job = self.get_job(job_id)
            chunks = self.logs(job_id, after=after, node=node)
            for c in chunks:
                after = max(after, c.id)
                yield c
            if job.state.terminal and not chunks:
                return
            if not chunks:
                time.sleep(poll)

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections and stop anything this client started."""


class EmbeddedClient(Client):
    """The control plane in this process, on the database in ``$GPULAYER_HOME``."""

    def __init__(self, database_url: str | None = None) -> None:
        from gpulayer.store import Store

        self.location = "embedded"
        self.control = ControlPlane(Store(database_url))
        self._agent: Any = None
        self._agent_lock = threading.Lock()

    def _submit(self, spec: JobSpec, idempotency_key: str) -> JobRecord:
        return self.control.submit(spec, idempotency_key=idempotency_key)

    def has_bundle(self, digest: str) -> bool:
        return self.control.has_bundle(digest)

    def put_bundle(self, digest: str, data: bytes) -> bool:
        return self.control.put_bundle(digest, data)

    def get_job(self, job_id: str) -> JobRecord:
        return self.control.get_job(job_id)

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[JobRecord]:
        return self.control.list_jobs(state=state, limit=limit)

    def cancel(self, job_id: str) -> JobRecord:
        return self.control.cancel(job_id)

    def logs(self, job_id: str, *, after: int = 0, node: int | None = None) -> list[LogChunk]:
        return self.control.logs(job_id, after=after, node=node)

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobRecord:
        return self.control.wait_job(job_id, timeout)

    def list_workers(self) -> list[WorkerRecord]:
        return self.control.list_workers()

    def worker_usage(self) -> dict[str, dict[str, Any]]:
        return self.control.worker_usage()

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self.control.events(job_id)

    def live_local_workers(self) -> list[WorkerRecord]:
        self.control.expire_workers()
        return [w for w in self.control.list_workers(include_offline=False)
                if w.origin == "local" and not w.draining]

    def ensure_local_worker(self) -> None:
        with self._agent_lock:
            if self._agent is not None or self.live_local_workers():
                return
            from gpulayer.worker.agent import Agent

            slots = os.environ.get("GPULAYER_CPU_SLOTS")
            self._agent = Agent(self.control, origin="local", name="in-process",
                                cpu_slots=int(slots) if slots else None)
            self._agent.start()
            atexit.register(self._stop_agent)

    def _stop_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.stop(grace=float(os.environ.get("GPULAYER_EXIT_GRACE", "2")))

    def close(self) -> None:
        self._stop_agent()
        self.control.store.dispose()


_default: Client | None = None
_default_key: tuple[str | None, str | None, str] | None = None
_default_lock = threading.Lock()


def connect(url: str | None = None, token: str | None = None) -> Client:
    """The client for ``url`` (default ``$GPULAYER_URL``; none means embedded).

    Calls with the same settings return the same client, so the SDK keeps one in-process
    worker and one database connection pool per process.
    """
    global _default, _default_key
    url = url if url is not None else os.environ.get("GPULAYER_URL") or None
    token = token if token is not None else os.environ.get("GPULAYER_TOKEN") or None
    key = (url, token, str(config.home()) if url is None else "")
    with _default_lock:
        if _default is not None and _default_key == key:
            return _default
        if _default is not None:
            _default.close()
        if url is None:
            client: Client = EmbeddedClient(os.environ.get("GPULAYER_DATABASE_URL") or None)
        else:
            from gpulayer.http_client import HttpClient

            client = HttpClient(url, token=token, ca=os.environ.get("GPULAYER_CA") or None)
        _default, _default_key = client, key
        return client


def reset() -> None:
    """Close and forget the process-wide client (tests)."""
    global _default, _default_key
    with _default_lock:
        if _default is not None:
            _default.close()
        _default, _default_key = None, None
