"""Write the per-strategy sections of docs/strategies.md from the classes themselves.

Each section holds the strategy's paper, the run-config keys its builder reads
(found by building it from the default run config and recording every key read),
its constructor signature and its docstring, with the Parameters section as a
list. The text above the first section is hand-written and kept. A docstring
whose ``(default: ...)`` differs from the signature's default is an error, so a
changed default cannot leave the docs behind; tests/test_docs.py checks that the
file matches.

    python docs/generate_strategies.py            # rewrite docs/strategies.md
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fl_clusters.config import parse_run_config
from fl_clusters.strategies import (
    ACFL,
    CFL,
    FLDC,
    FLHC,
    IFCA,
    FedEM,
    FedSoft,
    LocalOnly,
    WeCFL,
)
from fl_clusters.strategies.base import ClusteredStrategy
from fl_clusters.strategies.registry import BUILDERS

DOC = Path(__file__).resolve().parent / "strategies.md"
FIRST_SECTION = "\n## "
PARAMETER_LINE = re.compile(r"^(?P<names>[\w, ]+?)(?: : (?P<type>.+?))?$")
DEFAULT_IN_TYPE = re.compile(r"\(default: (?P<value>.+)\)$")

# (class, run-config strategy name or None, paper)
STRATEGIES: list[tuple[type, str | None, str]] = [
    (IFCA, "ifca", "Ghosh et al., NeurIPS 2020"),
    (CFL, "cfl", "Sattler et al., IEEE TNNLS 2020"),
    (ACFL, "acfl", "Zhu et al., J. on Communications 2024"),
    (FedSoft, "fedsoft", "Ruan and Joe-Wong, AAAI 2022"),
    (FLDC, "fldc", "Wang and Li, 2025"),
    (FLHC, "flhc", "Briggs, Fan, Andras, IJCNN 2020 (FL+HC)"),
    (WeCFL, "wecfl", "Ma, Long, Zhou, Jiang, Zhang, 2022"),
    (FedEM, "fedem", "Marfoq et al., NeurIPS 2021"),
    (LocalOnly, "local", "baseline: no sharing"),
    (ClusteredStrategy, None, "base class of the strategies above"),
]
# Keys every clustered builder passes on; listed once, in the base class's section.
SHARED_KEYS = ("fraction-train", "min-available-nodes", "max-failed-rounds", "seed",
               "awcfl-beta", "mcfl", "mcfl-feature-samples")


class _KeysRead(dict):  # type: ignore[type-arg]
    """The default run config, remembering every key a builder reads."""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.read: list[str] = []

    def __getitem__(self, key: str) -> Any:
        if key not in self.read:
            self.read.append(key)
        return super().__getitem__(key)


def run_config_keys(name: str) -> list[str]:
    """Run-config keys the builder of strategy ``name`` reads, shared ones left out."""
    settings = _KeysRead({**parse_run_config({}), "min-available-nodes": 2})
    BUILDERS[name](settings)
    return [key for key in settings.read if key not in SHARED_KEYS]


def _parameters(lines: list[str]) -> Iterator[tuple[str, str | None, list[str]]]:
    """(names, type, description lines) of a numpy-style Parameters section."""
    names, kind, text = None, None, []  # type: ignore[var-annotated]
    for line in lines:
        if line and not line.startswith(" "):
            if names is not None:
                yield names, kind, text
            found = PARAMETER_LINE.match(line)
            if found is None:
                raise ValueError(f"cannot read the parameter line {line!r}")
            names, kind, text = found["names"], found["type"], []
        elif names is not None and line.strip():
            text.append(line.strip())
    if names is not None:
        yield names, kind, text


def _check_default(cls: type, name: str, kind: str) -> None:
    found = DEFAULT_IN_TYPE.search(kind)
    if found is None:
        return
    parameter = inspect.signature(cls).parameters.get(name)
    if parameter is None:
        raise ValueError(f"{cls.__name__}'s docstring documents {name!r}, not in its signature")
    try:
        documented = ast.literal_eval(found["value"])
    except (ValueError, SyntaxError):
        documented = found["value"]
    if documented != parameter.default:
        raise ValueError(
            f"{cls.__name__}.{name}: the docstring says default {found['value']}, the "
            f"signature {parameter.default!r}; correct the docstring"
        )


def section(cls: type, name: str | None, paper: str) -> str:
    """The markdown section of one strategy class."""
    doc = inspect.getdoc(cls) or ""
    intro, _, rest = doc.partition("\nParameters\n----------\n")
    if not rest:
        raise ValueError(f"{cls.__name__}'s docstring has no Parameters section")
    title = f"## {cls.__name__}" + (f" (`{name}`)" if name else " (shared options)")
    if name is None:
        keys = ", ".join(f"`{k}`" for k in SHARED_KEYS if k != "min-available-nodes")
        keys += " (and `min-nodes`, passed as `min_available_nodes`)"
    else:
        keys = ", ".join(f"`{k}`" for k in run_config_keys(name)) or "none of its own"
    signature = f"fl_clusters.strategies.{cls.__name__}{inspect.signature(cls, eval_str=True)}"
    out = [title, "", f"{paper}. Run-config keys: {keys}.", "", "```python", signature, "```",
           "", intro.strip(), ""]
    for names, kind, text in _parameters(rest.splitlines()):
        if kind is not None:
            _check_default(cls, names, kind)
        out.append(f"- `{names}`" + (f" : {kind}" if kind else ""))
        out += [f"  {line}" for line in text]
    return "\n".join(out) + "\n"


def render(current: str) -> str:
    """``current`` with everything from its first section on generated anew."""
    head, found, _ = current.partition(FIRST_SECTION)
    if not found:
        raise ValueError("docs/strategies.md has no '## ' section to replace")
    return head + "\n" + "\n".join(section(*entry) for entry in STRATEGIES)


def main() -> None:
    DOC.write_text(render(DOC.read_text()))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
