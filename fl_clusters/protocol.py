"""The message protocol between fl-clusters strategies and ClientApps.

Everything a compatible ClientApp in another stack needs is named here and in
docs/protocol.md: message types, record keys and config keys.

Several cluster models travel in ONE ArrayRecord whose keys carry a prefix:
``"cluster-<j>/<param>"`` for cluster j's own arrays and ``"shared/<param>"`` for
arrays every cluster shares (IFCA weight sharing). The same packing is what
``Strategy.start`` passes between rounds, so ``result.arrays`` holds every cluster.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import BinaryIO

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord

# Record keys inside a message's RecordDict.
ARRAYS = "arrays"  # one model (Flower's FedAvg uses the same key)
CLUSTERS = "clusters"  # several packed cluster models
CONFIG = "config"
METRICS = "metrics"
CENTERS = "centers"  # FedSoft: proximal centres, packed like CLUSTERS

# Message types (Flower's "<type>.<action>" form).
TRAIN = "train"
EVALUATE = "evaluate"
QUERY_REPORT = "query.report"
QUERY_SAMPLE_ASSIGNMENT = "query.sample_assignment"
QUERY_FEATURES = "query.features"
QUERY_CLUSTER_LOSSES = "query.cluster_losses"
QUERY_IDENTITY = "query.identity"  # start-up handshake: the node's stable key
QUERY_STATE = "query.state"  # checkpoint: what the node keeps between rounds
QUERY_RESTORE = "query.restore"  # resume: the kept state, sent back
# A query a strategy declares itself (its class's client_queries), named by the
# config key CFG_QUERY: Flower's ClientApp routes only the actions registered when
# the app is built, so every strategy's own queries share this one type.
QUERY_STRATEGY = "query.strategy"
# Every query a server may send: a ClientApp registers one handler for each
# (fl_clusters.client.queries.QUERIES maps them to the handlers).
QUERY_TYPES = (
    QUERY_REPORT,
    QUERY_SAMPLE_ASSIGNMENT,
    QUERY_CLUSTER_LOSSES,
    QUERY_FEATURES,
    QUERY_IDENTITY,
    QUERY_STATE,
    QUERY_RESTORE,
    QUERY_STRATEGY,
)

# Config keys sent by the server.
CFG_ROUND = "server-round"
CFG_LR = "lr"
CFG_EPOCHS = "local-epochs"
CFG_STEPS = "local-steps"
CFG_BATCH = "batch-size"
CFG_OPTIMIZER = "optimizer"
# The built-in learner's optimizers (fl_clusters.learner.optimizer_for).
OPTIMIZERS = ("sgd", "sgd-momentum", "adam")
CFG_PROX_MU = "proximal-mu"  # Flower's FedProx key
CFG_RETURN = "return"  # "model" (default) or "gradient"
CFG_PERSISTENT = "persistent-local"  # train the node's own kept model
CFG_CENTER_WEIGHTS = "center-weights"  # FedSoft u_k per centre
CFG_ASSIGNED = "assigned-cluster"  # -1 = choose by training loss
CFG_SPLIT = "split"  # "test" (default) or "validation"
CFG_NUM_SAMPLES = "num-samples"
CFG_MCFL_CLUSTERS = "mcfl-clusters"  # MCFL: clusters that have a feature
CFG_MCFL_FEATURES = "mcfl-features"  # MCFL: their features, row-major
CFG_RESTART_SEEDS = "restart-seeds"  # IFCA restarts: one seed per candidate
CFG_NUM_CLUSTERS = "num-clusters"  # IFCA restarts: models per candidate
CFG_HEAD_LAYERS = "head-layers"  # IFCA restarts: layers drawn (0 = all)
CFG_MIXTURE = "mixture"  # FedEM: the clusters are the node's mixture components
CFG_MIXTURE_REFIT = "mixture-refit"  # FedEM: refit pi to the components every round
CFG_MIXTURE_FULL_STEPS = "mixture-full-steps"  # FedEM: M-step losses at full step size
CFG_QUERY = "query"  # query.strategy: the name of the strategy's query asked

# Metric keys returned by clients.
M_NUM_EXAMPLES = "num-examples"
M_TRAIN_LOSS = "train-loss"
M_CLUSTER = "cluster-id"
M_LOSS = "loss"
M_ACCURACY = "accuracy"
M_FEATURE_MEAN = "feature-mean"  # MCFL: mean of n sampled training inputs
M_CLUSTER_LOSSES = "cluster-losses"  # mean training loss of every cluster model
M_COUNTS = "counts"  # FedSoft: training samples each cluster model fits best
M_NODE_KEY = "node-key"  # identity: partition-id, else a hash of the node config
M_MIXTURE_WEIGHTS = "mixture-weights"  # FedEM: the node's pi, one per component
# Optimizer steps the node's training actually took: a user's own train() runs its
# own loop whatever local-steps asked, and the server logs what was done.
M_STEPS_DONE = "local-steps-done"
# The same in passes over the node's training data: ACFL chains train messages until a
# node's local-only model has trained the epochs it asked for.
M_EPOCHS_DONE = "local-epochs-done"
# identity, optional: the node's ground-truth group, for progress lines only (no
# strategy reads it)
M_TRUE_GROUP = "true-cluster"
# identity, optional: the node config's partition-id, which names the node in the
# server's log (node ids are random per run)
M_PARTITION_ID = "partition-id"
# evaluate and report, only in a simulation whose run config has attack='backdoor':
# the share of the node's non-target test inputs that the model predicts as the
# backdoor's target once the trigger is stamped on them (fl_clusters.attacks). No
# strategy reads it; Flower's FedAvg averages it into the round's metrics.
M_BACKDOOR_SUCCESS = "backdoor-success"
# identity, optional: a config record whose "message" says why the node cannot take
# part (its data set is missing...); the node still answers, so the server can tell
# this from an app that lacks the handler. Its "every-node" is true when every node
# of the federation has the same reason (fl_clusters.errors.FederationProblem).
STARTUP_PROBLEM = "startup-problem"
EVERY_NODE = "every-node"


@dataclass(frozen=True)
class MetricField:
    """What one metric of a client's reply must be for a strategy to read it.

    Parameters
    ----------
    length : int | None
        ``None``: a single number. Otherwise a list of exactly ``length`` numbers.
    low, high : float
        Inclusive bounds of every value.
    integer : bool
        Every value must be a whole number (a cluster id, a count).
    required : bool
        A reply without the metric is rejected; an optional one is checked when present.
    infinite : bool
        +Inf is a value too: the loss of a diverged model (:func:`reported_loss`).
        NaN never is.
    """

    length: int | None = None
    low: float = -math.inf
    high: float = math.inf
    integer: bool = False
    required: bool = True
    infinite: bool = False


def reported_loss(mean: float) -> float:
    """The mean loss a node reports for a model: +Inf for a diverged model (NaN or Inf),
    so that a choice by lowest loss passes it over and the report keeps its other
    numbers (a model an attacker blew up must not void every node's report)."""
    return float(mean) if math.isfinite(mean) else math.inf


# Fields of a training reply that every strategy reads.
TRAIN_FIELDS: Mapping[str, MetricField] = {
    M_TRAIN_LOSS: MetricField(),
    M_STEPS_DONE: MetricField(integer=True, low=0.0, required=False),
    M_EPOCHS_DONE: MetricField(low=0.0, required=False),
}
# Fields of an evaluate reply; its optional cluster-id is bounded by the models the
# message offered (:func:`evaluate_fields`).
EVALUATE_FIELDS: Mapping[str, MetricField] = {
    M_ACCURACY: MetricField(low=0.0, high=1.0),
    M_LOSS: MetricField(),
}

# The most examples one reply may weigh. The server cannot know a client's data size,
# so the bound is a fixed ceiling: far above any one node's data set, yet 2**22
# replies of it still sum to less than 2**53, where float64 counts stay exact and an
# example-weighted average cannot overflow. It does not stop one node claiming the
# ceiling from taking over its cluster's average: that needs robust aggregation.
MAX_NUM_EXAMPLES = 2**31 - 1


def cluster_id_field(num_clusters: int) -> MetricField:
    """The optional ``cluster-id`` of a reply to a message offering ``num_clusters`` models."""
    return MetricField(integer=True, low=0.0, high=num_clusters - 1.0, required=False)


def evaluate_fields(num_clusters: int) -> dict[str, MetricField]:
    """:data:`EVALUATE_FIELDS` with the ``cluster-id`` of ``num_clusters`` offered models."""
    return {**EVALUATE_FIELDS, M_CLUSTER: cluster_id_field(num_clusters)}


def check_metrics(metrics: MetricRecord, fields: Mapping[str, MetricField]) -> str | None:
    """Return why a reply's metrics cannot be read, or ``None`` when they can.

    ``num-examples`` (a whole number in [1, :data:`MAX_NUM_EXAMPLES`]: it weights
    averages) is always checked; ``fields`` names the others the caller reads.
    Values must be finite: one NaN or Inf would poison every average and ``int()``
    of a cluster id raises on it.
    """
    problem = _num_examples_problem(metrics)
    for name, field in fields.items():
        if problem is not None:
            break
        problem = field_problem(metrics, name, field)
    return problem


def _num_examples_problem(metrics: MetricRecord) -> str | None:
    """Why a reply's ``num-examples`` cannot weight an average, or ``None``."""
    problem = field_problem(metrics, M_NUM_EXAMPLES, MetricField(integer=True))
    if problem is not None:
        return problem
    value = float(metrics[M_NUM_EXAMPLES])  # type: ignore[arg-type]
    if not value > 0:
        return f"'{M_NUM_EXAMPLES}' is {metrics[M_NUM_EXAMPLES]}, must be > 0"
    if value > MAX_NUM_EXAMPLES:
        return (f"'{M_NUM_EXAMPLES}' is {metrics[M_NUM_EXAMPLES]}, above the "
                f"{MAX_NUM_EXAMPLES} one reply may claim (protocol.MAX_NUM_EXAMPLES)")
    return None


def field_problem(metrics: MetricRecord, name: str, field: MetricField) -> str | None:
    """Return why ``metrics[name]`` is not what ``field`` describes, or ``None``."""
    if name not in metrics:
        return f"no '{name}' metric" if field.required else None
    value = metrics[name]
    if field.length is None:
        if isinstance(value, list):
            return f"'{name}' is a list, expected one number"
        values = np.array([value], dtype=np.float64)
    else:
        if not isinstance(value, list) or len(value) != field.length:
            got = f"{len(value)} values" if isinstance(value, list) else "one number"
            return f"'{name}' must hold {field.length} numbers, got {got}"
        values = np.asarray(value, dtype=np.float64)
    allowed = np.isfinite(values) | (field.infinite & (values == math.inf))
    if not np.all(allowed):
        return f"'{name}' holds NaN or {'-Inf' if field.infinite else 'Inf'}"
    if field.integer and not np.all(values == np.round(values)):
        return f"'{name}' must hold whole numbers, got {value}"
    if np.any(values < field.low) or np.any(values > field.high):
        return f"'{name}' = {value} is outside [{_bound(field.low)}, {_bound(field.high)}]"
    return None


def _bound(value: float) -> str:
    """A field's bound as the log shows it: whole bounds in full (2147483647, not 2.15e+09)."""
    return str(int(value)) if math.isfinite(value) and value == round(value) else f"{value:g}"


SHARED_PREFIX = "shared/"
_CLUSTER_KEY = re.compile(r"^cluster-(\d+)/(.+)$")


def query_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a strategy's client query, or ``None`` when it can.

    A name follows Flower's rule for action names (a Python identifier), so that a
    query could as well have a message type of its own (``query.<name>``).
    """
    if not isinstance(name, str):
        return f"a client query's name must be a string, got {type(name).__name__}"
    if not name.isidentifier():
        return (f"client query name {name!r} is not a Python identifier (letters, digits "
                "and underscores, not starting with a digit), as Flower's action names are")
    return None


def action_of(message_type: str) -> str:
    """The action a ClientApp registers ``message_type`` under ("query.report" -> "report")."""
    return message_type.partition(".")[2]


def cluster_prefix(cluster: int) -> str:
    """Return the key prefix of cluster ``cluster``'s own arrays."""
    return f"cluster-{cluster}/"


def pack_clusters(
    models: Sequence[ArrayRecord], shared: ArrayRecord | None = None
) -> ArrayRecord:
    """Pack cluster models (and optional shared arrays) into one ArrayRecord.

    Parameters
    ----------
    models : Sequence[ArrayRecord]
        Each cluster's own arrays, in cluster order.
    shared : ArrayRecord | None
        Arrays common to every cluster (the body under IFCA weight sharing).
    """
    packed = ArrayRecord()
    for name, array in (shared or {}).items():
        packed[SHARED_PREFIX + name] = array
    for j, model in enumerate(models):
        for name, array in model.items():
            packed[cluster_prefix(j) + name] = array
    return packed


def is_packed(record: ArrayRecord) -> bool:
    """Whether ``record`` holds packed cluster models rather than one plain model."""
    return any(_CLUSTER_KEY.match(key) for key in record)


def num_packed_clusters(record: ArrayRecord) -> int:
    """Number of clusters in a packed record (1 for a plain model)."""
    ids = {int(m.group(1)) for key in record if (m := _CLUSTER_KEY.match(key))}
    return max(ids) + 1 if ids else 1


def unpack_clusters(record: ArrayRecord) -> list[ArrayRecord]:
    """Return every cluster's full model (shared arrays plus its own), in cluster order.

    A plain (unpacked) record is returned as the only cluster, so a FedAvg result
    goes through the same code as a clustered one.
    """
    if not is_packed(record):
        return [record]
    shared = {k[len(SHARED_PREFIX):]: v for k, v in record.items() if k.startswith(SHARED_PREFIX)}
    models: list[ArrayRecord] = []
    for j in range(num_packed_clusters(record)):
        prefix = cluster_prefix(j)
        own = {k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)}
        model = ArrayRecord()
        for name, array in {**shared, **own}.items():
            model[name] = array
        models.append(model)
    return models


def split_shared(model: ArrayRecord, head_keys: Sequence[str]) -> tuple[ArrayRecord, ArrayRecord]:
    """Split one model into (shared body, clustered head) by parameter name."""
    body, head = ArrayRecord(), ArrayRecord()
    for name, array in model.items():
        (head if name in head_keys else body)[name] = array
    return body, head


def record_to_numpy(record: ArrayRecord) -> list[np.ndarray]:
    """Arrays of a record as numpy arrays, in key order."""
    return [array.numpy() for array in record.values()]


def numpy_to_record(names: Sequence[str], arrays: Sequence[np.ndarray]) -> ArrayRecord:
    """Build an ArrayRecord from names and numpy arrays (same order)."""
    if len(names) != len(arrays):
        raise ValueError(f"{len(names)} names for {len(arrays)} arrays")
    record = ArrayRecord()
    for name, array in zip(names, arrays, strict=True):
        record[name] = Array(np.ascontiguousarray(array))
    return record


def check_model_reply(record: ArrayRecord, reference: ArrayRecord) -> str | None:
    """Return why a client's model cannot be aggregated, or ``None`` when it can.

    A reply must hold exactly the reference's keys (in any order), each with the
    dtype and shape of the array sent, and only finite values: one NaN would poison
    every cluster model it is averaged into, and a complex or integer array where a
    float one was sent would change what the average is.
    """
    if set(record.keys()) != set(reference.keys()):
        missing = sorted(set(reference) - set(record))
        extra = sorted(set(record) - set(reference))
        return f"keys differ from the model sent (missing {missing[:3]}, extra {extra[:3]})"
    for name, array in record.items():
        problem = _array_problem(name, array, reference[name])
        if problem is not None:
            return problem
    return None


def _array_problem(name: str, array: Array, sent: Array) -> str | None:
    """Why one array of a reply cannot stand for the array ``sent``, or ``None``.

    The declared dtype and shape are compared first (strings, no decoding). The
    bytes carry a dtype and shape of their own, which a reply may declare falsely,
    so their .npy header is read before the data: a header claiming a huge shape is
    refused before numpy allocates it, and the data are decoded once.
    """
    if array.dtype != sent.dtype:
        return f"array '{name}' has dtype {array.dtype}, expected {sent.dtype} as sent"
    expected = (sent.dtype, tuple(sent.shape))
    if tuple(array.shape) != expected[1]:
        return f"array '{name}' has shape {tuple(array.shape)}, expected {expected[1]}"
    stream = BytesIO(array.data)
    try:
        shape, dtype = read_npy_header(stream)
        stored = (str(dtype), shape)
        if stored != expected:
            return (f"array '{name}' declares {expected[0]} {expected[1]} but its data "
                    f"hold {stored[0]} {stored[1]}")
        stream.seek(0)
        values = np.load(stream, allow_pickle=False)
    except (ValueError, EOFError, OSError) as error:
        return f"array '{name}' holds no readable .npy data ({error})"
    if values.dtype.kind in "fc" and not np.all(np.isfinite(values)):
        return f"array '{name}' holds NaN or Inf values"
    return None


def read_npy_header(stream: BinaryIO) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npy stream's header declares, the stream left at the data.

    Only the versions ``np.save`` writes for arrays (1.0, 2.0) are read: any other,
    or no header at all, raises ``ValueError``. Nothing is allocated for the data, so
    a header may be checked against what its bytes can hold before they are read
    (client replies here, checkpoints in :mod:`fl_clusters.checkpoint_archive`).
    """
    version = np.lib.format.read_magic(stream)
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f".npy version {version} is not one np.save writes for arrays")
    shape, _, dtype = readers[version](stream)
    return tuple(shape), dtype


def head_keys(model: ArrayRecord, head_layers: int) -> list[str]:
    """Names of the arrays of the last ``head_layers`` layers (a layer = a name prefix)."""
    layers: list[str] = []
    for name in model:
        layer = name.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    if head_layers > len(layers):
        raise ValueError(
            f"head_layers={head_layers} but the model has only {len(layers)} layers {layers}"
        )
    chosen = set(layers[len(layers) - head_layers:])
    return [name for name in model if name.rsplit(".", 1)[0] in chosen]
