"""The call signature and the docstring's Parameters section, written from the declarations.

A strategy declares each constructor argument once, as a
:class:`~fl_clusters.params.Param`; its ``__init__`` takes
``**arguments`` and passes them on to its base, which checks and sets them
(:meth:`~fl_clusters.strategies.kit.presets.Declared.init_params`). When the class
is defined, :class:`~fl_clusters.strategies.kit.presets.Declared` gives it the
signature that ``inspect.signature``, ``help()`` and notebooks show, and the
``Parameters`` section of its docstring, both from those declarations, so that
neither can drift from what the class takes. docs/strategies.md is generated from
the same docstrings.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Sequence
from typing import Any

from fl_clusters.params import REQUIRED, Param

_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_SECTION = "\nParameters\n----------\n"
# The docstring's text width, as numpy-style docstrings are wrapped here.
_WIDTH = 84


def annotation(param: Param) -> Any:
    """The type an argument takes: its kind's, or that or ``None``."""
    kind = param.instance_of if param.instance_of is not None else _TYPES[param.kind]
    return kind | None if param.allow_none else kind


def _default_text(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def call_signature(cls: type, params: Sequence[Param]) -> inspect.Signature:
    """The signature of ``cls(...)``: the arguments ``cls.__init__`` spells, then every
    other declared one, keyword-only, with its default (none where ``REQUIRED``)."""
    spelled = [argument for argument in
               list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
               if argument.kind not in (argument.VAR_KEYWORD, argument.VAR_POSITIONAL)]
    names = {argument.name for argument in spelled}
    declared = [inspect.Parameter(param.name, inspect.Parameter.KEYWORD_ONLY,
                                  default=param.default, annotation=annotation(param))
                for param in params if param.name not in names]
    return inspect.Signature([*spelled, *declared])


def _entry(param: Param) -> list[str]:
    kind = (param.instance_of.__name__ if param.instance_of is not None else param.kind) + (
        " | None" if param.allow_none else "")
    default = "" if param.default is REQUIRED else f" (default: {_default_text(param.default)})"
    text = param.doc or param.help[:1].upper() + param.help[1:] + "."
    return [f"{param.name} : {kind}{default}",
            textwrap.fill(text, _WIDTH, initial_indent="    ", subsequent_indent="    ",
                          break_long_words=False, break_on_hyphens=False)]


def _inherited(cls: type, own: Sequence[Param], params: Sequence[Param]) -> list[str]:
    """One entry per base class for the declared arguments ``cls`` takes from it."""
    own_names = {param.name for param in own}
    by_owner: dict[type, list[str]] = {}
    for param in params:
        if param.name in own_names:
            continue
        owner = next(klass for klass in cls.__mro__[1:]
                     if any(mine.name == param.name for mine in vars(klass).get("params", ())))
        by_owner.setdefault(owner, []).append(param.name)
    return [line for owner, names in by_owner.items() for line in (
        ", ".join(names), f"    As :class:`~{owner.__module__}.{owner.__qualname__}` documents.")]


def documented(cls: type, own: Sequence[Param], params: Sequence[Param]) -> str:
    """``cls``'s docstring with the Parameters section of its declarations.

    A docstring that has a Parameters section of its own keeps it (a class may
    document its arguments by hand); the declarations' checks still hold.
    """
    doc = inspect.cleandoc(cls.__doc__ or "")
    if _SECTION in f"\n{doc}\n":
        return doc
    lines = [line for param in own for line in _entry(param)]
    return doc + "\n" + _SECTION + "\n".join(lines + _inherited(cls, own, params)) + "\n"
