"""Parameters declared once: constraint, run-config key and help.

One declaration (:class:`Param`) serves a strategy's constructor argument and a
run-config key alike. A strategy class lists its constructor arguments as
declarations (``params``, see :class:`Declared`); the base class checks every
argument against them in one call (:meth:`Declared.init_params`). fl-clusters'
run config (fl_clusters/config.py) is the keys of these declarations plus its own
declarations of the data, the clients and the run, and docs/generate_strategies.py
writes the documentation and pyproject.toml's keys from them.

A bad value gets one kind of message wherever it came from: the name as the user
wrote it (the argument's for a constructor, the kebab-case key for a run
config), what it must be and what came (``num_clusters must be an int >= 1; got
2.5 (float)``). Python's own coercions are refused: ``True`` is not an int and
``'2'`` is not a number, since either usually means a value that was read or
passed wrongly. A run-config value is converted in one place
(:meth:`Param.run_config_value`): TOML writes whole numbers as ints, so an int is
a float key's value, and a whole float an int key's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from logging import INFO
from numbers import Integral, Real
from typing import Any, ClassVar, Literal, Self

from flwr.common.logger import log

from fl_clusters.strategies.behaviours import Behaviour, behaviour_switches

Kind = Literal["int", "float", "bool", "str"]
# The default of an argument the caller must give (as in inspect.signature).
REQUIRED = inspect.Parameter.empty


class _SameAsDefault:
    """The type of :data:`SAME`: a paper value that is the default itself."""

    def __repr__(self) -> str:
        return "SAME"


# A declaration's paper value when its default is the published algorithm's; its
# own object, so that no other "no value" (REQUIRED, None) can be taken for it.
SAME = _SameAsDefault()


class _NotGiven:
    """The type of :data:`NOT_GIVEN`: the paper gives no value for the parameter."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


# A declaration's paper value when the paper gives none: both presets take the
# default, and docs/paper-fidelity.md says why the library chose it.
NOT_GIVEN = _NotGiven()
PRESETS = ("robust", "paper")


class ParamError(ValueError):
    """A constructor argument that is not what it must be.

    Parameters
    ----------
    name : str
        The argument's name, or the run-config key with ``key``.
    expected : str
        What it must be, in words (``an int >= 1``).
    value : Any
        What was given.
    key : bool (default: False)
        Whether ``name`` is a run-config key (``run-config key 'num-clusters' must be...``).
    """

    def __init__(self, name: str, expected: str, value: Any, *, key: bool = False) -> None:
        label = f"run-config key {name!r}" if key else name
        super().__init__(f"{label} must be {expected}; got {value!r} ({type(value).__name__})")
        self.name = name
        self.expected = expected
        self.value = value


def _bounds(
    low: float | None, high: float | None, above: float | None, below: float | None
) -> str:
    """The allowed range in words: ``>= 1``, ``in [0, 1]``, ``in (0, 1]``..."""
    lower = (f"({above:g}" if above is not None else f"[{low:g}" if low is not None else None)
    upper = (f"{below:g})" if below is not None else f"{high:g}]" if high is not None else None)
    if lower and upper:
        return f" in {lower}, {upper}"
    if lower:
        return f" > {above:g}" if above is not None else f" >= {low:g}"
    if upper:
        return f" < {below:g}" if below is not None else f" <= {high:g}"
    return ""


def check_param(
    name: str,
    value: Any,
    kind: Kind,
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: Sequence[str] | None = None,
    allow_none: bool = False,
) -> Any:
    """Return ``value`` when it is what a constructor argument must be; raise otherwise.

    Parameters
    ----------
    name : str
        The argument's name, as the constructor spells it.
    value : Any
        What the caller passed.
    kind : {"int", "float", "bool", "str"}
        ``"int"``: a whole number (not a bool); ``"float"``: any finite real number
        (an int too, not a bool); ``"bool"``: True or False; ``"str"``: a string,
        one of ``choices`` when given.
    low, high : float | None
        Inclusive bounds of a number.
    above, below : float | None
        Exclusive bounds of a number.
    choices : Sequence[str] | None
        The allowed strings (``kind="str"``).
    allow_none : bool (default: False)
        ``None`` is allowed too (an argument whose ``None`` means "choose for me").

    Returns
    -------
    Any
        ``value`` unchanged.

    Raises
    ------
    ParamError
        A ``ValueError`` naming the argument, what it must be and what was given.
    """
    if allow_none and value is None:
        return value
    if not _fits(value, kind, low, high, above, below, choices):
        raise ParamError(name, expected(kind, low=low, high=high, above=above, below=below,
                                        choices=choices, allow_none=allow_none), value)
    return value


def _fits(
    value: Any, kind: Kind, low: float | None = None, high: float | None = None,
    above: float | None = None, below: float | None = None,
    choices: Sequence[str] | None = None,
) -> bool:
    """Whether ``value`` is of ``kind`` and within the bounds (:func:`check_param`)."""
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str) and (choices is None or value in choices)
    number_type = Integral if kind == "int" else Real
    return bool(
        isinstance(value, number_type) and not isinstance(value, bool)
        and math.isfinite(float(value))  # type: ignore[arg-type]
        and (low is None or value >= low) and (high is None or value <= high)
        and (above is None or value > above) and (below is None or value < below)
    )


def expected(kind: Kind, **constraint: Any) -> str:
    """What an argument must be, in words (``an int >= 1``).

    ``constraint`` holds :func:`check_param`'s keyword arguments.
    """
    if kind == "bool":
        text = "a bool (True or False)"
    elif kind == "str" and constraint.get("choices") is None:
        text = "a string"
    elif kind == "str":
        text = "one of " + ", ".join(repr(c) for c in constraint["choices"])
    else:
        bounds = [constraint.get(side) for side in ("low", "high", "above", "below")]
        text = ("an int" if kind == "int" else "a number") + _bounds(*bounds)
    return text + (" or None" if constraint.get("allow_none") else "")


@dataclass(frozen=True)
class Param:
    """One parameter, declared once: a constructor argument, a run-config key, or both.

    Parameters
    ----------
    name : str
        The argument's name, as the constructor spells it (and the attribute the
        base class sets); a run-config key no constructor takes is named after
        its key.
    default : Any
        Its default, the same as the constructor signature's (``REQUIRED``: none).
    kind : {"int", "float", "bool", "str"}
        What it must be (see :func:`check_param`).
    help : str
        One line for the run-config documentation and pyproject.toml.
    low, high, above, below, choices, allow_none
        The constraint, as :func:`check_param` takes it.
    unset : bool | int | float | str | None
        The run-config value that stands for ``None`` (run configs have no
        ``None``); only with ``allow_none``.
    key : str | None
        Its run-config key (kebab-case, as pyproject.toml and ``--run-config``
        write it); ``None``: the declaring strategy's name and the argument's,
        e.g. ``ifca-init-steps`` for IFCA's ``init_steps``.
    run_config : bool (default: True)
        Whether a run config sets it (``False``: a constructor argument only).
    paper : Any (default: SAME)
        Its value in the algorithm as published, where the default departs from
        it: ``preset="paper"`` takes it (:data:`SAME`: the default is the paper's;
        :data:`NOT_GIVEN`: the paper gives none, and both presets take the default).
    why : str
        Why the default departs from the paper (or, with :data:`NOT_GIVEN`, why
        the library chose it), one sentence for docs/paper-fidelity.md; required
        with ``paper``.
    source : str
        Where the paper's value (or its silence) is: the seed file and section, or
        the paper; required with ``paper``.
    """

    name: str
    default: Any
    kind: Kind
    help: str
    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None
    allow_none: bool = False
    unset: bool | int | float | str | None = None
    key: str | None = None
    run_config: bool = True
    paper: Any = SAME
    why: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.paper is SAME:
            return
        if not self.why or not self.source:
            raise ValueError(f"{self.name}: a default that departs from the paper "
                             f"({self.default!r} against {self.paper!r}) needs its reason "
                             "and its source")
        if self.paper is NOT_GIVEN:
            return
        if self.paper == self.default:
            raise ValueError(f"{self.name}: paper value {self.paper!r} is the default; "
                             "declare no paper value")
        self.check(self.paper)

    def constraint(self) -> dict[str, Any]:
        """The constraint as :func:`check_param`'s keyword arguments."""
        names = ("low", "high", "above", "below", "choices", "allow_none")
        return {name: getattr(self, name) for name in names}

    def check(self, value: Any) -> Any:
        """Return ``value`` when the argument may take it; raise :class:`ParamError` otherwise."""
        return check_param(self.name, value, self.kind, **self.constraint())

    def expected(self) -> str:
        """What the argument must be, in words (``an int >= 1``)."""
        return expected(self.kind, **self.constraint())

    @property
    def config_default(self) -> bool | int | float | str:
        """The run config's default: the default as the key's kind, ``unset`` for ``None``."""
        default = self.unset if self.default is None else self.default
        if default is REQUIRED or default is None or self.key is None:
            raise TypeError(f"parameter {self.name!r} needs a key and a default to be set "
                            "from a run config (or run_config=False)")
        return float(default) if self.kind == "float" else default

    def run_config_value(self, value: Any) -> bool | int | float | str:
        """Return the run-config value ``value`` as the key's kind, or raise :class:`ParamError`.

        TOML writes a whole number as an int: an int is taken for a float key, a
        whole float for an int key; a bool is never a number. A run config has no
        ``None``: ``unset`` stands for it, and is returned as it is.
        """
        converted = value
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            converted = int(value)
        elif self.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            converted = float(value)
        if self.allow_none and _fits(converted, self.kind) and converted == self.unset:
            return converted  # type: ignore[no-any-return]
        if not _fits(converted, self.kind, self.low, self.high, self.above, self.below,
                     self.choices):
            raise ParamError(str(self.key), self.run_config_expected(), value, key=True)
        return converted  # type: ignore[no-any-return]

    def run_config_expected(self) -> str:
        """What the run-config key must be, in words: ``unset`` in the place of ``None``."""
        text = expected(self.kind, **{**self.constraint(), "allow_none": False})
        return f"{text} or {self.unset!r}" if self.allow_none else text

    def with_prefix(self, prefix: str | None) -> Param:
        """This declaration with its key derived from ``prefix`` (a strategy's name) if unset."""
        if self.key is not None or not self.run_config:
            return self
        dashed = self.name.replace("_", "-")
        return replace(self, key=f"{prefix}-{dashed}" if prefix else dashed)


def check_params(
    owner: str, params: Iterable[Param], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Every declared argument's value: ``given``'s, checked, or the default.

    Parameters
    ----------
    owner : str
        The class being built, for the messages.
    params : Iterable[Param]
        Its declarations.
    given : Mapping[str, Any]
        The arguments the caller passed.

    Raises
    ------
    TypeError
        For an argument the class does not declare, or a required one not given
        (Python's own messages for a call).
    ParamError
        For a value its declaration refuses.
    """
    declared = {param.name: param for param in params}
    unexpected = sorted(set(given) - set(declared))
    if unexpected:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unexpected[0]!r}")
    values = {}
    for name, param in declared.items():
        if name in given:
            values[name] = param.check(given[name])
        elif param.default is REQUIRED:
            raise TypeError(f"{owner}() missing required argument: {name!r}")
        else:
            values[name] = param.default
    return values


def check_signature(cls: type, params: Iterable[Param]) -> None:
    """Refuse declarations that ``cls.__init__``'s signature does not take with the same default.

    The default is written twice (the signature, for Python and readers, and the
    declaration, for the run config and the docs): a class that lets them differ
    fails when it is defined, not in a run.
    """
    signature = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    forwards = any(arg.kind is arg.VAR_KEYWORD for arg in signature.values())
    for param in params:
        argument = signature.get(param.name)
        if argument is None and forwards:
            continue  # passed on in **kwargs to the base, which checks it
        if argument is None:
            raise TypeError(f"{cls.__name__} declares {param.name!r}, which its __init__ lacks")
        if argument.default != param.default or type(argument.default) is not type(param.default):
            raise TypeError(
                f"{cls.__name__}.__init__ gives {param.name!r} the default "
                f"{argument.default!r}; its declaration says {param.default!r}"
            )


# Arguments that several strategies take, declared once. Keys that fl-clusters'
# run config shares with its data and FedAvg (fraction-train, fraction-evaluate,
# seed, min-nodes, num-clusters) are named explicitly; the run config defines them.
FRACTION_TRAIN = Param("fraction_train", 1.0, "float", "clients sampled a round",
                       low=0.0, high=1.0, key="fraction-train")
FRACTION_EVALUATE = Param(
    "fraction_evaluate", 1.0, "float",
    "clients evaluated a round (the last round evaluates every client; 0 = none)",
    low=0.0, high=1.0, key="fraction-evaluate",
)
MIN_AVAILABLE_NODES = Param(
    "min_available_nodes", 2, "int", "the fewest connected nodes a round needs", low=1,
    key="min-nodes",
)
MAX_FAILED_ROUNDS = Param(
    "max_failed_rounds", 3, "int",
    "stop the run after this many training rounds in a row without a valid reply", low=1,
    key="max-failed-rounds",
)
SEED = Param("seed", 0, "int", "seed of data partition, init and sampling", low=0, key="seed")
# AWCFL and MCFL (Li and Yan 2023) apply to every strategy that puts each node
# in one cluster.
INTER_CLUSTER = (
    Param("awcfl_beta", 0.0, "float", "AWCFL inter-cluster mixing", low=0.0, high=1.0,
          key="awcfl-beta"),
    Param("mcfl", False, "bool", "MCFL: clients pick a cluster model by feature mean",
          key="mcfl"),
    Param("mcfl_feature_samples", 32, "int", "MCFL inputs averaged per client", low=1,
          key="mcfl-feature-samples"),
)


def num_clusters_param(default: Any, low: int = 1) -> Param:
    """The ``num_clusters`` argument (run-config key ``num-clusters``) with its default."""
    return Param("num_clusters", default, "int",
                 "k, the number of cluster models (a mixture's components)", low=low,
                 key="num-clusters")


class Declared:
    """A class whose constructor arguments are declared (``params``), registered by ``name``.

    A subclass's own ``params`` get their run-config keys (prefixed by its
    ``name``) and are checked against its ``__init__`` signature when the class
    is defined; a subclass with a ``name`` of its own enters ``registry``.
    """

    # The run config's `strategy` value that builds it (None: not buildable so).
    name: ClassVar[str | None] = None
    # Where the algorithm comes from, for docs/strategies.md.
    paper: ClassVar[str] = ""
    # The source every default not declared as departing was checked against (the
    # paper's section, or its settings as cited); "": not checked, and
    # docs/paper-fidelity.md claims no fidelity for them.
    defaults_checked_against: ClassVar[str] = ""
    # Its own arguments; a subclass takes its bases' too (declared_params).
    params: ClassVar[tuple[Param, ...]] = ()
    # Its own rules that depart from the paper; a subclass follows its bases' too
    # (declared_behaviours).
    behaviours: ClassVar[tuple[Behaviour, ...]] = ()
    # What preset="paper" computes under the class's own declarations, counted: 1
    # at first, one more with every change to it (a paper value, a switched rule),
    # so that a sweep run recorded before the change is stale
    # (fl_clusters.sweep.cells.Cell.changed_settings); tests/test_presets.py holds
    # each class's digest of those declarations and fails when they change alone.
    # Read from the class itself, never inherited (paper_revision_for).
    paper_revision: ClassVar[int] = 1
    # The run-config key whose value must be true (a nonzero number, True) for the
    # class's paper rules to change a run: "" for every run; "mcfl" for an option
    # whose rules apply only when it is on.
    paper_rules_apply_with: ClassVar[str] = ""
    # Every class with a name, by name (a subclass hierarchy may keep its own).
    registry: ClassVar[dict[str, type]] = {}
    # The arguments the caller named, set before ``__init__`` runs (see ``__new__``).
    user_arguments: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_name = vars(cls).get("name")
        if "params" in vars(cls):
            check_signature(cls, cls.params)
            cls.params = tuple(param.with_prefix(own_name) for param in cls.params)
        if own_name:
            taken = cls.registry.get(own_name)
            if taken is not None and taken.__qualname__ != cls.__qualname__:
                raise ValueError(f"strategy name {own_name!r} is taken by {taken.__qualname__}")
            cls.registry[own_name] = cls

    @classmethod
    def declared_params(cls) -> tuple[Param, ...]:
        """Every argument the class takes: its own declarations first, then its bases'."""
        return _along_mro(cls, "params")

    @classmethod
    def paper_revision_for(cls, settings: Mapping[str, Any]) -> int:
        """What ``preset="paper"`` computes for a run with run config ``settings``, counted.

        1, plus each class's own revisions past 1 (``paper_revision``) along the
        class and its bases, of those whose rules apply to the run
        (``paper_rules_apply_with``): a change to any of them raises it, and one
        to an option the run leaves off does not.
        """
        revision = 1
        for klass in cls.__mro__:
            own = vars(klass)
            applies_with = own.get("paper_rules_apply_with", "")
            if not applies_with or settings.get(applies_with):
                revision += own.get("paper_revision", 1) - 1
        return revision

    @classmethod
    def declared_behaviours(cls) -> tuple[Behaviour, ...]:
        """Every rule the class follows apart from the paper: its own first, then its bases'."""
        return _along_mro(cls, "behaviours")

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        """Record the arguments the caller named (``user_arguments``): a preset keeps them.

        Only here are they known: each ``__init__`` passes every argument on to
        its base's, defaults included.
        """
        instance = super().__new__(cls)
        positional = [arg.name for arg in inspect.signature(cls.__init__).parameters.values()
                      if arg.kind in (arg.POSITIONAL_ONLY, arg.POSITIONAL_OR_KEYWORD)][1:]
        instance.user_arguments = frozenset(kwargs) | frozenset(positional[:len(args)])
        return instance

    @classmethod
    def built_with(cls, arguments: Mapping[str, Any], user_arguments: Collection[str]) -> Self:
        """``cls(**arguments)``, of which only ``user_arguments`` count as the caller's.

        For a caller that passes every argument, such as a run config with every
        key filled in: a preset then keeps only the arguments it names.
        """
        instance = cls.__new__(cls, **{name: arguments[name] for name in user_arguments})
        instance.__init__(**arguments)  # type: ignore[misc]
        return instance

    def init_params(self, given: Mapping[str, Any], defaults: Iterable[Param] = ()) -> None:
        """In ``__init__``: check ``given`` against the declarations, set every declared argument.

        ``defaults``: undeclared arguments to set to their default too (attributes
        the base class's methods read in every subclass). Under ``preset="paper"``
        every argument the caller did not name (``user_arguments``) takes the
        paper's value (``preset_changes``); one the caller named is kept, and
        recorded with the paper's value where the two differ (``preset_kept``).
        Every switched behaviour (``behaviours``) is set too: False, the paper's
        rule, under ``preset="paper"`` (``preset_rules`` names them).
        """
        values = {param.name: param.default for param in defaults}
        values |= check_params(type(self).__name__, self.declared_params(), given)
        paper = paper_values(self.declared_params()) if values.get("preset") == "paper" else {}
        self.preset_changes = {name: value for name, value in paper.items()
                               if name not in self.user_arguments}
        self.preset_kept = {name: {"value": values[name], "paper": value}
                            for name, value in paper.items()
                            if name in self.user_arguments and values[name] != value}
        if self.preset_kept:
            log(INFO, "%s: preset 'paper' keeps the arguments given (%s)", type(self).__name__,
                ", ".join(f"{name}={kept['value']!r}, the paper's {kept['paper']!r}"
                          for name, kept in self.preset_kept.items()))
        values |= self.preset_changes
        switches = behaviour_switches(self.declared_behaviours(), values.get("preset", "robust"))
        self.preset_rules = sorted(name for name, robust in switches.items() if not robust)
        for argument, value in (values | switches).items():
            setattr(self, argument, value)


def _along_mro(cls: type, attribute: str) -> tuple[Any, ...]:
    """The declarations in ``attribute`` of ``cls`` and its bases, the first of each name."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        for declaration in vars(klass).get(attribute, ()):
            found.setdefault(declaration.name, declaration)
    return tuple(found.values())


def paper_values(params: Iterable[Param]) -> dict[str, Any]:
    """The paper's value of every argument whose default departs from it."""
    return {param.name: param.paper for param in params if departs(param)}


def departs(param: Param) -> bool:
    """Whether ``param`` has a paper value apart from its default (``preset="paper"`` sets it)."""
    return param.paper is not SAME and param.paper is not NOT_GIVEN


PRESET = Param(
    "preset", "robust", "str",
    "'robust' defaults, or 'paper': the algorithm as published (docs/paper-fidelity.md)",
    choices=PRESETS, key="preset",
)
