# Shared helpers for the deploy/ scripts. Sourced, never run on its own.
# shellcheck shell=bash

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$DEPLOY_DIR/.." && pwd)"
DEFAULT_STATE_DIR="$DEPLOY_DIR/.state"
# Name of the SuperLink connection written into the private Flower config.
DEFAULT_CONNECTION="fl-clusters"

# Use the project's venv when there is one (the usual case), otherwise whatever
# environment is on PATH (a node machine may have installed fl-clusters elsewhere).
VENV="${FLC_VENV:-$REPO_ROOT/.venv}"
if [[ -x "$VENV/bin/python" ]]; then
    export PATH="$VENV/bin:$PATH"
fi
PYTHON="$(command -v python || command -v python3)"

# Every process we start already runs in an environment that holds torch and the
# rest: Flower must not `uv sync` the app's dependencies into a fresh runtime
# environment per run (a multi-GB torch download, and no network on some nodes).
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# A deployment may have no internet access: skip Flower's update check and
# telemetry rather than wait on their timeouts.
export FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_TELEMETRY_ENABLED=0

die() {
    echo "error: $*" >&2
    exit 1
}

warn() {
    echo "WARNING: $*" >&2
}

need_cmd() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH; $2"
}

# Absolute path of a (possibly not yet existing) path, so that recorded paths
# stay valid whatever the caller's working directory.
abspath() {
    local p="$1"
    if [[ "$p" != /* ]]; then
        p="$PWD/$p"
    fi
    echo "$p"
}

pid_alive() {
    # A zombie still answers kill -0; treat it as gone (it holds no resources
    # except its table entry, and its parent reaps it).
    local pid="$1" state
    kill -0 "$pid" 2>/dev/null || return 1
    state="$(ps -o stat= -p "$pid" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z* ]]
}

# launch NAME STATE_DIR CMD...: start CMD detached (own session, so a Ctrl-C in
# the caller's terminal does not reach it), log to STATE_DIR/logs/NAME.log and
# record its PID in STATE_DIR/pids/NAME.pid (start time in NAME.start). Sets
# LAUNCHED_PID (a global, not an echo: $(launch ...) would fork a subshell).
launch() {
    local name="$1" state_dir="$2"
    shift 2
    mkdir -p "$state_dir/logs" "$state_dir/pids"
    local log="$state_dir/logs/$name.log"
    # setsid does not fork here (a background job of a non-interactive shell is
    # not a group leader), so $! is the PID of the Flower process itself.
    setsid "$@" </dev/null >>"$log" 2>&1 &
    LAUNCHED_PID=$!
    echo "$LAUNCHED_PID" >"$state_dir/pids/$name.pid"
    process_start "$LAUNCHED_PID" >"$state_dir/pids/$name.start" || true
}

# wait_for_log PID LOG PATTERN TIMEOUT_S: wait until LOG matches PATTERN; fail
# early (with the log's tail) if PID exits first.
wait_for_log() {
    local pid="$1" log="$2" pattern="$3" timeout="$4"
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        if grep -qE "$pattern" "$log" 2>/dev/null; then
            return 0
        fi
        if ! pid_alive "$pid"; then
            echo "--- last lines of $log ---" >&2
            tail -n 25 "$log" >&2 || true
            return 1
        fi
        sleep 0.2
    done
    echo "--- timed out after ${timeout}s; last lines of $log ---" >&2
    tail -n 25 "$log" >&2 || true
    return 1
}

# wait_for_port HOST PORT TIMEOUT_S: wait until something accepts TCP on HOST:PORT.
wait_for_port() {
    local host="$1" port="$2" timeout="$3"
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}

# superlink_transport HOST:PORT: what answers there. "tls" when a TLS handshake
# succeeds (the certificate is not checked here), "plain" when the connection is
# accepted but the handshake is not, "none" when nothing accepts it, "unknown"
# when it does not answer within 5 s. A SuperNode whose TLS setting differs from
# its SuperLink's only logs "Connection attempt failed" until it gives up.
superlink_transport() {
    "$PYTHON" - "$1" <<'PY'
import socket
import ssl
import sys

host, _, port = sys.argv[1].rpartition(":")
host = host.strip("[]")
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    connection = socket.create_connection((host, int(port)), timeout=5)
except TimeoutError:
    print("unknown")
except (OSError, ValueError):
    print("none")
else:
    try:
        with context.wrap_socket(connection, server_hostname=host):
            print("tls")
    except TimeoutError:
        print("unknown")
    except OSError:
        print("plain")
PY
}

# descendants PID: every live descendant of PID, depth first. Flower's
# SuperExec and app processes start their own sessions, so a process-group
# kill would miss them; they are still our children in the process tree.
descendants() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$child"
        descendants "$child"
    done
}

# Apps outside this checkout (examples/) import fl_clusters. When the project is
# used from a checkout rather than pip-installed, let them find it here. Flower
# puts the app's own unpacked FAB first on sys.path, so the FAB still wins for
# the fl-clusters app itself. find_spec looks the package up without importing it
# (every make run and deploy script sources this file).
if ! (cd / && "$PYTHON" -c "import importlib.util, sys
sys.exit(importlib.util.find_spec('fl_clusters') is None)" 2>/dev/null); then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$REPO_ROOT"
fi

# process_start PID: the kernel's start time of PID (clock ticks since boot).
# Recorded beside each PID so that stop.sh never signals an unrelated process
# that reused the number after ours exited.
process_start() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    # Field 22; strip "pid (comm) " first because comm may contain spaces.
    stat="${stat##*) }"
    echo "$stat" | awk '{print $20}'
}
