#!/usr/bin/env bash
# Check one SuperNode's data partition, then start the SuperNode in the background.
#
#   deploy/start-node.sh --partition-id I --num-partitions N [options]
#
# Options:
#   --state-dir DIR           PIDs and logs (default: deploy/.state)
#   --superlink HOST:PORT     SuperLink Fleet API (default: from STATE/superlink.env,
#                             else 127.0.0.1:9093)
#   --root-certificates FILE  CA certificate of the SuperLink (default: STATE/certs/ca.crt)
#   --key FILE                authentication private key (default: STATE/keys/node-I)
#   --insecure                plain HTTP, no authentication (SuperLink started --insecure)
#   --port PORT               this SuperNode's local Runtime API port (default 9200+I;
#                             every SuperNode on one machine needs its own)
#   --name NAME               name of its PID and log files (default supernode-I)
#   --app DIR                 app folder for the start-up check (default: the repo)
#   --loader MODULE:FUNC      the app's data loader for the check
#                             (default fl_clusters.client.node_data:client_data_for)
#   --run-config "k=v ..."    run-config overrides the check loads the data with
#   --skip-check              start without the start-up check
#
# The start-up check (deploy/check_node.py) loads this node's partition exactly
# as its ClientApp will; a wrong partition id or missing data stops here, with a
# message, instead of failing the run in round 1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

state_dir="$DEFAULT_STATE_DIR"
partition_id=""
num_partitions=""
superlink=""
root_cert=""
key=""
insecure=""
port=""
name=""
app="$REPO_ROOT"
loader=""
run_config=""
check=1
while (($#)); do
    case "$1" in
        -h | --help) usage 0 ;;
        --state-dir) state_dir="$2"; shift ;;
        --partition-id) partition_id="$2"; shift ;;
        --num-partitions) num_partitions="$2"; shift ;;
        --superlink) superlink="$2"; shift ;;
        --root-certificates) root_cert="$2"; shift ;;
        --key) key="$2"; shift ;;
        --insecure) insecure=1 ;;
        --port) port="$2"; shift ;;
        --name) name="$2"; shift ;;
        --app) app="$2"; shift ;;
        --loader) loader="$2"; shift ;;
        --run-config) run_config="$2"; shift ;;
        --skip-check) check=0 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
    shift
done
[[ -n "$partition_id" && -n "$num_partitions" ]] || usage 2
state_dir="$(abspath "$state_dir")"
need_cmd flower-supernode "activate the venv that has flwr (or set FLC_VENV)"

# Defaults from the SuperLink started from this state directory, when there is one.
if [[ -f "$state_dir/superlink.env" ]]; then
    # shellcheck disable=SC1091
    source "$state_dir/superlink.env"
fi
superlink="${superlink:-${SUPERLINK_ADDRESS:-127.0.0.1:9093}}"
insecure="${insecure:-${SUPERLINK_INSECURE:-0}}"
name="${name:-supernode-$partition_id}"
if [[ -z "$port" ]]; then
    [[ "$partition_id" =~ ^[0-9]+$ ]] && port=$((9200 + partition_id)) || port=9200
fi

pidfile="$state_dir/pids/$name.pid"
if [[ -f "$pidfile" ]] && pid_alive "$(cat "$pidfile")"; then
    die "$name is already running (PID $(cat "$pidfile")); run deploy/stop.sh first"
fi

if ((check)); then
    check_args=(--app "$(abspath "$app")" --num-partitions "$num_partitions"
        --partition-id "$partition_id" --run-config "$run_config")
    [[ -n "$loader" ]] && check_args+=(--loader "$loader")
    "$PYTHON" "$DEPLOY_DIR/check_node.py" "${check_args[@]}" ||
        die "$name not started: its start-up check failed (see above)"
fi

args=(--superlink "$superlink" --port "$port"
    --node-config "partition-id=$partition_id num-partitions=$num_partitions")
if ((insecure)); then
    warn "starting $name with --insecure: its traffic to the SuperLink is not encrypted"
    args+=(--insecure)
else
    root_cert="$(abspath "${root_cert:-$state_dir/certs/ca.crt}")"
    key="$(abspath "${key:-$state_dir/keys/node-$partition_id}")"
    [[ -f "$root_cert" ]] || die "CA certificate $root_cert not found (copy ca.crt from the SuperLink machine)"
    [[ -f "$key" ]] || die "private key $key not found (deploy/make-node-keys.sh)"
    args+=(--root-certificates "$root_cert" --auth-supernode-private-key "$key")
fi

mkdir -p "$state_dir/home/$name" "$state_dir/logs"
: >"$state_dir/logs/$name.log"
# Each SuperNode gets its own FLWR_HOME: nodes on one machine would otherwise
# unpack the same FAB into one folder at the same time.
FLWR_HOME="$state_dir/home/$name" launch "$name" "$state_dir" flower-supernode "${args[@]}"
pid=$LAUNCHED_PID
# A refused key or an unreachable SuperLink ends the process within seconds;
# report that here rather than leave a dead PID behind.
if ! wait_for_log "$pid" "$state_dir/logs/$name.log" "SuperNode ID: [0-9]+" 60; then
    die "$name (PID $pid) did not connect to $superlink (log: $state_dir/logs/$name.log)"
fi
echo "$name PID $pid: $(grep -oE 'SuperNode ID: [0-9]+' "$state_dir/logs/$name.log" | tail -n 1)" \
    "(log: $state_dir/logs/$name.log)"
