#!/usr/bin/env bash
# Start a SuperLink and N SuperNodes on this machine (loopback deployment).
#
#   deploy/start.sh [options]
#
# Options:
#   -n, --nodes N          SuperNodes to start; node i serves partition i of N (default 4,
#                          the app's default num-clusters: one node per group at least)
#   --insecure             no TLS, no SuperNode authentication (tests only; warns)
#   --port PORT            the Fleet gateway's port, which SuperNodes connect to (default 9092)
#   --control-port PORT    the SuperLink's own port, loopback only: Control API (flwr CLI)
#                          and Runtime API (default 9093)
#   --node-port-base PORT  SuperNode i's Runtime API listens on PORT+i (default 9200)
#   --state-dir DIR        certificates, keys, PIDs, logs, Flower config (default deploy/.state)
#   --connection NAME      flwr connection name (default fl-clusters)
#   --app DIR              app whose data the start-up check loads (default: the repo)
#   --loader MODULE:FUNC   that app's data loader (default fl_clusters.client.node_data:client_data_for)
#   --run-config "k=v ..." run-config overrides the check loads the data with (use the
#                          data-related keys of the run you will submit)
#   --skip-check           start the SuperNodes without the start-up check
#
# Secure by default: certificates in STATE/certs and one key pair per node in
# STATE/keys are created when missing, every node's public key is registered
# with the SuperLink, and the SuperLink admits no other node. SuperNodes reach only
# the Fleet gateway (--port); registering keys and submitting runs go to the
# SuperLink's loopback port (--control-port), from this machine. Then:
#   deploy/flwr.sh run . fl-clusters --stream --run-config "min-nodes=N ..."
#   deploy/stop.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

nodes=4
insecure=0
port=9092
control_port=9093
node_port_base=9200
state_dir="$DEFAULT_STATE_DIR"
connection="$DEFAULT_CONNECTION"
app="$REPO_ROOT"
loader=""
run_config=""
check=1
while (($#)); do
    case "$1" in
        -h | --help) usage 0 ;;
        -n | --nodes) nodes="$2"; shift ;;
        --insecure) insecure=1 ;;
        --port) port="$2"; shift ;;
        --control-port) control_port="$2"; shift ;;
        --node-port-base) node_port_base="$2"; shift ;;
        --state-dir) state_dir="$2"; shift ;;
        --connection) connection="$2"; shift ;;
        --app) app="$2"; shift ;;
        --loader) loader="$2"; shift ;;
        --run-config) run_config="$2"; shift ;;
        --skip-check) check=0 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
    shift
done
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$nodes'"
state_dir="$(abspath "$state_dir")"
app="$(abspath "$app")"

# Refuse to start over a running deployment: the error cleanup below would
# otherwise stop it.
for f in "$state_dir"/pids/*.pid; do
    [[ -e "$f" ]] || continue
    if pid_alive "$(cat "$f")"; then
        die "$(basename "$f" .pid) from $state_dir is running (PID $(cat "$f")); run deploy/stop.sh --state-dir $state_dir first"
    fi
done

# Check every partition before starting anything: a bad node config then
# leaves no half-started deployment behind. One Python process for all nodes.
if ((check)); then
    check_args=(--app "$app" --num-partitions "$nodes" --run-config "$run_config"
        --partition-id $(seq 0 $((nodes - 1))))
    [[ -n "$loader" ]] && check_args+=(--loader "$loader")
    "$PYTHON" "$DEPLOY_DIR/check_node.py" "${check_args[@]}" ||
        die "nothing started: the SuperNodes' start-up check failed (see above); it loads" \
            "the data with the app's run config${run_config:+ and --run-config \"$run_config\"}: give" \
            "--run-config the data keys of the run you will submit (e.g. \"num-clusters=2\")"
fi

# From here on, a failure stops whatever this script already started.
cleanup_on_error() {
    echo "start.sh failed; stopping what it started" >&2
    "$DEPLOY_DIR/stop.sh" --state-dir "$state_dir" >&2 || true
}
trap cleanup_on_error ERR

superlink_args=(--state-dir "$state_dir" --port "$port" --control-port "$control_port"
    --connection "$connection")
if ((insecure)); then
    superlink_args+=(--insecure)
else
    "$DEPLOY_DIR/make-certs.sh" "$state_dir/certs" >/dev/null
    "$DEPLOY_DIR/make-node-keys.sh" "$state_dir/keys" "$nodes" >/dev/null
fi
"$DEPLOY_DIR/start-superlink.sh" "${superlink_args[@]}"

if ((!insecure)); then
    pubkeys=()
    for ((i = 0; i < nodes; i++)); do
        pubkeys+=("$state_dir/keys/node-$i.pub")
    done
    "$DEPLOY_DIR/register-nodes.sh" --state-dir "$state_dir" --connection "$connection" \
        "${pubkeys[@]}"
fi

for ((i = 0; i < nodes; i++)); do
    node_args=(--state-dir "$state_dir" --partition-id "$i" --num-partitions "$nodes"
        --port $((node_port_base + i)) --skip-check)
    ((insecure)) && node_args+=(--insecure)
    "$DEPLOY_DIR/start-node.sh" "${node_args[@]}"
done
trap - ERR

echo
echo "deployment up: 1 SuperLink + $nodes SuperNodes; state in $state_dir"
echo "submit a run:  deploy/flwr.sh${state_dir:+ --state-dir $state_dir} run . $connection --stream --run-config \"min-nodes=$nodes${run_config:+ $run_config}\""
echo "stop it:       deploy/stop.sh --state-dir $state_dir"
