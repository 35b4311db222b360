"""What a real ``gpulayer server start`` leaves in its log and on disk (issue 13 §5): the
admin token is never printed, the home and the database are private, and a SIGTERM ends
with a line that says the server stopped."""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
from pathlib import Path

import pytest

from tests.server_support import Api, ServerProc, base_env
from tests.support import cli

pytestmark = pytest.mark.timeout(120)


def test_the_server_logs_no_secret_keeps_its_files_private_and_says_it_stopped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)  # a home made before, by hand or by an older version
    srv = ServerProc(home)
    srv.start()
    try:
        token = srv.admin_token
        assert Api(srv.url, token)("GET", "/v1/jobs").status_code == 200
        log = srv.log()
        assert token not in log
        assert f"admin token created in {home.resolve() / 'admin.token'} (mode 0600" in log
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for p in home.iterdir():
            if p.name.startswith("gpulayer.db") or p.name in ("admin.token", "server.json"):
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        srv.kill(signal.SIGTERM)
    log = srv.log()
    assert log.rstrip().endswith("gpulayer server stopped"), log
    assert srv.admin_token not in log


def test_an_empty_database_is_the_home_s_own_with_its_admin_token_file(tmp_path: Path) -> None:
    """``--database ''`` served the home's SQLite but wrote its admin token to admin-HASH.token,
    while server.json (and so every later start's CLI) named admin.token: "missing token"."""
    home = tmp_path / "home"
    first = ServerProc(home, args=("--database", "")).start()
    try:
        assert "(database sqlite:///" in first.log() and (home / "gpulayer.db").exists()
        assert [p.name for p in home.glob("admin*.token")] == ["admin.token"]
    finally:
        first.stop()
    again = ServerProc(home, port=first.port).start()  # (the same database, named no way)
    try:
        listed = cli("--url", again.url, "token", "list", env=base_env(home))
        assert listed.returncode == 0 and "first admin token" in listed.stdout, listed.stderr
    finally:
        again.stop()


def test_another_database_gets_its_own_admin_token_file_and_a_stopped_server_is_sent_none(tmp_path: Path) -> None:
    """Starting on another database once overwrote admin.token, the only copy of the first
    database's admin token; and after a stop the CLI still sent the admin token to whatever
    listened at the recorded URL next."""
    home = tmp_path / "home"
    first = ServerProc(home).start()
    token = first.admin_token
    first.stop()
    assert not (home / "server.json").exists()
    other = ServerProc(home, port=first.port, database=f"sqlite:///{tmp_path / 'other.db'}").start()
    try:
        assert other.admin_token_file != home / "admin.token" and other.admin_token != token
        assert f"admin token created in {other.admin_token_file.resolve()} (mode 0600" in other.log()
        listed = cli("--url", other.url, "token", "list", env=base_env(home))
        assert listed.returncode == 0 and "first admin token" in listed.stdout, listed.stderr
    finally:
        other.stop()
    again = ServerProc(home, port=first.port).start()
    try:
        assert again.admin_token == token  # its own, kept
        assert cli("--url", again.url, "jobs", "list", env=base_env(home)).returncode == 0
        # a token read from the file is not blamed on settings the user never set
        (home / "admin.token").write_text("glt_not-this-one\n")
        refused = cli("--url", again.url, "jobs", "list", env=base_env(home))
        assert refused.returncode == 2 and "GPULAYER_TOKEN" not in refused.stderr, refused.stderr
        assert f"invalid token: no such token (the admin token read from {home / 'admin.token'})" in refused.stderr
        (home / "admin.token").write_text(token + "\n")
    finally:
        again.kill()  # (SIGKILL: its server.json stays behind, naming a process that is gone)
    assert (home / "server.json").exists()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", again.port))
    listener.listen(1)
    heard: list[bytes] = []

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            heard.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        cli("--url", again.url, "jobs", "list", env={**base_env(home), "GPULAYER_HTTP_RETRY_SECONDS": "0"})
        t.join(30)
    finally:
        listener.close()
    assert heard and b"GET /v1/jobs" in heard[0]
    assert token.encode() not in heard[0] and b"authorization" not in heard[0].lower()


def test_each_of_two_servers_on_one_home_is_found_by_its_url_while_it_runs(tmp_path: Path) -> None:
    """One home serving two databases at once: the second start overwrote server.json, so the
    CLI on that home sent the first server no token ("missing token"), and after the second
    stopped neither was recorded."""
    home = tmp_path / "home"
    first = ServerProc(home).start()
    other = ServerProc(home, database=f"sqlite:///{tmp_path / 'other.db'}")
    try:
        other.start()
        for srv in (first, other):
            listed = cli("--url", srv.url, "token", "list", env=base_env(home))
            assert listed.returncode == 0 and "first admin token" in listed.stdout, (srv.url, listed.stderr)
        other.stop()
        assert cli("--url", first.url, "jobs", "list", env=base_env(home)).returncode == 0
        assert len(list((home / "servers").iterdir())) == 1  # (the other's record went with it)
    finally:
        other.kill()
        first.stop()
    assert not (home / "server.json").exists() and not any((home / "servers").iterdir())


@pytest.mark.parametrize(("args", "says"), [
    (["--log-level", "nonsense"], "Invalid value for --log-level: 'nonsense': accepted: critical, error, warning"),
    (["--tls-cert", "{bad}", "--tls-key", "{bad}"], "cannot serve TLS with them: no PEM certificate in it"),
    (["--database", "postgresql://postgres@127.0.0.1:1/test"], "error: --database postgresql://postgres@127.0.0.1:1/test: "
                                                               "cannot open the database:"),
    # (these were tracebacks: a TypeError about pool arguments, a FileNotFoundError; the URL
    # errors named no input and showed the password)
    (["--database", "sqlite://"], "error: --database sqlite://: an in-memory SQLite database is not accepted"),
    (["--database", "sqlite:////proc/no/x.db"], "error: --database sqlite:////proc/no/x.db: cannot create the "
                                                "database file /proc/no/x.db"),
    (["--database", "postgresql://u:s3cret@127.0.0.1:x/db"], "error: --database postgresql://u:***@127.0.0.1:x/db: "
                                                             "its port is not a number from 1 to 65535; accepted: sqlite:///PATH"),
    # (an address of another machine was said as a port in use: "pick another with --port")
    (["--host", "192.0.2.1", "--insecure-http"], "error: --host 192.0.2.1: not an address of this machine "
                                                 "(Cannot assign requested address); accepted: an address of one"),
    (["--port", "{busy}"], "error: cannot listen on 127.0.0.1:{busy}: Address already in use; pick another with --port"),
    # (a --self-signed start for another host made a new certificate before it found the port taken)
    (["--port", "{busy}", "--self-signed"], "error: cannot listen on 127.0.0.1:{busy}"),
])
def test_a_start_it_cannot_make_says_why_exit_2_and_leaves_nothing_behind(tmp_path: Path, args: list[str],
                                                                           says: str) -> None:
    home = tmp_path / "home"
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = str(busy.getsockname()[1])
        words = [a.format(bad=bad, busy=port) for a in args]
        if "--port" not in words:
            words += ["--port", "0"]
        proc = cli("server", "start", *words, env=base_env(home), timeout=60)
    finally:
        busy.close()
    assert proc.returncode == 2, proc.stderr
    assert says.format(busy=port) in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not home.exists() or not any(p.name.startswith(("gpulayer.db", "admin", "tls")) for p in home.iterdir())


def test_a_self_signed_certificate_made_again_for_another_host_says_its_fingerprint_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A restart with another --host made a new certificate without a word, and a worker
    pinned to the old one failed with 'certificate verify failed'."""
    from cryptography import x509

    from gpulayer.cli.server import self_signed
    from gpulayer.server_records import fingerprint_of_pem

    cert, _ = self_signed("127.0.0.1", tmp_path)
    first = fingerprint_of_pem(cert.read_text())
    assert self_signed("127.0.0.1", tmp_path)[0] == cert and "note:" not in capsys.readouterr().err  # reused
    self_signed("gpu-box.example.com", tmp_path)
    said = capsys.readouterr().err
    assert f"(it did not name gpu-box.example.com); its fingerprint changed from {first}" in " ".join(said.split())
    assert fingerprint_of_pem(cert.read_text()) != first
    san = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "gpu-box.example.com" in san.get_values_for_type(x509.DNSName)
    self_signed("127.0.0.1", tmp_path)  # (its names kept: the first host is still named, nothing made)
    assert "note:" not in capsys.readouterr().err


def test_a_command_that_sends_no_token_is_told_how_to_give_one(tmp_path: Path) -> None:
    """It said the server's words for HTTP clients: "send 'Authorization: Bearer <token>'"."""
    srv = ServerProc(tmp_path / "server-home").start()
    try:
        r = cli("--url", srv.url, "jobs", "list", env=base_env(tmp_path / "another-home"))
        assert (r.returncode, r.stderr) == (2, f"error: missing token: {srv.url} needs one; give --token TOKEN or "
                                               "set GPULAYER_TOKEN (what gpulayer token create printed)\n")
    finally:
        srv.stop()


def _ca_and_server_certificate(directory: Path, *, expired: bool = False) -> tuple[Path, Path, Path, str]:
    """A CA, and a server certificate it signed for 127.0.0.1, written as a chain file
    (server first, with the text an export from PKCS#12 puts before each block); returns
    the chain, the key, the CA and the server certificate's own fingerprint."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from gpulayer.server_records import fingerprint_of_der

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=30))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    until = now - datetime.timedelta(days=1) if expired else now + datetime.timedelta(days=30)
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "server")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
              .not_valid_before(now - datetime.timedelta(days=20)).not_valid_after(until)
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    chain, key_path, ca_path = directory / "chain.pem", directory / "server.key", directory / "ca.pem"
    chain.write_bytes(b"Bag Attributes\n    friendlyName: server\n" + server.public_bytes(pem)
                      + b"Bag Attributes\n    friendlyName: test CA\n" + ca.public_bytes(pem))
    key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    ca_path.write_bytes(ca.public_bytes(pem))
    return chain, key_path, ca_path, fingerprint_of_der(server.public_bytes(serialization.Encoding.DER))


def test_a_certificate_chain_s_fingerprint_is_the_server_certificate_s_so_a_pinned_client_talks(
        tmp_path: Path) -> None:
    """--tls-cert takes a chain, but the whole file was decoded as one certificate: the
    fingerprint printed (and recorded, and given to the machines providers boot) was the
    hash of none, and every client pinned to it was refused; a file with text before its
    first block (an export from PKCS#12) was refused as "Invalid PEM encoding"."""
    import json

    chain, key, ca, own = _ca_and_server_certificate(tmp_path)
    home = tmp_path / "home"
    srv = ServerProc(home, args=("--tls-cert", str(chain), "--tls-key", str(key), "--json")).start()
    try:
        ready = json.loads(next(line for line in srv.log().splitlines() if line.startswith("{")))
        assert ready["fingerprint"] == own
        assert f"GPULAYER_CA={own}" in srv.log()
        elsewhere = base_env(tmp_path / "client-home")
        for trust in (own, str(ca)):  # pinned to what the start printed, or the CA's file
            listed = cli("--url", srv.url, "--token", srv.admin_token, "--ca", trust, "jobs", "list", env=elsewhere)
            assert listed.returncode == 0, listed.stderr
    finally:
        srv.stop()


def test_an_expired_certificate_is_refused_at_the_start(tmp_path: Path) -> None:
    """It was served, and every client refused it, saying only "certificate verify failed"."""
    chain, key, _ca, _ = _ca_and_server_certificate(tmp_path, expired=True)
    home = tmp_path / "home"
    proc = cli("server", "start", "--port", "0", "--tls-cert", str(chain), "--tls-key", str(key),
               env=base_env(home), timeout=60)
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"Invalid value for --tls-cert: {chain}: the certificate expired on " in said, said
    assert "give a renewed one" in said
    assert not home.exists() or not any(p.name.startswith(("gpulayer.db", "admin")) for p in home.iterdir())


def test_a_tls_certificate_is_served_without_the_optional_cryptography_package(tmp_path: Path) -> None:
    """--tls-cert/--tls-key need only Python's ssl (cryptography is gpulayer[tls]'s, for
    --self-signed); reading the certificate's dates imported it, and a start without it
    ended in a ModuleNotFoundError traceback."""
    chain, key, _ca, own = _ca_and_server_certificate(tmp_path)
    blocker = tmp_path / "no-cryptography"
    (blocker / "cryptography").mkdir(parents=True)
    (blocker / "cryptography" / "__init__.py").write_text("raise ImportError('not installed (the test hides it)')\n")
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH", "")) if p)
    srv = ServerProc(tmp_path / "home", env={"PYTHONPATH": path},
                     args=("--tls-cert", str(chain), "--tls-key", str(key))).start()
    try:
        assert f"TLS certificate fingerprint: {own}" in srv.log()
    finally:
        srv.stop()
