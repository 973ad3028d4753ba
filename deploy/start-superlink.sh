#!/usr/bin/env bash
# Start a Flower SuperLink (deployment runtime, not simulation) in the background,
# behind the Fleet gateway.
#
#   deploy/start-superlink.sh [options]
#
# Options:
#   --state-dir DIR     PIDs, logs, Flower config (default: deploy/.state)
#   --host HOST         address SuperNodes connect to (default 127.0.0.1; 0.0.0.0 for
#                       other machines): the Fleet gateway binds it
#   --port PORT         the gateway's port, the only one SuperNodes need (default 9092)
#   --control-port PORT the SuperLink's own port, on 127.0.0.1 only: Control API (flwr
#                       CLI) and Runtime API (default 9093)
#   --certs DIR         ca.crt, server.pem, server.key (default STATE/certs;
#                       created with make-certs.sh when missing)
#   --san NAME          extra host name or IP for a new server certificate (repeatable)
#   --connection NAME   SuperLink connection name for `flwr run` (default fl-clusters)
#   --insecure          plain HTTP and no SuperNode authentication (loopback tests only)
#
# Secure by default: TLS plus SuperNode authentication (--enable-supernode-auth),
# so only nodes whose public key is registered (deploy/register-nodes.sh) join.
# Flower 1.41 serves the Control API (register node keys, list and submit runs)
# on the same port as the Fleet API, without authentication: the SuperLink
# therefore listens on loopback only, and deploy/fleet_gateway.py forwards just
# the Fleet API from HOST:PORT, so a host that reaches that port can join with a
# registered key and do nothing else. The operator runs the flwr CLI on this
# machine (or through an SSH tunnel to 127.0.0.1:CONTROL_PORT).
# Writes STATE/flwr-home/config.toml with the connection, so that
#   FLWR_HOME=STATE/flwr-home flwr run . fl-clusters     (or deploy/flwr.sh run . fl-clusters)
# submits to this SuperLink without touching ~/.flwr.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

state_dir="$DEFAULT_STATE_DIR"
host="127.0.0.1"
port=9092
control_port=9093
certs=""
sans=()
connection="$DEFAULT_CONNECTION"
insecure=0
while (($#)); do
    case "$1" in
        -h | --help) usage 0 ;;
        --state-dir) state_dir="$2"; shift ;;
        --host) host="$2"; shift ;;
        --port) port="$2"; shift ;;
        --control-port) control_port="$2"; shift ;;
        --certs) certs="$2"; shift ;;
        --san) sans+=("$2"); shift ;;
        --connection) connection="$2"; shift ;;
        --insecure) insecure=1 ;;
        *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
    shift
done
state_dir="$(abspath "$state_dir")"
certs="$(abspath "${certs:-$state_dir/certs}")"
for p in "$port" "$control_port"; do
    [[ "$p" =~ ^[1-9][0-9]*$ ]] || die "ports must be whole numbers, got '$p'"
done
[[ "$port" != "$control_port" ]] || die "--port and --control-port must differ (both $port)"
# What the flwr CLI uses: the SuperLink itself, on loopback.
address="127.0.0.1:$control_port"
# What SuperNodes use: the gateway (a node on this machine reaches it on loopback).
case "$host" in
    0.0.0.0 | "::") fleet_address="127.0.0.1:$port" ;;
    *:*) fleet_address="[$host]:$port" ;;
    *) fleet_address="$host:$port" ;;
esac
need_cmd flower-superlink "activate the venv that has flwr (or set FLC_VENV)"

pidfile="$state_dir/pids/superlink.pid"
if [[ -f "$pidfile" ]] && pid_alive "$(cat "$pidfile")"; then
    die "a SuperLink started from $state_dir is running (PID $(cat "$pidfile")); run deploy/stop.sh first"
fi
mkdir -p "$state_dir/logs" "$state_dir/pids" "$state_dir/home/superlink" "$state_dir/flwr-home"
: >"$state_dir/logs/superlink.log"

args=(--host 127.0.0.1 --port "$control_port" --disable-runtime-dependency-installation)
case "$host" in
    *:*) gateway_args=(--listen "[$host]:$port" --upstream "$address") ;;
    *) gateway_args=(--listen "$host:$port" --upstream "$address") ;;
esac
if ((insecure)); then
    warn "starting the SuperLink with --insecure: no TLS, and ANY SuperNode that reaches"
    warn "port $port can join and receive models. Use it on loopback for tests only."
    args+=(--insecure)
    gateway_args+=(--insecure)
else
    if [[ ! -f "$certs/server.pem" ]]; then
        "$DEPLOY_DIR/make-certs.sh" "$certs" "${sans[@]}"
    fi
    args+=(
        --ssl-ca-certfile "$certs/ca.crt"
        --ssl-certfile "$certs/server.pem"
        --ssl-keyfile "$certs/server.key"
        --enable-supernode-auth
    )
    gateway_args+=(--certfile "$certs/server.pem" --keyfile "$certs/server.key"
        --cafile "$certs/ca.crt")
fi

# The SuperLink's FLWR_HOME receives the FABs its ServerApps unpack; keep it
# private to this deployment like the CLI's.
FLWR_HOME="$state_dir/home/superlink" launch superlink "$state_dir" flower-superlink "${args[@]}"
pid=$LAUNCHED_PID
if ! wait_for_port 127.0.0.1 "$control_port" 60 || ! pid_alive "$pid"; then
    tail -n 25 "$state_dir/logs/superlink.log" >&2 || true
    die "the SuperLink did not come up on $address (log: $state_dir/logs/superlink.log)"
fi
: >"$state_dir/logs/gateway.log"
launch gateway "$state_dir" "$PYTHON" "$DEPLOY_DIR/fleet_gateway.py" "${gateway_args[@]}"
gateway_pid=$LAUNCHED_PID
gateway_host="${fleet_address%:*}"
gateway_host="${gateway_host#[}"
gateway_host="${gateway_host%]}"
if ! wait_for_port "$gateway_host" "$port" 60 || ! pid_alive "$gateway_pid"; then
    tail -n 25 "$state_dir/logs/gateway.log" >&2 || true
    "$DEPLOY_DIR/stop.sh" --state-dir "$state_dir" >/dev/null || true
    die "the Fleet gateway did not come up on $fleet_address (log: $state_dir/logs/gateway.log)"
fi

# Private Flower config: one connection, also the default one.
config="$state_dir/flwr-home/config.toml"
{
    echo "[superlink]"
    echo "default = \"$connection\""
    echo
    echo "[superlink.$connection]"
    echo "address = \"$address\""
    if ((insecure)); then
        echo "insecure = true"
    else
        echo "root-certificates = \"$certs/ca.crt\""
    fi
} >"$config"

# Sourced by start-node.sh and register-nodes.sh: every value quoted for the shell
# (a state folder may hold spaces or quotes).
{
    printf 'SUPERLINK_ADDRESS=%q\n' "$fleet_address"
    printf 'SUPERLINK_CONTROL_ADDRESS=%q\n' "$address"
    printf 'SUPERLINK_INSECURE=%q\n' "$insecure"
    printf 'SUPERLINK_CA=%q\n' "$certs/ca.crt"
    printf 'SUPERLINK_CONNECTION=%q\n' "$connection"
} >"$state_dir/superlink.env"
echo "SuperLink PID $pid on $address (loopback only: Control and Runtime API; log:" \
    "$state_dir/logs/superlink.log)"
echo "Fleet gateway PID $gateway_pid on $host:$port (SuperNodes connect to $fleet_address)"
echo "flwr connection '$connection' in $config"
