"""A record of what each class's ``preset="paper"`` computes, to catch a forgotten revision.

A class's paper declarations are its own paper values that depart from its
defaults (``Param(..., paper=...)``) and its switched rules (``Behaviour``). A
change to them changes what ``preset="paper"`` computes without changing any
run-config key, so the class must raise its ``paper_revision``: the sweep runs
recorded before are then stale (:mod:`fl_clusters.sweep.cells`).
docs/generate_strategies.py records every declaring class's digest of them with
its revision in docs/paper-digests.json (:func:`record_paper_digests`) and
refuses to record a changed digest under the revision it was recorded with;
tests/test_presets.py fails on such a change too (:func:`forgotten_revisions`).
A class not recorded yet has nothing to compare with: the generator records it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from fl_clusters.strategies.kit.presets import departs

# Class name -> (its own paper_revision, the digest of its paper declarations).
Digests = dict[str, tuple[int, str]]


def paper_declarations(klass: type) -> list[list[str]]:
    """What ``klass``'s own declarations make ``preset="paper"`` compute: paper values, rules."""
    own = vars(klass)
    values = [[param.name, repr(param.paper)] for param in own.get("params", ()) if departs(param)]
    rules = [[rule.name, rule.paper_rule] for rule in own.get("behaviours", ()) if rule.switched]
    return values + rules


def paper_digests(strategies: Iterable[type]) -> Digests:
    """The revision and digest of every class of ``strategies`` and their bases that declares.

    A class declares when it has paper declarations of its own or a
    ``paper_revision`` past 1.
    """
    classes = {klass for cls in strategies for klass in cls.__mro__}
    digests: Digests = {}
    for klass in sorted(classes, key=lambda klass: klass.__name__):
        declarations = paper_declarations(klass)
        revision = vars(klass).get("paper_revision", 1)
        if declarations or revision > 1:
            text = json.dumps(declarations, sort_keys=True)
            digests[klass.__name__] = (revision, hashlib.sha256(text.encode()).hexdigest()[:12])
    return digests


def forgotten_revisions(recorded: Mapping[str, tuple[int, str]], digests: Digests) -> list[str]:
    """The recorded classes whose declarations changed while their revision did not rise."""
    return sorted(name for name, (revision, digest) in digests.items()
                  if name in recorded and digest != recorded[name][1]
                  and revision <= recorded[name][0])


def revision_problem(recorded: Mapping[str, tuple[int, str]], digests: Digests) -> str | None:
    """Why ``digests`` cannot be recorded over ``recorded``, naming the fix; ``None``: they can."""
    problems = [
        f"{name}'s paper declarations changed at paper_revision {digests[name][0]}: set "
        f"`paper_revision = {recorded[name][0] + 1}` in the class, so that the runs made "
        "before are stale (if only their wording changed and preset='paper' computes "
        f"the same, remove {name}'s entry from the record instead)"
        for name in forgotten_revisions(recorded, digests)]
    problems += [
        f"{name}'s paper_revision fell from {recorded[name][0]} to {revision}: a revision "
        "only rises"
        for name, (revision, digest) in digests.items()
        if name in recorded and revision < recorded[name][0] and digest == recorded[name][1]]
    return "; ".join(problems) or None


def read_paper_digests(path: Path) -> Digests:
    """The digests recorded at ``path`` (none when it does not exist)."""
    if not path.exists():
        return {}
    entries = json.loads(path.read_text())
    return {name: (int(entry["paper_revision"]), str(entry["digest"]))
            for name, entry in entries.items()}


def record_paper_digests(path: Path, strategies: Iterable[type]) -> Digests:
    """Record the digests of ``strategies``' declaring classes at ``path``; what it recorded.

    Raises
    ------
    ValueError
        If a recorded class's declarations changed at its recorded revision
        (:func:`revision_problem`); nothing is written then.
    """
    digests = paper_digests(strategies)
    problem = revision_problem(read_paper_digests(path), digests)
    if problem is not None:
        raise ValueError(f"{path.name} not written: {problem}")
    entries = {name: {"paper_revision": revision, "digest": digest}
               for name, (revision, digest) in digests.items()}
    path.write_text(json.dumps(entries, indent=2) + "\n")
    return digests
