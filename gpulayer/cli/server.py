"""``gpulayer server start``: the self-hosted control plane, served by uvicorn."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import typer

from gpulayer import config
from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import EXIT_BAD_INPUT, echo_json, json_option, listening_socket

server_app = typer.Typer(help=help_of("server"), no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # before writing: an existing file keeps its old mode on O_TRUNC
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def self_signed(host: str, directory: Path) -> tuple[Path, Path]:
    """A certificate + key in ``directory`` (made once, reused), valid for localhost,
    127.0.0.1, ::1 and ``host``. One made for other hosts, or expired, is made again, for
    its names too, and the start says that its fingerprint changed (pinned clients and
    workers must be given the new one)."""
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    names = {"localhost", "127.0.0.1", "::1", host}
    if cert_path.is_file() and key_path.is_file():
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes

        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {str(v) for v in san.get_values_for_type(x509.DNSName)} | \
               {str(v) for v in san.get_values_for_type(x509.IPAddress)}
        expired = cert.not_valid_after_utc <= datetime.datetime.now(datetime.timezone.utc)
        if names <= have and not expired:
            return cert_path, key_path
        old = cert.fingerprint(hashes.SHA256()).hex().upper()
        why = "it had expired" if expired else f"it did not name {host}"
        names |= have
        typer.echo(f"note: made a new self-signed certificate in {directory} ({why}); its fingerprint changed "
                   f"from sha256:{':'.join(old[i:i + 2] for i in range(0, len(old), 2))}, so clients and workers "
                   "pinned to that one must be given the new one (below)", err=True)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for n in sorted(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpulayer {host}")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()).decode())
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


@server_app.command("start")
def server_start(
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (loopback by default)"),
    port: int = typer.Option(8765, "--port", min=0, max=65535),
    database: Optional[str] = typer.Option(None, "--database", metavar="URL", envvar="GPULAYER_DATABASE_URL",
                                           help="sqlite:///PATH or postgresql://USER@HOST/DB (default: SQLite in $GPULAYER_HOME)"),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", metavar="FILE", help="PEM certificate (chain)"),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", metavar="FILE", help="PEM private key"),
    self_signed_flag: bool = typer.Option(False, "--self-signed", help="make a certificate in $GPULAYER_HOME/tls/"),
    insecure_http: bool = typer.Option(False, "--insecure-http", help="allow plain HTTP on a non-loopback address"),
    log_level: str = typer.Option("warning", "--log-level", metavar="LEVEL", help="uvicorn log level"),
    as_json: bool = json_option("once listening, print url, ca, fingerprint, pid and database as one line "
                                "of JSON on stdout"),
    root_path: str = typer.Option("", "--root-path", metavar="PATH",
                                  help="the URL path a proxy in front serves this server under, which the "
                                       "proxy strips (e.g. /gpulayer): the dashboard's links and cookies start "
                                       "with it"),
    # GPULAYER_PROVIDERS is read by provider_config, which names it (not --providers) in errors
    providers: Optional[Path] = typer.Option(None, "--providers", metavar="FILE",
                                             help="providers file (default: GPULAYER_PROVIDERS, else "
                                                  "$GPULAYER_HOME/providers.toml if it exists)"),
) -> None:
    """Serve the control plane over HTTP(S). Every API route needs a token."""
    import logging

    database = database or None  # (empty, as its variable: the home's SQLite, and its admin.token)

    import uvicorn

    from gpulayer.control import ControlPlane
    from gpulayer.server.app import create_app, default_threads
    from gpulayer.server.protocol import BoundedHttpToolsProtocol
    from gpulayer.server_records import server_record
    from gpulayer.store.urls import redacted
    from gpulayer.tokens import TokenStore

    logging.basicConfig(level=config.settings().log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if log_level.lower() not in uvicorn.config.LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r}: accepted: {', '.join(uvicorn.config.LOG_LEVELS)}",
                                 param_hint="--log-level")
    root_path = _root_path(root_path)
    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert/--tls-key")
    if self_signed_flag and tls_cert is not None:
        raise typer.BadParameter("--self-signed makes its own certificate; drop --tls-cert/--tls-key",
                                 param_hint="--self-signed")
    tls = tls_cert is not None or self_signed_flag
    if not tls and not _is_loopback(host) and not insecure_http:
        typer.echo(f"error: refusing to serve plain HTTP on {host}: a job API is remote code execution and "
                   "tokens would cross the network in the clear. Use --tls-cert/--tls-key or --self-signed, "
                   "or --insecure-http if a proxy in front terminates TLS.", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    # bound first: a port in use is said plainly before a certificate, a database or an admin
    # token is made (a failed start must not replace the certificate of a server running there)
    sock = listening_socket(host, port)
    home = config.home()
    fingerprint = None
    ca_path: str | None = None
    if self_signed_flag:
        tls_cert, tls_key = self_signed(host, home / "tls")
        ca_path = str(tls_cert)
    if tls_cert is not None and tls_key is not None:
        for p in (tls_cert, tls_key):
            if p is None or not p.is_file():
                raise typer.BadParameter(f"{p}: no such file", param_hint="--tls-cert/--tls-key")
        fingerprint = _check_tls(tls_cert, tls_key)
    from gpulayer import provider_config
    from gpulayer.control.providers import ProviderSet

    configured = provider_config.load(providers)  # a bad file stops the start here (exit 2)
    store = _open_store(database)
    # the database as it was given, its password hidden (a server's output is its log)
    shown_db = redacted(database) if database else store.url
    control = ControlPlane(store, results_as_text=True)  # (written into answers as stored)
    if configured:
        control.providers = ProviderSet(configured, ca=fingerprint)
    tokens = TokenStore(store)
    token_file = admin_token_file(home, database)
    if not tokens.has_admin():
        _info, secret = tokens.create("admin", description="first admin token (server start)")
        _write_private(token_file, secret + "\n")
        # the secret goes to that file only, never to the output: a server's output is its log
        typer.echo(f"admin token created in {token_file} (mode 0600; it is not shown or logged)", err=True)
    scheme = "https" if tls else "http"
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown_host:
        shown_host = f"[{shown_host}]"
    app = create_app(control, threads=default_threads())
    raise_open_files()
    config_kw: dict[str, Any] = {"log_level": log_level.lower(), "access_log": False,
                                 "timeout_graceful_shutdown": 5, "lifespan": "on",
                                 # workers keep connections open between heartbeats and long polls
                                 "timeout_keep_alive": 75,
                                 # a request's head bounded in size and time (gpulayer.server.protocol)
                                 "http": BoundedHttpToolsProtocol}
    if tls:
        config_kw.update(ssl_certfile=str(tls_cert), ssl_keyfile=str(tls_key))
    if root_path:
        config_kw.update(root_path=root_path)
    uv = uvicorn.Server(uvicorn.Config(app, **config_kw))

    orig_startup = uv.startup
    records: list[Path] = []  # (its servers/HASH.json, once written)

    async def startup(sockets: Any = None) -> None:
        await orig_startup(sockets=sockets)
        bound = port
        for srv in getattr(uv, "servers", []) or []:
            for sock in srv.sockets:
                bound = sock.getsockname()[1]
                break
        url = f"{scheme}://{shown_host}:{bound}"
        if control.providers is not None:
            control.providers.control_url = config.settings().public_url or url
            typer.echo(f"providers: {', '.join(control.providers.configured)} (machines join {control.providers.control_url})",
                       err=True)
        ready = {"url": url, "ca": ca_path, "fingerprint": fingerprint, "pid": os.getpid(), "database": shown_db}
        # (what a local client needs besides: which admin token goes to this URL, and which
        # process it goes to: http_client.server_info)
        record = json.dumps({**ready, "admin_token": str(token_file), "started": process_started()}, indent=2) + "\n"
        _write_private(home / "server.json", record)
        # (server.json names the server that started last; this one, another server's start on
        # the same home, for another database, does not take away)
        (home / "servers").mkdir(mode=0o700, exist_ok=True)
        _write_private(server_record(home, url), record)
        records.append(server_record(home, url))
        typer.echo(f"gpulayer server listening on {url} (database {shown_db})", err=True)
        if root_path:
            typer.echo(f"served under {root_path} by the proxy in front: the dashboard is at PROXY{root_path}/; "
                       f"clients may use either URL", err=True)
        if fingerprint:
            typer.echo(f"TLS certificate fingerprint: {fingerprint}", err=True)
            typer.echo(f"  clients: GPULAYER_URL={url} GPULAYER_CA={fingerprint}", err=True)
        if as_json:
            echo_json(ready, lines=True)

    uv.startup = startup  # type: ignore[method-assign]
    orig_exit = uv.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        app.state.server.begin_shutdown()  # long polls answer now instead of holding the exit
        orig_exit(sig, frame)

    uv.handle_exit = handle_exit  # type: ignore[method-assign]
    orig_shutdown = uv.shutdown

    async def shutdown(sockets: Any = None) -> None:
        await orig_shutdown(sockets=sockets)
        for path in (home / "server.json", *records):  # (no admin token goes to whatever listens there next)
            _forget_server_json(path)
        # said here: after a signal, uvicorn raises it again once serving ends, so the
        # process may end before uv.run() returns
        typer.echo("gpulayer server stopped", err=True)

    uv.shutdown = shutdown  # type: ignore[method-assign]
    try:
        uv.run(sockets=[sock])
    finally:
        sock.close()


def raise_open_files() -> None:
    """Let this process open as many files as its hard limit allows: each connection is one
    (a worker's long poll, a browser's live page), and at a soft limit of 1,024 (the usual
    default) 1,024 idle connections, anyone's, left the server unable to accept another or
    to open its database."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):  # (a platform that caps it lower: keep what it has)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


#: a root path: segments of what a URL path holds unescaped (RFC 3986's pchar), or %XX, but
#: ';', which would end the dashboard cookie's Path (RFC 6265: no ';' in it) and leave a
#: Path no page of the root path matches: every login led back to the login page
_ROOT_PATH = re.compile(r"^(/(?:[A-Za-z0-9._~!$&'()*+,=:@-]|%[0-9A-Fa-f]{2})+)+$")


def _root_path(given: str) -> str:
    """``--root-path`` without its last ``/`` (``/`` alone: none), or exit 2 saying what is accepted."""
    path = given.rstrip("/")
    segments = path.split("/")[1:]
    if given and path and (not _ROOT_PATH.match(path) or any(s in (".", "..") for s in segments)):
        raise typer.BadParameter(f"{given!r}: accepted: a URL path such as /gpulayer (the prefix a proxy in front "
                                 "serves this server under), without ?, #, ;, spaces, empty, . or .. segments",
                                 param_hint="--root-path")
    return path


def _check_tls(cert: Path, key: Path) -> str:
    """The certificate's fingerprint, once a TLS context has loaded the pair (a file that is
    no PEM certificate, or a key of another certificate, is said here, exit 2), and once its
    dates are checked, where the optional ``cryptography`` package can read them."""
    import ssl

    from gpulayer.server_records import fingerprint_of_pem, first_certificate

    try:
        text = cert.read_text()
        fingerprint = fingerprint_of_pem(text)
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        valid = _validity(first_certificate(text))
    except (OSError, ValueError, ssl.SSLError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise typer.BadParameter(f"{cert}, {key}: cannot serve TLS with them: {' '.join(str(exc).split())}",
                                 param_hint="--tls-cert/--tls-key") from None
    if valid is None:
        return fingerprint
    # (served, every client refused it, saying only "certificate verify failed")
    now = datetime.datetime.now(datetime.timezone.utc)
    when = "%Y-%m-%d %H:%M UTC"
    not_before, not_after = valid
    if not_after <= now:
        raise typer.BadParameter(f"{cert}: the certificate expired on {not_after.strftime(when)}, "
                                 "and no client would accept it; give a renewed one", param_hint="--tls-cert")
    if not_before > now:
        raise typer.BadParameter(f"{cert}: the certificate is not valid before "
                                 f"{not_before.strftime(when)}, and no client would accept it until "
                                 "then (or this machine's clock is wrong)", param_hint="--tls-cert")
    return fingerprint


def _validity(pem: str) -> tuple[datetime.datetime, datetime.datetime] | None:
    """When the PEM certificate ``pem`` is valid from and until; None without the optional
    ``cryptography`` package (``gpulayer[tls]``), which a --tls-cert start does not need."""
    try:
        from cryptography import x509
    except ImportError:
        return None
    own = x509.load_pem_x509_certificate(pem.encode())
    return own.not_valid_before_utc, own.not_valid_after_utc


def _open_store(database: str | None) -> Any:
    """The server's store. A URL it cannot use, or a database it cannot create or open, is
    said naming where the URL came from (``--database``, or ``GPULAYER_DATABASE_URL`` when
    it is that variable's), its password hidden, exit 2, before anything is served."""
    from gpulayer.store import Store

    from_variable = database is not None and os.environ.get("GPULAYER_DATABASE_URL", "").strip() == database
    return Store(database, where="GPULAYER_DATABASE_URL" if from_variable else "--database")


def admin_token_file(home: Path, database: str | None) -> Path:
    """Where the first admin token of ``database`` is written: ``admin.token`` for the home's
    own SQLite, ``admin-HASH.token`` for any other database, so that starting on another
    database never overwrites the only copy of one's admin token."""
    if database is None:
        return home / "admin.token"
    import hashlib

    return home / f"admin-{hashlib.sha256(_redact(database).encode()).hexdigest()[:12]}.token"


def process_started() -> float:
    """This process's start time (psutil's), which a client compares to tell it from another
    process given the same pid later."""
    import psutil

    return float(psutil.Process().create_time())


def _forget_server_json(path: Path) -> None:
    """Remove ``server.json`` (or this server's ``servers/HASH.json``) if this process wrote it
    (another server may have started on the home since)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _redact(url: str) -> str:
    """``url`` as SQLAlchemy renders it without its password: the key of an admin token's
    file name (:func:`admin_token_file`), kept as it was so that a home's existing file is
    found; what is shown to people is :func:`gpulayer.store.urls.redacted`."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "?"
