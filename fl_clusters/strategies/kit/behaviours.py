"""Behaviours declared once: where a strategy's rule departs from its paper's.

A :class:`~fl_clusters.params.Param` declares a departure that is a
value (IFCA's ``init``, CFL's ``gate``); a :class:`Behaviour` declares one that
no argument shows: a rule the code follows (ACFL's trial federation, FLDC's
round 0, AWCFL's weighting). A strategy class lists its own in ``behaviours``
(see :class:`~fl_clusters.strategies.kit.presets.Declared`), next to its ``params``;
docs/generate_strategies.py writes both into docs/paper-fidelity.md, and
tests/test_presets.py fails when the robust and the paper preset build objects
that differ in anything neither declares.

A behaviour is a switch (``switch=True``): the strategy reads the attribute
``name``, True under ``preset="robust"`` (the library's rule) and False under
``preset="paper"`` (the paper's). One whose paper gives no rule
(``paper_rule=""``), or whose rule the library does not follow under either
preset (``switch=False``, ``why`` says why), is documented only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Behaviour:
    """One rule in which a strategy departs from the paper, declared with its reason.

    Parameters
    ----------
    name : str
        The attribute the strategy reads (a switch: True runs ``robust_rule``,
        False ``paper_rule``), a Python identifier.
    paper_rule : str
        The paper's rule in one sentence; ``""``: the paper gives none, and both
        presets run ``robust_rule``.
    robust_rule : str
        What the library does instead, in one sentence.
    why : str
        Why, one sentence for docs/paper-fidelity.md.
    source : str
        Where the paper's rule (or its silence) is: the seed file and section, or
        the paper.
    switch : bool (default: True)
        Whether ``preset="paper"`` runs ``paper_rule``; False: both presets run
        ``robust_rule`` (a paper rule the library refuses, such as a choice made
        on test labels). Needs a ``paper_rule``.
    """

    name: str
    paper_rule: str
    robust_rule: str
    why: str
    source: str
    switch: bool = True

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"behaviour name {self.name!r} must be a Python identifier")
        missing = [field for field in ("robust_rule", "why", "source")
                   if not getattr(self, field)]
        if missing:
            raise ValueError(f"behaviour {self.name!r} needs its {', '.join(missing)}")

    @property
    def switched(self) -> bool:
        """Whether ``preset="paper"`` runs another rule: the paper's, which it gives."""
        return self.switch and bool(self.paper_rule)


def behaviour_switches(behaviours: Iterable[Behaviour], preset: str) -> dict[str, bool]:
    """Each switched behaviour's attribute under ``preset``: False (the paper's rule) in "paper"."""
    return {b.name: preset != "paper" for b in behaviours if b.switched}
