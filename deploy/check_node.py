"""Start-up check of a SuperNode's data partition, run before the SuperNode starts.

A SuperNode only learns which data it serves when the first message of a run
reaches its ClientApp; a wrong ``partition-id`` or a data set that is missing on
that machine would then surface as a client error in round 1 (or later, in a
strategy's query round), far from its cause. ``deploy/start-node.sh`` and
``deploy/start.sh`` run this script first and refuse to start the node when it
fails, with a message that names the node config and the reason.

It loads the partition exactly as the ClientApp will: the app's run config
(``[tool.flwr.app.config]`` of its pyproject.toml, fused with ``--run-config``
overrides the same way ``flwr run`` does) and the node config ``partition-id`` /
``num-partitions``, through a loader function of the app
(``fl_clusters.client.node_data:client_data_for`` for fl-clusters).

Examples
--------
    python deploy/check_node.py --num-partitions 3 --partition-id 0 1 2
    python deploy/check_node.py --app examples/two-groups \\
        --loader two_groups.client_app:learner_fn --num-partitions 4 --partition-id 3
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOADER = "fl_clusters.client.node_data:client_data_for"


class NodeCheckError(Exception):
    """A partition this node cannot serve; the message says why."""


def split_sizes(data: Any) -> tuple[int, int] | None:
    """Number of training and test samples in what a loader returned.

    Understands :class:`fl_clusters.learner.TorchLearner` (``num_examples``) and
    anything with ``x_train``/``x_test`` (``fl_clusters.data.ClientData``).
    Returns ``None`` for other objects, which are then only required to load.
    """
    if hasattr(data, "num_examples"):
        return int(data.num_examples("train")), int(data.num_examples("test"))
    if hasattr(data, "x_train") and hasattr(data, "x_test"):
        return len(data.x_train), len(data.x_test)
    return None


def validate_partition(partition_id: Any, num_partitions: Any) -> tuple[int, int]:
    """Check the node config values themselves, whatever the app.

    Parameters
    ----------
    partition_id, num_partitions : Any
        Values as they will appear in the SuperNode's ``--node-config``.

    Returns
    -------
    tuple[int, int]
        The values as integers.

    Raises
    ------
    NodeCheckError
        If either is not an integer or ``partition-id`` is outside
        ``[0, num-partitions - 1]``.
    """
    try:
        pid, num = int(partition_id), int(num_partitions)
    except (TypeError, ValueError):
        raise NodeCheckError(
            f"'partition-id'={partition_id!r} and 'num-partitions'={num_partitions!r} "
            "must both be integers"
        ) from None
    if num < 1:
        raise NodeCheckError(f"'num-partitions'={num} must be at least 1")
    if not 0 <= pid < num:
        raise NodeCheckError(
            f"'partition-id'={pid} is outside [0, {num - 1}] for 'num-partitions'={num}"
        )
    return pid, num


def load_loader(spec: str, app_dir: Path) -> Callable[[Any], Any]:
    """Import ``module:function`` with the app's folder first on ``sys.path``.

    Flower does the same when it loads a ClientApp from an unpacked FAB, so the
    check imports the app's code, not some other installed copy.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--loader must look like 'package.module:function', got {spec!r}")
    sys.path.insert(0, str(app_dir))
    return getattr(importlib.import_module(module_name), attr)


def run_config_for(app_dir: Path, overrides: str) -> dict[str, Any]:
    """The run config the ClientApp will see: pyproject defaults plus overrides."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    override = parse_config_args([overrides]) if overrides.strip() else {}
    try:
        return dict(get_fused_config_from_dir(app_dir, override))
    except ValueError as err:
        # fuse_dicts refuses keys the app does not declare, like `flwr run` does.
        raise NodeCheckError(f"--run-config {overrides!r}: {err}") from None


def check_partition(
    loader: Callable[[Any], Any],
    run_config: dict[str, Any],
    partition_id: Any,
    num_partitions: Any,
) -> str:
    """Load one partition the way the ClientApp will; return a one-line summary.

    Raises
    ------
    NodeCheckError
        If the node config is invalid, the loader fails, or a split is empty.
    """
    from flwr.app import Context, RecordDict

    pid, num = validate_partition(partition_id, num_partitions)
    context = Context(
        run_id=0,
        node_id=0,
        node_config={"partition-id": pid, "num-partitions": num},
        state=RecordDict(),
        run_config=run_config,
    )
    try:
        data = loader(context)
    except Exception as err:  # any loader failure is what we are here to report
        raise NodeCheckError(
            f"loading its data failed: {type(err).__name__}: {err}"
        ) from err
    sizes = split_sizes(data)
    if sizes is None:
        return "data loaded"
    n_train, n_test = sizes
    if n_train == 0 or n_test == 0:
        raise NodeCheckError(
            f"its partition is empty ({n_train} training, {n_test} test samples); "
            "lower 'num-partitions' or check the data set"
        )
    return f"{n_train} training / {n_test} test samples"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--app", type=Path, default=REPO_ROOT,
                        help="Flower app folder (its pyproject.toml gives the run config)")
    parser.add_argument("--loader", default=DEFAULT_LOADER,
                        help="module:function(context) that loads a node's data")
    parser.add_argument("--run-config", default="",
                        help="run-config overrides, as for `flwr run --run-config`")
    parser.add_argument("--num-partitions", required=True,
                        help="the SuperNodes' node config 'num-partitions'")
    parser.add_argument("--partition-id", nargs="+", required=True,
                        help="one or more node config 'partition-id' values")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Check every given partition; print one line each; 1 if any fails."""
    args = parse_args(argv)
    app_dir = args.app.resolve()
    failed = 0
    try:
        run_config = run_config_for(app_dir, args.run_config)
    except NodeCheckError as err:
        print(f"check_node: FAILED: {err}", file=sys.stderr)
        return 1
    try:
        loader = load_loader(args.loader, app_dir)
    except (ImportError, AttributeError) as err:
        print(f"check_node: FAILED: cannot load --loader {args.loader!r} from {app_dir}: "
              f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    for partition_id in args.partition_id:
        node = f"partition-id={partition_id} num-partitions={args.num_partitions}"
        try:
            summary = check_partition(loader, run_config, partition_id, args.num_partitions)
        except NodeCheckError as err:
            failed += 1
            print(f"check_node: SuperNode with node config '{node}' cannot start: {err}",
                  file=sys.stderr)
            continue
        print(f"check_node: {node}: ok ({summary})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
