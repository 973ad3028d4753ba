#!/usr/bin/env bash
# Check one SuperNode's data partition, then start the SuperNode in the background.
#
#   deploy/start-node.sh --partition-id I --num-partitions N [options]
#
# Options:
#   --state-dir DIR           PIDs and logs (default: deploy/.state)
#   --superlink HOST:PORT     SuperLink Fleet API (default: from STATE/superlink.env,
#                             else 127.0.0.1:9092: the Fleet gateway)
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
#   --connect-timeout S       give up when it has no SuperNode ID after S seconds
#                             (default 60)
#
# The start-up check (deploy/check_node.py) loads this node's partition exactly
# as its ClientApp will; a wrong partition id or missing data stops here, with a
# message, instead of failing the run in round 1. A SuperLink that speaks TLS
# while this node would not (or the other way round) is found before the
# SuperNode starts. A SuperNode that does not connect is stopped again, and the
# message says why when Flower's logs do (an unregistered key, nothing listening).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
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
connect_timeout=60
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
        --connect-timeout) connect_timeout="$2"; shift ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
    shift
done
[[ -n "$partition_id" && -n "$num_partitions" ]] || usage 2
[[ "$connect_timeout" =~ ^[1-9][0-9]*$ ]] ||
    die "--connect-timeout must be a whole number of seconds > 0, got '$connect_timeout'"
state_dir="$(abspath "$state_dir")"
need_cmd flower-supernode "activate the venv that has flwr (or set FLC_VENV)"

# Defaults from the SuperLink started from this state directory, when there is one.
if [[ -f "$state_dir/superlink.env" ]]; then
    # shellcheck disable=SC1091
    source "$state_dir/superlink.env"
fi
superlink="${superlink:-${SUPERLINK_ADDRESS:-127.0.0.1:9092}}"
insecure="${insecure:-${SUPERLINK_INSECURE:-0}}"
name="${name:-supernode-$partition_id}"
if [[ -z "$port" ]]; then
    [[ "$partition_id" =~ ^[0-9]+$ ]] && port=$((9200 + partition_id)) || port=9200
fi

pidfile="$state_dir/pids/$name.pid"
if [[ -f "$pidfile" ]] && pid_alive "$(cat "$pidfile")"; then
    die "$name is already running (PID $(cat "$pidfile")); run deploy/stop.sh first"
fi

transport="$(superlink_transport "$superlink")"
if ((insecure)) && [[ "$transport" == tls ]]; then
    die "$name not started: the SuperLink at $superlink speaks TLS; pass --root-certificates" \
        "(its CA certificate, ca.crt) and --key (a registered node key) instead of --insecure"
fi
if ((!insecure)) && [[ "$transport" == plain ]]; then
    die "$name not started: the SuperLink at $superlink does not speak TLS (started with" \
        "--insecure); pass --insecure, or restart the SuperLink with TLS"
fi

if ((check)); then
    check_args=(--app "$(abspath "$app")" --num-partitions "$num_partitions"
        --partition-id "$partition_id" --run-config "$run_config")
    [[ -n "$loader" ]] && check_args+=(--loader "$loader")
    "$PYTHON" "$DEPLOY_DIR/check_node.py" "${check_args[@]}" ||
        die "$name not started: its start-up check failed (see above); --run-config" \
            "gives it the data keys of the run you will submit"
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

# Why a SuperNode that got no SuperNode ID was refused, from what Flower logged.
# Flower's SuperNode says only "Failed to activate SuperNode" for an unknown key;
# the reason is in the SuperLink's log, which is here when the SuperLink was
# started from this state directory.
refusal_reason() {
    local superlink_log="$state_dir/logs/superlink.log"
    local said=""
    if [[ "$superlink" == "${SUPERLINK_ADDRESS:-}" && -f "$superlink_log" ]]; then
        said="$(tail -c "+$((superlink_log_size + 1))" "$superlink_log")"
    fi
    if grep -q "Failed to activate SuperNode" "$log"; then
        if grep -q "No SuperNode found with the given public key" <<<"$said"; then
            echo "the SuperLink refused its key (its log: \"No SuperNode found with the given" \
                "public key\"); register $key.pub with deploy/register-nodes.sh"
        elif grep -qE "SuperNode with node ID [0-9]+ could not be activated" <<<"$said"; then
            echo "its key is registered but already in use by a connected SuperNode" \
                "($(grep -oE 'node ID [0-9]+' <<<"$said" | tail -n 1)): every SuperNode needs a" \
                "key pair of its own (deploy/make-node-keys.sh, then deploy/register-nodes.sh)"
        else
            echo "the SuperLink refused to activate it (Flower exit code 305), which it does" \
                "for a public key it does not know: have $key.pub registered" \
                "(deploy/register-nodes.sh; again after every SuperLink restart)"
        fi
    elif [[ "$transport" == none ]]; then
        echo "nothing accepted a connection at $superlink: is the SuperLink running there," \
            "and is its port open?"
    elif grep -q "Connection attempt failed" "$log"; then
        echo "every connection attempt to $superlink failed"
    else
        echo "it did not say why"
    fi
}

mkdir -p "$state_dir/home/$name" "$state_dir/logs"
log="$state_dir/logs/$name.log"
: >"$log"
superlink_log_size="$(stat -c %s "$state_dir/logs/superlink.log" 2>/dev/null || echo 0)"
# Each SuperNode gets its own FLWR_HOME: nodes on one machine would otherwise
# unpack the same FAB into one folder at the same time.
FLWR_HOME="$state_dir/home/$name" launch "$name" "$state_dir" flower-supernode "${args[@]}"
pid=$LAUNCHED_PID
# A refused key ends the process within seconds; a SuperLink that does not
# answer leaves it retrying: either way it is stopped here, never left behind.
if ! wait_for_log "$pid" "$log" "SuperNode ID: [0-9]+" "$connect_timeout"; then
    reason="$(refusal_reason)"
    "$DEPLOY_DIR/stop.sh" --state-dir "$state_dir" --only "$name" >/dev/null ||
        warn "could not stop $name (PID $pid); run deploy/stop.sh --state-dir $state_dir"
    die "$name (PID $pid, stopped) did not connect to $superlink: $reason (log: $log)"
fi
echo "$name PID $pid: $(grep -oE 'SuperNode ID: [0-9]+' "$log" | tail -n 1)" \
    "(log: $log)"
