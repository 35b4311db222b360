"""The ``ssh`` provider: one pool of hosts, driven over SSH with paramiko.

Each operation opens one SSH connection per host it needs (bounded by ``connect_timeout``),
runs :mod:`gpulayer_ssh.remote` there with the host's Python and closes it again; nothing is
kept open between calls, so a host that went away costs one timeout and no stale state.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import paramiko

from gpulayer import plugin
from gpulayer_ssh import known_hosts
from gpulayer_ssh.config import HostConfig, SshPoolConfig

log = logging.getLogger("gpulayer.ssh")
# paramiko says "Connected" and "Authentication successful" at INFO for every connection, and
# the server asks its hosts every half minute; keep its warnings, unless someone chose a level
if logging.getLogger("paramiko").level == logging.NOTSET:
    logging.getLogger("paramiko").setLevel(logging.WARNING)
# its transport thread logs every error it meets as a traceback of twenty ERROR lines (a port
# that is not an sshd's: at every connection) and hands the same error to the caller, which
# reports it naming the host: keep only that, unless someone chose a level
if logging.getLogger("paramiko.transport").level == logging.NOTSET:
    logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)

#: what the host runs: the source of gpulayer_ssh/remote.py, as ``python -c``'s program
REMOTE_SOURCE = (Path(__file__).parent / "remote.py").read_text()
GIB = 1024**3
#: a worker on a pool host is up within a few seconds of the SSH command
BOOT_SECONDS = 5.0
#: hosts asked at once by offers, list, check and a terminate without a handle
PARALLEL_HOSTS = 16
_T = TypeVar("_T")
Availability = Literal["available", "limited", "unavailable", "unknown"]


def fingerprint(key: paramiko.PKey) -> str:
    """``ssh-ed25519 SHA256:...``, as ``ssh-keygen -lf`` and OpenSSH's prompts show a key."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _UnknownHostKey(paramiko.SSHException):
    pass


class _RevokedHostKey(paramiko.SSHException):
    pass


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What to do with a host for which known_hosts lists no key (with ``"no"``, every host):
    a key listed ``@revoked`` is refused in every mode, as OpenSSH does; then ``"yes"``
    refuses, ``"accept-new"`` accepts and appends the key to the host's ``known_hosts`` as one
    line when the host names that file, ``"no"`` accepts with a warning."""

    def __init__(self, provider: SshProvider, host: HostConfig, known: known_hosts.KnownHosts) -> None:
        self.provider, self.host, self.known = provider, host, known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.known.is_revoked(key):
            raise _RevokedHostKey(fingerprint(key))
        mode = self.host.strict_host_key_checking
        if mode == "yes":
            raise _UnknownHostKey(fingerprint(key))
        if mode == "no":
            log.warning("ssh: not checking the host key of %s (strict_host_key_checking = \"no\")", hostname)
        elif self.host.known_hosts:
            self.provider._remember(self.host, hostname, key)


class _Remote(Exception):
    """The remote script failed: its exit status and what it said."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class SshProvider:
    """A configured ``ssh`` pool (one providers.toml section)."""

    def __init__(self, name: str, config: SshPoolConfig) -> None:
        self.name = name
        self.config = config
        self.hosts = {h.label: h for h in config.hosts}
        self._probed: dict[str, plugin.Capabilities] = {}
        self._known_hosts_lock = threading.Lock()
        #: problems already logged (each is logged once, not at every connection or pass)
        self._reported: set[str] = set()
        self._reported_lock = threading.Lock()
        #: what was logged last for a host that list() leaves out, by its label
        self._host_problems: dict[str, str] = {}

    # ------------------------------------------------------------------ connections

    def _what(self, host: HostConfig) -> str:
        return f"ssh host {host.label!r} ({host.where()}) of provider {self.name!r}"

    def _key(self, host: HostConfig) -> paramiko.PKey:
        path = os.path.expanduser(host.key_file)
        try:
            return paramiko.PKey.from_path(path)
        except paramiko.PasswordRequiredException:
            raise plugin.ProviderAuthFailed(
                f"{self._what(host)}: key_file {host.key_file!r} needs a passphrase; use a key without one") from None
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise plugin.ProviderAuthFailed(
                f"{self._what(host)}: key_file {host.key_file!r} cannot be read as a private key: {exc}") from None

    def _known_hosts_file(self, host: HostConfig) -> str:
        return os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts")

    def _report_once(self, message: str) -> None:
        with self._reported_lock:
            if message in self._reported:
                return
            self._reported.add(message)
        log.warning("%s", message)

    def _known_hosts(self, host: HostConfig) -> known_hosts.KnownHosts:
        """The host's known_hosts as paramiko can use it; a line that cannot be read is
        skipped and logged once (OpenSSH skips such lines too)."""
        path = self._known_hosts_file(host)
        try:
            known = known_hosts.read(path)
        except OSError as exc:
            if host.strict_host_key_checking == "no":  # read for its @revoked keys only
                self._report_once(f"{self._what(host)}: known_hosts {path} cannot be read ({exc}); no key is refused")
                return known_hosts.KnownHosts(path)
            raise plugin.ProviderAuthFailed(f"{self._what(host)}: known_hosts {path} cannot be read: {exc}") from None
        for problem in known.problems:
            self._report_once(f"ssh provider {self.name!r}: known_hosts {problem}: the line is skipped; fix or remove it")
        return known

    def connect(self, host: HostConfig) -> paramiko.SSHClient:
        """An authenticated connection to ``host``, its host key checked as configured."""
        key = self._key(host)
        keys = self._known_hosts(host)
        known = keys.path
        client = paramiko.SSHClient()
        if host.strict_host_key_checking != "no":
            keys.fill(client.get_host_keys())
        client.set_missing_host_key_policy(_HostKeyPolicy(self, host, keys))
        t = self.config.connect_timeout
        try:
            client.connect(host.host, port=host.port, username=host.user, pkey=key, timeout=t, banner_timeout=t,
                           auth_timeout=t, channel_timeout=t, look_for_keys=False, allow_agent=False)
        except paramiko.AuthenticationException as exc:
            client.close()
            raise plugin.ProviderAuthFailed(
                f"{self._what(host)}: authentication failed for user {host.user!r} with key_file "
                f"{host.key_file!r} ({exc})") from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            if keys.is_revoked(exc.key):
                raise self._revoked(host, known, fingerprint(exc.key)) from None
            raise plugin.ProviderAuthFailed(
                f"{self._what(host)}: the host key is not the one in {known} (expected "
                f"{fingerprint(exc.expected_key)}, got {fingerprint(exc.key)}); "
                f"if the host was reinstalled, remove its line from that file") from None
        except _RevokedHostKey as exc:
            client.close()
            raise self._revoked(host, known, str(exc)) from None
        except _UnknownHostKey as exc:
            client.close()
            # paramiko checks no host certificate: a host trusted through its CA only is unknown here
            ca = (f"; its {keys.cert_authorities} @cert-authority line(s) are not used (paramiko does not check "
                  f"host certificates), so list the host's own key") if keys.cert_authorities else ""
            raise plugin.ProviderAuthFailed(
                f"{self._what(host)}: its host key ({exc}) is not in {known}; add it "
                f"(ssh-keyscan -p {host.port} {host.host} >> {known}, after checking its fingerprint) or set "
                f"strict_host_key_checking = \"accept-new\"{ca}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:  # refused, unreachable, timed out
            client.close()
            raise plugin.ProviderTransient(f"{self._what(host)}: cannot connect: {self._unreached(host, exc)}") from None
        return client

    def _unreached(self, host: HostConfig, exc: BaseException) -> str:
        """Why ``host`` could not be connected to, in words (paramiko says "[Errno None]
        Unable to connect to port 22 on ...", or "No existing session" for a port that
        never sent an SSH banner)."""
        t = self.config.connect_timeout
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            why = "; ".join(dict.fromkeys(
                (e.strerror or str(e)) if isinstance(e, OSError) else str(e) for e in exc.errors.values()))
            return f"{why} (port {host.port}: is an sshd listening there?)"
        if isinstance(exc, socket.gaierror):
            return f"the name {host.host!r} does not resolve ({exc.strerror or exc})"
        if isinstance(exc, TimeoutError):
            return f"no answer within connect_timeout ({t:g} s)"
        text = str(exc)
        if isinstance(exc, EOFError) or "banner" in text or text == "No existing session":
            return (f"no SSH server answered on port {host.port} within connect_timeout ({t:g} s) "
                    f"({text or type(exc).__name__}): is it the port of the host's sshd?")
        return text or type(exc).__name__

    def _revoked(self, host: HostConfig, known: str, shown: str) -> plugin.ProviderAuthFailed:
        return plugin.ProviderAuthFailed(
            f"{self._what(host)}: its host key ({shown}) is listed @revoked in {known}; refused (a host with a "
            f"new key: check its fingerprint and list that one)")

    def _remember(self, host: HostConfig, hostname: str, key: paramiko.PKey) -> None:
        """Append a newly accepted host key to the host's known_hosts, once: hosts connected
        to at once may both find it missing, so the file is read again under the lock."""
        known = self._known_hosts_file(host)
        with self._known_hosts_lock:
            try:
                if known_hosts.read(known).knows(hostname, key):
                    return
                known_hosts.append(known, hostname, key)
            except OSError as exc:  # OpenSSH too goes on without writing it
                log.warning("%s: cannot add its host key to %s: %s", self._what(host), known, exc)
                return
        log.info("ssh: added the host key of %s (%s) to %s", hostname, fingerprint(key), known)

    def _run(self, client: paramiko.SSHClient, host: HostConfig, request: dict[str, Any],
             timeout: float) -> dict[str, Any]:
        """Run the remote script with ``request`` on its stdin; its JSON answer."""
        command = f"exec {remote_path(host.python)} -c {shlex.quote(REMOTE_SOURCE)}"
        body = json.dumps({**request, "state_dir": host.state_dir, "env": host.environment})
        try:
            status, out, err = execute(client, command, body, timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:  # socket.timeout is an OSError
            raise plugin.ProviderTransient(
                f"{self._what(host)}: the remote step {request['op']!r} did not finish: "
                f"{exc or type(exc).__name__}") from None
        if status != 0:
            tail = " | ".join(err.strip().splitlines()[-3:]) or out.strip()[-300:]
            if status == 127:
                tail = f"{host.python!r} not found on the host (python = ...: give the path of a Python with " \
                       f"GPUlayer installed); {tail}"
            raise _Remote(status, tail)
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise _Remote(status, f"no JSON answer: {out[-300:]!r} {err[-300:]!r}") from None
        if not isinstance(answer, dict):
            raise _Remote(status, f"unexpected answer {answer!r}")
        return answer

    def call(self, host: HostConfig, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Connect, run one remote step, disconnect. Transport trouble is ProviderTransient."""
        client = self.connect(host)
        try:
            return self._run(client, host, request, timeout or self.config.command_timeout)
        except _Remote as exc:
            raise plugin.ProviderTransient(
                f"{self._what(host)}: the remote step {request['op']!r} failed (exit {exc.status}): {exc}") from None
        finally:
            client.close()

    # ------------------------------------------------------------------ Provider

    def _each(self, hosts: list[HostConfig], step: Callable[[HostConfig], _T]) -> list[tuple[HostConfig, _T | None, str]]:
        """``step`` on every host at once (a dead host costs one timeout, not one per host):
        ``(host, result, "")`` or ``(host, None, transient problem)``, in the pool's order.
        ``ProviderAuthFailed`` (and any other error) of a host is raised."""
        def one(host: HostConfig) -> tuple[HostConfig, _T | None, str]:
            try:
                return host, step(host), ""
            except plugin.ProviderTransient as exc:
                return host, None, str(exc)

        if len(hosts) == 1:
            return [one(hosts[0])]
        with ThreadPoolExecutor(max_workers=min(PARALLEL_HOSTS, len(hosts)), thread_name_prefix="gpulayer-ssh") as pool:
            return list(pool.map(one, hosts))

    def check(self) -> None:
        """Connect to every host; one that refuses us (key, host key) fails the whole provider:
        that is a configuration to fix. Hosts that are only unreachable now are logged; all of
        them unreachable is ProviderTransient."""
        def connect(host: HostConfig) -> bool:
            self.connect(host).close()
            return True

        results = self._each(list(self.hosts.values()), connect)
        problems = [problem for _, _, problem in results if problem]
        if problems and len(problems) == len(results):
            raise plugin.ProviderTransient("; ".join(problems))
        for problem in problems:
            log.warning("%s", problem)

    def _capabilities(self, host: HostConfig, probe: dict[str, Any] | None) -> plugin.Capabilities | None:
        if host.declared:
            return declared_capabilities(host)
        if host.label in self._probed:
            return self._probed[host.label]
        if probe is None:
            return None
        if "error" in probe:
            log.warning("%s: cannot probe its capabilities: %s", self._what(host), probe["error"])
            return None
        caps = plugin.Capabilities.model_validate(probe["capabilities"])
        self._probed[host.label] = caps
        return caps

    def offers(self, requirements: plugin.Requirements) -> list[plugin.MachineOffer]:
        """One offer per host; ``available`` when no GPUlayer worker of this pool runs there.
        The scheduler matches ``requirements`` against each offer's capabilities itself."""
        def status(host: HostConfig) -> dict[str, Any]:
            probe = not host.declared and host.label not in self._probed
            return self.call(host, {"op": "status", "probe": probe, "probe_timeout": self.config.probe_timeout},
                             timeout=self.config.command_timeout + (self.config.probe_timeout if probe else 0))

        offers, problems = [], []
        for host, answer, problem in self._each(list(self.hosts.values()), status):
            if answer is None:
                problems.append(problem)
                # still worth showing what it is, not whether it is up: a job only it fits
                # waits for it (a reboot, a network blip) instead of failing as unschedulable
                known = declared_capabilities(host) if host.declared else self._probed.get(host.label)
                if known is not None:
                    offers.append(self._offer(host, known, "unknown"))
                continue
            caps = self._capabilities(host, answer.get("probe"))
            if caps is None:
                problems.append(f"{self._what(host)}: its capabilities are not known: "
                                f"{(answer.get('probe') or {}).get('error', 'no probe answer')}")
                continue
            taken = [m for m in answer.get("markers", []) if m.get("alive")]
            offers.append(self._offer(host, caps, "unavailable" if taken else "available"))
        if problems and not offers:
            raise plugin.ProviderTransient("; ".join(problems))
        for problem in problems:
            log.warning("%s", problem)
        return offers

    def _offer(self, host: HostConfig, caps: plugin.Capabilities, availability: Availability) -> plugin.MachineOffer:
        # (one machine a host: a distributed job gets its machines from several hosts)
        return plugin.MachineOffer(shape=host.label, region=None, capabilities=caps, price_per_hour=None,
                                   availability=availability, boot_seconds=BOOT_SECONDS, data={"host": host.label},
                                   capacity=1)

    def launch(self, request: plugin.LaunchRequest) -> plugin.LaunchedMachine:
        label = str(request.offer.data.get("host") or request.offer.shape)
        host = self.hosts.get(label)
        if host is None:
            raise plugin.SkipOffer(f"provider {self.name!r} has no host {label!r} (any more)")
        body = {"op": "launch", "machine_id": request.machine_id, "label": request.label,
                "argv": request.worker_argv(host.python), "worker_env": request.worker_environment()}
        client = self.connect(host)
        try:
            answer = self._run(client, host, body, self.config.command_timeout)
        except _Remote as exc:
            # the host cannot start a worker as configured (no such Python, no GPUlayer there)
            raise plugin.SkipOffer(f"{self._what(host)}: cannot start a worker (exit {exc.status}): {exc}") from None
        finally:
            client.close()
        if "busy" in answer:
            raise plugin.NoCapacity(f"{self._what(host)} already runs machine {answer['busy']}")
        if "exited" in answer:  # (its log stays on the host: STATE_DIR/logs/MACHINE_ID.log)
            raise plugin.SkipOffer(
                f"{self._what(host)}: the worker exited at once (exit {answer['exited']}), so {host.python!r} cannot "
                f"run it: {answer.get('log') or 'it wrote nothing'}")
        pid = int(answer["pid"])
        return plugin.LaunchedMachine(provider_id=f"{host.label}:{pid}", address=host.host,
                                      data={"host": host.label, "pid": pid})

    def list(self, label: str) -> list[plugin.LiveMachine]:
        """The live machines with ``label`` on every host. A host that cannot be reached
        fails the whole list (ProviderTransient): ``list`` cannot say "unknown on host X",
        and the core's reconciliation after a start ends a half-way launch it does not see
        listed. A host that answers but whose remote step fails (no such ``python``) is left
        out, logged once per cause, when the shell alone shows it holds no marker with
        ``label``: its part of the list is then known to be empty, and the other hosts are
        still listed (their orphans terminated). Where it does hold one, or its markers
        cannot be read, the list fails as for an unreachable host."""
        timeout = self.config.command_timeout

        def status(host: HostConfig) -> tuple[dict[str, Any] | None, str, set[str] | None]:
            client = self.connect(host)
            try:
                return self._run(client, host, {"op": "status"}, timeout), "", None
            except _Remote as exc:
                return None, (f"{self._what(host)}: the remote step 'status' failed (exit {exc.status}): "
                              f"{exc}"), self._marker_labels(client, host, timeout)
            finally:
                client.close()

        found, problems = [], []
        for host, result, problem in self._each(list(self.hosts.values()), status):
            if result is None:  # not reached
                problems.append(problem)
                continue
            answer, failed, labels = result
            if answer is None:
                if labels is not None and label not in labels:
                    self._report_host(host, f"{failed}; its machines are left out of the list (it holds no "
                                            f"marker of this server's: {host.state_dir}/machines)")
                elif labels is None:
                    problems.append(f"{failed}; its machine markers cannot be read either, so the list is not "
                                    f"complete without it")
                else:
                    problems.append(f"{failed}; it holds a marker of this server's machines "
                                    f"({host.state_dir}/machines), so the list is not complete without it")
                continue
            self._report_host(host, None)
            for marker in answer.get("markers", []):
                if marker.get("label") == label and marker.get("alive"):
                    found.append(plugin.LiveMachine(
                        machine_id=str(marker["machine_id"]), provider_id=f"{host.label}:{marker['pid']}",
                        state="running", data={"host": host.label, "pid": marker["pid"]}))
        if problems:
            # a partial list would make the core take a half-way launch on a host it could
            # not see for gone; say so instead
            raise plugin.ProviderTransient("; ".join(problems))
        return found

    def _marker_labels(self, client: paramiko.SSHClient, host: HostConfig, timeout: float) -> set[str] | None:
        """The labels of the machine markers on ``host``, read with ``sh`` and ``cat`` alone
        (for a host whose Python cannot run the remote script); None when they cannot be read."""
        markers = f"{remote_path(host.state_dir)}/machines/*/marker.json"
        script = f'for f in {markers}; do [ -e "$f" ] || continue; cat "$f" || exit 1; echo; done'
        try:
            status, out, _ = execute(client, f"sh -c {shlex.quote(script)}", "", timeout)
        except (OSError, EOFError, paramiko.SSHException):
            return None
        if status != 0:
            return None
        labels = set()
        for line in out.splitlines():
            try:
                marker = json.loads(line) if line.strip() else {}
            except ValueError:
                return None
            if not isinstance(marker, dict):
                return None
            if marker:
                labels.add(str(marker.get("label")))
        return labels

    def _report_host(self, host: HostConfig, problem: str | None) -> None:
        """Log ``problem`` of ``host`` once, until it changes or the host is well again (None)."""
        with self._reported_lock:
            if self._host_problems.get(host.label) == problem:
                return
            if problem is None:
                del self._host_problems[host.label]
            else:
                self._host_problems[host.label] = problem
        if problem is not None:
            log.warning("%s", problem)
        else:
            log.info("%s answers again", self._what(host))

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        label = provider_id.rsplit(":", 1)[0] if provider_id else None
        # without the handle (the launch's answer was lost) every host is asked
        candidates = [self.hosts[label]] if label in self.hosts else list(self.hosts.values())
        body = {"op": "terminate", "machine_id": machine_id, "grace": self.config.stop_grace}
        timeout = self.config.command_timeout + self.config.stop_grace
        results = self._each(candidates, lambda h: self.call(h, body, timeout=timeout))
        found = [(host, answer) for host, answer, _ in results if answer is not None and answer.get("found")]
        for host, answer in found:
            if answer.get("was_running"):
                log.info("ssh: stopped machine %s on %s", machine_id, host.label)
            elif answer.get("left_behind"):
                log.warning("ssh: machine %s on %s: its worker was gone; ended %s process(es) its tasks left running",
                            machine_id, host.label, answer["left_behind"])
        problems = [problem for _, _, problem in results if problem]
        if problems and not found:  # it may be on a host that did not answer
            raise plugin.ProviderTransient("; ".join(problems))


def execute(client: paramiko.SSHClient, command: str, stdin_text: str, timeout: float) -> tuple[int, str, str]:
    """Run ``command`` on the host with ``stdin_text`` on its stdin: its exit status, stdout
    and stderr. Transport trouble raises (``OSError``, ``EOFError``, ``paramiko.SSHException``)."""
    stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
    stdin.write(stdin_text)
    stdin.flush()
    stdin.channel.shutdown_write()
    out = stdout.read().decode("utf-8", "replace")
    err = stderr.read().decode("utf-8", "replace")
    if not stdout.channel.status_event.wait(timeout):
        raise TimeoutError(f"no exit status within {timeout:g} s")
    return stdout.channel.recv_exit_status(), out, err


def remote_path(path: str) -> str:
    """``path`` quoted for the host's shell, a leading ``~/`` left for it to expand."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def declared_capabilities(host: HostConfig) -> plugin.Capabilities:
    """What a host declared in providers.toml, as the worker-to-be's capabilities."""
    devices: list[plugin.Device] = []
    for group in host.devices:
        for _ in range(group.count):
            devices.append(plugin.Device(
                kind=group.kind, index=len([d for d in devices if d.kind == group.kind]),
                name=group.name or group.kind,
                memory_bytes=int(group.memory_gb * GIB) if group.memory_gb else None,
                compute_capability=group.compute_capability))
    info = plugin.HostInfo(os="linux", arch="unknown", hostname=host.label, cpu_count=host.cpus or 0,
                           memory_bytes=int((host.memory_gb or 0) * GIB), python_version="unknown",
                           python_path=host.python, address=host.host)
    return plugin.Capabilities(host=info, devices=devices, frameworks=dict(host.frameworks))
