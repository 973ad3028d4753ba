#!/usr/bin/env bash
# Stop every process the deploy/ scripts started from one state directory.
#
#   deploy/stop.sh [--state-dir DIR] [--timeout SECONDS] [--only NAME]
#
# Reads STATE/pids/*.pid (--only NAME: STATE/pids/NAME.pid alone), and stops
# exactly those processes and their descendants (Flower's SuperExec and app
# processes start their own sessions, so they are found through the process
# tree, not by process group or name). SuperNodes go first, the SuperLink last.
# SIGTERM, then SIGKILL for whatever is left after --timeout (default 15 s).
# Exits non-zero if any process survives.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

state_dir="$DEFAULT_STATE_DIR"
timeout=15
only=""
while (($#)); do
    case "$1" in
        -h | --help) usage 0 ;;
        --state-dir) state_dir="$2"; shift ;;
        --timeout) timeout="$2"; shift ;;
        --only) only="$2"; shift ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
    shift
done
state_dir="$(abspath "$state_dir")"
piddir="$state_dir/pids"
if [[ ! -d "$piddir" ]] || ! compgen -G "$piddir/*.pid" >/dev/null; then
    echo "nothing recorded in $piddir: nothing to stop"
    exit 0
fi

# SuperNodes (and anything else) before the SuperLink, so that nodes do not
# spend the shutdown retrying a vanished SuperLink.
pidfiles=()
if [[ -n "$only" ]]; then
    [[ -f "$piddir/$only.pid" ]] || die "no $only.pid in $piddir: nothing of that name to stop"
    pidfiles=("$piddir/$only.pid")
else
    for f in "$piddir"/*.pid; do
        [[ "$(basename "$f")" == superlink.pid ]] || pidfiles+=("$f")
    done
    [[ -f "$piddir/superlink.pid" ]] && pidfiles+=("$piddir/superlink.pid")
fi

roots=()
tree=()
for f in "${pidfiles[@]}"; do
    name="$(basename "$f" .pid)"
    pid="$(cat "$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] || { warn "ignoring $f: not a PID"; continue; }
    if ! pid_alive "$pid"; then
        echo "$name (PID $pid) already gone"
        continue
    fi
    # The PID may have been reused by an unrelated process since we started ours.
    recorded="$(cat "$piddir/$name.start" 2>/dev/null || true)"
    if [[ -n "$recorded" && "$(process_start "$pid" || true)" != "$recorded" ]]; then
        warn "$name: PID $pid now belongs to another process; not touching it"
        continue
    fi
    roots+=("$pid")
    tree+=("$pid" $(descendants "$pid"))
    echo "stopping $name (PID $pid)"
    kill -TERM "$pid" 2>/dev/null || true
done

alive_in_tree() {
    local p
    for p in "${tree[@]}"; do
        pid_alive "$p" && echo "$p"
    done
    return 0
}

wait_tree() {
    local deadline=$((SECONDS + $1))
    while ((SECONDS < deadline)) && [[ -n "$(alive_in_tree)" ]]; do
        sleep 0.2
    done
}
# A SuperExec notices its parent's exit only between connection retries (up
# to several seconds of backoff): give the roots a moment to shut down their
# own children, then ask the stragglers directly.
wait_tree 2
left="$(alive_in_tree)"
if [[ -n "$left" ]]; then
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null || true
    wait_tree "$timeout"
fi
left="$(alive_in_tree)"
if [[ -n "$left" ]]; then
    warn "still running after ${timeout}s, sending SIGKILL: $(echo $left)"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    sleep 1
    left="$(alive_in_tree)"
fi
if [[ -n "$left" ]]; then
    die "processes survived SIGKILL: $(echo $left)"
fi
# Keep the logs for post-mortems; forget the PIDs, which are now meaningless.
for f in "${pidfiles[@]}"; do
    rm -f "$f" "${f%.pid}.start"
done
echo "stopped ${#roots[@]} recorded process(es) and $((${#tree[@]} - ${#roots[@]})) descendant(s); logs kept in $state_dir/logs"
