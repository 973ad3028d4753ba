"""The training recipe each paper reports, declared once per strategy.

A strategy's ``params`` declare its constructor arguments; its ``recipe`` declares
how its paper trained: the optimizer, learning rate, local epochs or steps, batch
size, rounds and clients per round (:data:`RECIPE_KEYS`), each value with its
source. Only values the paper (or its authors' code) gives are declared. Under
``preset="paper"`` fl-clusters' ServerApp gives every run-config key of the
recipe the user left at its default the paper's value
(:func:`fl_clusters.config.apply_paper_recipe`); a value the library's learner
cannot run (Adam, a learning-rate schedule) is declared with ``not_applied``, the
reason, and changes nothing. docs/paper-fidelity.md lists every strategy's recipe
and, for each key its paper gives no value for, what the library uses and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecipeKey:
    """One setting of the training recipe, and what the library uses where a paper is silent.

    Parameters
    ----------
    key : str
        The run-config key (``lr``), or the name of a setting the library's
        learner fixes (``optimizer``).
    why : str
        Why the library uses its value, one phrase for docs/paper-fidelity.md.
    fixed : str
        The learner's own setting for a key no run config sets (``"plain SGD"``);
        ``""``: a run-config key, whose default is the library's value.
    """

    key: str
    why: str
    fixed: str = ""


RECIPE_KEYS: tuple[RecipeKey, ...] = (
    RecipeKey("optimizer", "it is the built-in learner's one update rule, with no momentum or "
              "weight decay (TorchLearner.train); an optimizer of your own runs in your own "
              "ClientApp (docs/plugin.md)", fixed="plain SGD"),
    RecipeKey("lr-schedule", "each round's message sends the client one lr; no schedule "
              "changes it between rounds", fixed="a constant lr"),
    RecipeKey("lr", "plain SGD at 0.1 trains the bundled MLP and CNN without diverging; it is "
              "IFCA's step for rotated MNIST (seed 001)"),
    RecipeKey("local-epochs", "local-steps > 0 decides a round's work, and one epoch is the "
              "fallback when it is 0"),
    RecipeKey("local-steps", "a fixed count of steps gives every client the same work a round "
              "whatever its data size; 10 is IFCA's tau for rotated MNIST (seed 001)"),
    RecipeKey("batch-size", "32 is below the tens to hundreds of training examples a bundled "
              "digits client holds, so that every step is stochastic"),
    RecipeKey("num-rounds", "a bundled digits run levels off within 15 rounds, in seconds on "
              "a CPU; a longer run sets its own"),
    RecipeKey("fraction-train", "every client trains every round, as the small bundled "
              "federations allow"),
)
RECIPE_KEY_NAMES = tuple(key.key for key in RECIPE_KEYS)
# The settings no run config sets: the learner's own.
FIXED_KEYS = {key.key: key.fixed for key in RECIPE_KEYS if key.fixed}


@dataclass(frozen=True)
class RecipeValue:
    """One value of a paper's training recipe, with its source.

    Parameters
    ----------
    key : str
        One of :data:`RECIPE_KEYS`.
    value : Any
        The paper's value: a run-config value for a run-config key, a short text
        for a fixed one (``"Adam"``).
    source : str
        Where the paper gives it: the seed file and section, the paper, or the
        authors' code.
    not_applied : str
        Why ``preset="paper"`` cannot run it (``""``: it does); required for a
        fixed key whose value is not the learner's own.
    """

    key: str
    value: Any
    source: str
    not_applied: str = ""

    def __post_init__(self) -> None:
        if self.key not in RECIPE_KEY_NAMES:
            raise ValueError(f"recipe key {self.key!r} is none of {', '.join(RECIPE_KEY_NAMES)}")
        if not self.source:
            raise ValueError(f"recipe value {self.key}={self.value!r} needs its source")
        if self.key in FIXED_KEYS and self.value != FIXED_KEYS[self.key] and not self.not_applied:
            raise ValueError(f"recipe value {self.key}={self.value!r}: the learner runs "
                             f"{FIXED_KEYS[self.key]!r} only; say why it is not applied")

    @property
    def applies(self) -> bool:
        """Whether ``preset="paper"`` sets it: a run-config key the library can run."""
        return not self.not_applied and self.key not in FIXED_KEYS


def check_recipe(owner: str, recipe: tuple[RecipeValue, ...]) -> None:
    """Refuse a recipe that gives one key twice."""
    keys = [value.key for value in recipe]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"{owner}.recipe gives {', '.join(twice)} more than once")

