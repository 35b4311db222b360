#!/usr/bin/env bash
# A private sshd on 127.0.0.1 for trying and testing the bundled `ssh` provider by hand.
#
#   scripts/local-sshd.sh start    # start it (or find it running); prints what to connect with
#   scripts/local-sshd.sh status   # exit 0 and print the same when it runs, exit 1 when not
#   scripts/local-sshd.sh stop     # stop it (nothing to do is fine)
#
# It is Debian's openssh-server binary with a config, host key and client key of its own in a
# state directory (GPULAYER_SSHD_DIR, default ${TMPDIR:-/tmp}/gpulayer-sshd-<uid>); the
# system's sshd and ~/.ssh are not touched. It accepts only the generated client key, for the
# user who started it: no password, no PAM, no agent or X11 forwarding. The port is
# GPULAYER_SSHD_PORT, else a free port chosen at the first start and kept in the state dir.
#
# What it prints can be evaluated by a shell: eval "$(scripts/local-sshd.sh start)"
#   GPULAYER_SSHD_HOST=127.0.0.1 GPULAYER_SSHD_PORT=... GPULAYER_SSHD_USER=...
#   GPULAYER_SSHD_KEY=<client private key> GPULAYER_SSHD_KNOWN_HOSTS=<a known_hosts file with its host key>
set -euo pipefail

SSHD=${SSHD:-/usr/sbin/sshd}
DIR=${GPULAYER_SSHD_DIR:-${TMPDIR:-/tmp}/gpulayer-sshd-$(id -u)}
USER_NAME=$(id -un)
HOST=127.0.0.1

die() { echo "local-sshd: $*" >&2; exit 1; }

running_pid() {
  local pid
  [ -f "$DIR/sshd.pid" ] || return 1
  pid=$(cat "$DIR/sshd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # a pid that was reused by something else is not ours
  grep -q "sshd" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

port() { cat "$DIR/port"; }

print_info() {
  echo "GPULAYER_SSHD_HOST=$HOST"
  echo "GPULAYER_SSHD_PORT=$(port)"
  echo "GPULAYER_SSHD_USER=$USER_NAME"
  echo "GPULAYER_SSHD_KEY=$DIR/client_key"
  echo "GPULAYER_SSHD_KNOWN_HOSTS=$DIR/known_hosts"
  echo "GPULAYER_SSHD_DIR=$DIR"
}

free_port() {
  python3 - <<'EOF'
import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
EOF
}

setup() {
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  if [ -n "${GPULAYER_SSHD_PORT:-}" ]; then
    echo "$GPULAYER_SSHD_PORT" > "$DIR/port"
  elif [ ! -s "$DIR/port" ]; then
    free_port > "$DIR/port"
  fi
  [ -f "$DIR/host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -C "gpulayer-local-sshd host" -f "$DIR/host_ed25519_key"
  [ -f "$DIR/client_key" ] || ssh-keygen -q -t ed25519 -N "" -C "gpulayer-local-sshd client" -f "$DIR/client_key"
  cp "$DIR/client_key.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys" "$DIR/client_key" "$DIR/host_ed25519_key"
  # what a client trusts: exactly this server's host key, under the name [host]:port
  echo "[$HOST]:$(port) $(cut -d' ' -f1,2 "$DIR/host_ed25519_key.pub")" > "$DIR/known_hosts"
  cat > "$DIR/sshd_config" <<EOF
# written by scripts/local-sshd.sh; regenerated at every start
ListenAddress $HOST
Port $(port)
HostKey $DIR/host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
AllowUsers $USER_NAME
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# the state dir lives under a world-writable TMPDIR, which StrictModes would refuse
StrictModes no
AllowAgentForwarding no
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
LogLevel VERBOSE
EOF
}

start() {
  [ -x "$SSHD" ] || die "$SSHD not found: install Debian's openssh-server (apt-get install --no-install-recommends openssh-server)"
  if running_pid >/dev/null; then
    print_info
    return 0
  fi
  setup
  # sshd running as root wants its privilege separation directory
  if [ "$(id -u)" -eq 0 ] && [ ! -d /run/sshd ]; then mkdir -p /run/sshd && chmod 755 /run/sshd; fi
  "$SSHD" -t -f "$DIR/sshd_config" || die "sshd refused the generated config $DIR/sshd_config"
  # the binary needs an absolute path to re-execute itself; -E keeps its log in the state dir
  "$SSHD" -f "$DIR/sshd_config" -E "$DIR/sshd.log"
  local i
  for i in $(seq 1 50); do
    if running_pid >/dev/null && (exec 3<>"/dev/tcp/$HOST/$(port)") 2>/dev/null; then
      print_info
      return 0
    fi
    sleep 0.1
  done
  die "sshd did not start listening on $HOST:$(port); see $DIR/sshd.log: $(tail -n 5 "$DIR/sshd.log" 2>/dev/null | tr '\n' ' ')"
}

stop() {
  local pid i
  if pid=$(running_pid); then
    kill "$pid"
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "local-sshd: stopped (pid $pid)" >&2
  else
    echo "local-sshd: not running" >&2
  fi
  rm -f "$DIR/sshd.pid"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if running_pid >/dev/null; then print_info; else echo "local-sshd: not running" >&2; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
