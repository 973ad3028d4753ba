"""Checks of the strategies' constructor arguments, in one place.

Every constructor checks its arguments here, so a bad value gets one kind of
message whatever the strategy: the argument's name, what it must be and what
came (``num_clusters must be an int >= 1; got 2.5 (float)``). Python's own
coercions are refused: ``True`` is not an int and ``'2'`` is not a number, since
either usually means a value that was read or passed wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, Literal

Kind = Literal["int", "float", "bool", "str"]


class ParamError(ValueError):
    """A constructor argument that is not what it must be.

    Parameters
    ----------
    name : str
        The argument's name.
    expected : str
        What it must be, in words (``an int >= 1``).
    value : Any
        What was given.
    """

    def __init__(self, name: str, expected: str, value: Any) -> None:
        super().__init__(f"{name} must be {expected}; got {value!r} ({type(value).__name__})")
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
        (an int too, not a bool); ``"bool"``: True or False; ``"str"``: one of
        ``choices``.
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
    if kind == "bool":
        expected = "a bool (True or False)"
        valid = isinstance(value, bool)
    elif kind == "str":
        allowed = ", ".join(repr(c) for c in choices or ())
        expected = f"one of {allowed}"
        valid = isinstance(value, str) and value in (choices or ())
    else:
        noun = "an int" if kind == "int" else "a number"
        expected = noun + _bounds(low, high, above, below)
        number_type = Integral if kind == "int" else Real
        valid = (
            isinstance(value, number_type) and not isinstance(value, bool)
            and math.isfinite(float(value))  # type: ignore[arg-type]
            and (low is None or value >= low) and (high is None or value <= high)
            and (above is None or value > above) and (below is None or value < below)
        )
    if not valid:
        raise ParamError(name, expected + (" or None" if allow_none else ""), value)
    return value
