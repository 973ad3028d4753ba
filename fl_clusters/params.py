"""Parameters declared once: constraint, run-config key and help.

One declaration (:class:`Param`) serves a strategy's constructor argument and a
run-config key alike; the clustering estimators check their arguments with the
same declarations (:data:`fl_clusters.clustering.hierarchical.HIERARCHY_PARAMS`),
so every refusal reads the same. A strategy class lists its constructor arguments as
declarations (``params``, see :class:`~fl_clusters.strategies.kit.presets.Declared`);
the base class checks every argument against them in one call
(:func:`check_params`). fl-clusters' run config (fl_clusters/config.py) is the
keys of these declarations plus its own declarations of the data, the clients
and the run, and docs/generate_strategies.py writes the documentation and
pyproject.toml's keys from them. The declarations several strategies share are
in :mod:`fl_clusters.strategies.kit.shared_params`.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any, Literal

Kind = Literal["int", "float", "bool", "str", "object"]
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


def _number(value: float) -> str:
    """A bound as written: whole numbers in full (a seed's 4294967295), others short."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _bounds(
    low: float | None, high: float | None, above: float | None, below: float | None
) -> str:
    """The allowed range in words: ``>= 1``, ``in [0, 1]``, ``in (0, 1]``..."""
    lower = (f"({_number(above)}" if above is not None
             else f"[{_number(low)}" if low is not None else None)
    upper = (f"{_number(below)})" if below is not None
             else f"{_number(high)}]" if high is not None else None)
    if lower and upper:
        return f" in {lower}, {upper}"
    if lower:
        return f" > {_number(above)}" if above is not None else f" >= {_number(low)}"
    if upper:
        return f" < {_number(below)}" if below is not None else f" <= {_number(high)}"
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
    instance_of: type | None = None,
) -> Any:
    """Return ``value`` when it is what a constructor argument must be; raise otherwise.

    Parameters
    ----------
    name : str
        The argument's name, as the constructor spells it.
    value : Any
        What the caller passed.
    kind : {"int", "float", "bool", "str", "object"}
        ``"int"``: a whole number (not a bool); ``"float"``: any finite real number
        (an int too, not a bool); ``"bool"``: True or False; ``"str"``: a string,
        one of ``choices`` when given; ``"object"``: an instance of ``instance_of``
        (a constructor argument only: a run config holds no objects).
    low, high : float | None
        Inclusive bounds of a number.
    above, below : float | None
        Exclusive bounds of a number.
    choices : Sequence[str] | None
        The allowed strings (``kind="str"``).
    allow_none : bool (default: False)
        ``None`` is allowed too (an argument whose ``None`` means "choose for me").
    instance_of : type | None
        The class an ``"object"`` argument must be an instance of.

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
    if not _fits(value, kind, low, high, above, below, choices, instance_of):
        raise ParamError(name, expected(kind, low=low, high=high, above=above, below=below,
                                        choices=choices, allow_none=allow_none,
                                        instance_of=instance_of), value)
    return value


def _fits(
    value: Any, kind: Kind, low: float | None = None, high: float | None = None,
    above: float | None = None, below: float | None = None,
    choices: Sequence[str] | None = None, instance_of: type | None = None,
) -> bool:
    """Whether ``value`` is of ``kind`` and within the bounds (:func:`check_param`)."""
    if kind == "object":
        return instance_of is not None and isinstance(value, instance_of)
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
    if kind == "object":
        cls = constraint["instance_of"]
        text = f"an instance of {cls.__module__}.{cls.__qualname__}"
    elif kind == "bool":
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
    low, high, above, below, choices, allow_none, instance_of
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
    doc : str
        What the argument does, for the declaring class's docstring (its
        ``Parameters`` section is written from the declarations,
        :mod:`fl_clusters.strategies.kit.signatures`) and docs/strategies.md;
        ``help`` where empty.
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
    instance_of: type | None = None
    unset: bool | int | float | str | None = None
    key: str | None = None
    run_config: bool = True
    paper: Any = SAME
    why: str = ""
    source: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        if (self.kind == "object") != (self.instance_of is not None) or (
                self.kind == "object" and self.run_config):
            raise ValueError(f"{self.name}: kind 'object' takes instance_of and "
                             "run_config=False (a run config holds no objects), and only it")
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
        names = ("low", "high", "above", "below", "choices", "allow_none", "instance_of")
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

    def argument(self, value: Any) -> Any:
        """The constructor argument the run-config ``value`` stands for: ``None`` for ``unset``."""
        if self.allow_none and value == self.unset:
            return None
        return value

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
