#!/usr/bin/env bash
# The flwr CLI with this deployment's private Flower config (STATE/flwr-home).
#
#   deploy/flwr.sh [--state-dir DIR] <flwr arguments>
#
# Examples:
#   deploy/flwr.sh run . fl-clusters --stream --run-config "num-rounds=5 min-nodes=4"
#   deploy/flwr.sh supernode ls fl-clusters
#   deploy/flwr.sh ls fl-clusters
# Equivalent to `FLWR_HOME=deploy/.state/flwr-home flwr ...`; the user's own
# ~/.flwr/config.toml is neither read nor changed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

state_dir="$DEFAULT_STATE_DIR"
if [[ "${1:-}" == "--state-dir" ]]; then
    state_dir="$2"
    shift 2
fi
state_dir="$(abspath "$state_dir")"
[[ -f "$state_dir/flwr-home/config.toml" ]] ||
    die "no Flower config in $state_dir/flwr-home; start the SuperLink first (deploy/start.sh)"
need_cmd flwr "activate the venv that has flwr (or set FLC_VENV)"
FLWR_HOME="$state_dir/flwr-home" exec flwr "$@"
