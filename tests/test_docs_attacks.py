"""docs/robustness.md's attack block: up to date, and read right from the sweep's runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, load_script


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return load_script(ROOT / "docs" / "generate_attacks.py")


def test_the_attack_block_is_up_to_date(generator: ModuleType) -> None:
    assert generator.main(["--check"]) == 0, (
        "docs/robustness.md's attack block is out of date; run: python docs/generate_attacks.py")


def test_a_verdict_holds_up_to_the_last_share_before_the_first_break(
    generator: ModuleType,
) -> None:
    assert generator._verdict([(10, True), (20, True), (30, True)]) == "holds up to 30 %"
    assert generator._verdict([(10, True), (20, False), (30, True)]) == (
        "holds up to 10 %; breaks at 20 %")
    assert generator._verdict([(10, False), (20, True)]) == "breaks at 10 %"
    assert generator._verdict([]) == "not run yet"


def test_the_tables_read_honest_accuracy_seed_by_seed(
    generator: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = generator.load_sweep(generator.SWEEP)
    clean = {0: 0.90, 1: 0.92, 2: 0.94}
    lines = []
    for cell in sweep.cells:
        labels = cell.labels
        if labels["strategy"] != "ifca" or labels["attack"] not in ("none", "sign-flip-10",
                                                                     "sign-flip-20"):
            continue
        seed = int(labels["seed"])
        # ifca loses 1 point at 10 % and 5 points at 20 %.
        drop = {"none": 0.0, "sign-flip-10": 0.01, "sign-flip-20": 0.05}[labels["attack"]]
        summary = {"personalized_accuracy": clean[seed] - drop, "attack": None}
        if labels["attack"] != "none":
            summary["attack"] = {"honest_personalized_accuracy": clean[seed] - drop,
                                 "attackers_isolated": 0.5,
                                 "honest_clients_with_attackers": 0.25}
        lines.append({"key": cell.key, "status": "ok", "summary": summary,
                      "git_commit": "abcdef0123"})
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setattr(generator, "RUNS", runs)
    text = generator.render(sweep)
    sign_flip = text.split("**sign-flip**")[1]
    row = next(line for line in sign_flip.splitlines() if line.startswith("| ifca |"))
    assert row.split(" | ")[1:4] == ["0.920 ± 0.020", "0.910 ± 0.020", "0.870 ± 0.020"]
    assert row.endswith("| holds up to 10 %; breaks at 20 % |"), row
    assert "commits abcdef0" in text
