"""Presets: the library's defaults (``robust``) or the algorithm as published (``paper``).

A strategy class is :class:`Declared`: it lists its constructor arguments
(``params``, :class:`~fl_clusters.params.Param`) and its rules that
depart from the paper (``behaviours``,
:class:`~fl_clusters.strategies.kit.behaviours.Behaviour`). Under ``preset="paper"``
every argument the caller did not name takes its declaration's paper value and
every switched rule runs the paper's; ``paper_revision`` counts changes to what
that preset computes, so that results recorded before a change are stale.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterable, Mapping
from logging import INFO
from typing import Any, ClassVar, Self

from flwr.common.logger import log

from fl_clusters.params import NOT_GIVEN, SAME, Param, check_params, check_signature
from fl_clusters.strategies.kit.behaviours import Behaviour, behaviour_switches
from fl_clusters.strategies.kit.client_queries import ClientQuery, check_client_queries
from fl_clusters.strategies.kit.recipes import RecipeValue, check_recipe
from fl_clusters.strategies.kit.signatures import call_signature, documented

PRESETS = ("robust", "paper")


class Declared:
    """A class whose constructor arguments are declared (``params``), registered by ``name``.

    A subclass's own ``params`` get their run-config keys (prefixed by its
    ``name``) when the class is defined, and its call signature and docstring's
    Parameters section are written from them (:mod:`~fl_clusters.strategies.kit.signatures`):
    its ``__init__`` takes ``**arguments`` and passes them on, and the base sets
    each declared argument as an attribute (:meth:`init_params`). An ``__init__``
    that spells an argument must give it its declared default. A subclass with a
    ``name`` of its own enters ``registry``.
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
    # How its paper trained (fl_clusters.strategies.kit.recipes): the values the paper
    # gives, each with its source; fl-clusters' ServerApp applies them under
    # preset="paper" (paper_recipe).
    recipe: ClassVar[tuple[RecipeValue, ...]] = ()
    # The queries its rounds send the nodes, by name, each with the function that
    # answers it on a node (fl_clusters.strategies.kit.client_queries); a subclass
    # answers its bases' too.
    client_queries: ClassVar[Mapping[str, ClientQuery]] = {}
    # What preset="paper" computes under the class's own declarations, counted: 1
    # at first, one more with every change to it (a paper value, a switched rule),
    # so that a sweep run recorded before the change is stale
    # (fl_clusters.sweep.cells.Cell.changed_settings); docs/paper-digests.json
    # records each class's digest of those declarations, and tests/test_presets.py
    # fails when they change alone (fl_clusters.strategies.kit.paper_digests).
    # Read from the class itself, never inherited (paper_revision_for).
    paper_revision: ClassVar[int] = 1
    # The same count for what the robust preset computes: one more with every change
    # to its rules that no run-config key shows (FLDC's standardized distance), so
    # that sweep runs recorded before it are stale too. Read like paper_revision.
    robust_revision: ClassVar[int] = 1
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
        check_recipe(cls.__qualname__, vars(cls).get("recipe", ()))
        if "params" in vars(cls):
            check_signature(cls, cls.params)
            cls.params = tuple(param.with_prefix(own_name) for param in cls.params)
            cls.__doc__ = documented(cls, cls.params, cls.declared_params())
        cls.__signature__ = call_signature(cls, cls.declared_params())
        check_client_queries(cls, cls.registry.values())
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
    def robust_revision_for(cls) -> int:
        """What ``preset="robust"`` computes, counted: 1, plus each class's own revisions
        past 1 (``robust_revision``) along the class and its bases."""
        return 1 + sum(vars(klass).get("robust_revision", 1) - 1 for klass in cls.__mro__)

    @classmethod
    def paper_recipe(cls, settings: Mapping[str, Any]) -> tuple[RecipeValue, ...]:
        """The paper's training recipe for a run with run config ``settings``.

        An option the run turns on (``paper_rules_apply_with``: AWCFL, MCFL) makes
        the run its paper's algorithm, so that paper's values come first; then the
        class's own and its bases', the first declaration of each key.
        """
        options, others = [], []
        for klass in cls.__mro__:
            applies_with = vars(klass).get("paper_rules_apply_with", "")
            if not applies_with:
                others.append(klass)
            elif settings.get(applies_with):
                options.append(klass)
        found: dict[str, RecipeValue] = {}
        for klass in options + others:
            for value in vars(klass).get("recipe", ()):
                found.setdefault(value.key, value)
        return tuple(found.values())

    @classmethod
    def declared_behaviours(cls) -> tuple[Behaviour, ...]:
        """Every rule the class follows apart from the paper: its own first, then its bases'."""
        return _along_mro(cls, "behaviours")

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        """Record the arguments the caller named (``user_arguments``): a preset keeps them.

        Only here are they told from the defaults: a class whose ``__init__``
        spells its arguments passes every one on to its base's, defaults included.
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
