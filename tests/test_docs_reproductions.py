"""docs/reproductions.md: the claims' verdicts from paired runs, and the page up to date."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fl_clusters.sweep.cells import Sweep
from fl_clusters.sweep.spec import load_sweep
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return load_script(ROOT / "docs" / "generate_reproductions.py")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    path = tmp_path_factory.mktemp("sweep") / "claims.toml"
    path.write_text('baseline = {strategy = "fedavg"}\n[grid]\nseed = [0, 1, 2, 3, 4]\n'
                    'preset = ["robust", "paper"]\nstrategy = ["ifca", "fedavg"]\n'
                    'dirichlet-alpha = [1.0, 0.4]\n')
    return load_sweep(path)


def lines(sweep: Sweep, accuracy: dict[tuple[str, str], list[float]],
          seeds: int = 5) -> list[dict[str, Any]]:
    """runs.jsonl lines: ``accuracy[(strategy, preset)][seed]``, the same for both alphas."""
    found = []
    for cell in sweep.cells:
        seed = int(cell.labels["seed"])
        if seed >= seeds:
            continue
        settings = cell.recorded_settings
        found.append({
            "key": cell.key, "cell": dict(cell.labels), "status": "ok",
            "settings": settings, "git_commit": "0123456789abcdef", "git_dirty": False,
            "summary": {"personalized_accuracy":
                        accuracy[(cell.labels["strategy"], cell.labels["preset"])][seed],
                        "cluster_accuracy": [0.9, None, 0.7]},
        })
    return found


def claim(generator: ModuleType, relation: str = ">", margin: float = 0.0) -> Any:
    return generator.Claim("claims", "IFCA beats FedAvg", {"strategy": "ifca"},
                           {"strategy": "fedavg"}, relation, "IFCA 0.9, FedAvg 0.8",
                           "a table", margin=margin, caveat="another data set")


FEDAVG = [0.80, 0.82, 0.78, 0.81, 0.79]


def test_a_claim_whose_seeds_all_agree_is_reproduced_and_a_reversed_one_contradicted(
    generator: ModuleType, sweep: Sweep,
) -> None:
    accuracy = {("ifca", "paper"): [a + 0.05 for a in FEDAVG],
                ("ifca", "robust"): [a - 0.05 for a in FEDAVG],
                ("fedavg", "paper"): FEDAVG, ("fedavg", "robust"): FEDAVG}
    runs = lines(sweep, accuracy)
    paper = generator.compare(sweep, runs, claim(generator), "paper")
    # Paired seed by seed, the two alphas of a seed averaged: five differences.
    assert paper.differences == pytest.approx({seed: 0.05 for seed in range(5)})
    assert paper.commits == {"0123456789"} and paper.stale == 0
    figures, outcome = generator.cell_text(claim(generator), paper, 5)
    assert outcome == "reproduced"
    assert figures == "0.850 ± 0.020 vs 0.800 ± 0.020; Δ +0.050 ± 0.000"
    robust = generator.compare(sweep, runs, claim(generator), "robust")
    # A claim that does not reproduce names what differs from the paper's setting.
    assert generator.cell_text(claim(generator), robust, 5)[1] == (
        "contradicted (another data set)")


def test_differences_that_straddle_zero_are_not_significant(
    generator: ModuleType, sweep: Sweep,
) -> None:
    noisy = [0.03, -0.04, 0.02, -0.03, 0.01]
    accuracy = {("ifca", "paper"): [a + d for a, d in zip(FEDAVG, noisy, strict=True)],
                ("ifca", "robust"): FEDAVG, ("fedavg", "paper"): FEDAVG,
                ("fedavg", "robust"): FEDAVG}
    comparison = generator.compare(sweep, lines(sweep, accuracy), claim(generator), "paper")
    assert generator.cell_text(claim(generator), comparison, 5)[1].startswith(
        "not significant")


def test_two_sides_that_score_the_same_in_every_seed_get_no_verdict(
    generator: ModuleType, sweep: Sweep,
) -> None:
    accuracy = {(s, p): FEDAVG for s in ("ifca", "fedavg") for p in ("paper", "robust")}
    comparison = generator.compare(sweep, lines(sweep, accuracy), claim(generator), "paper")
    untested = ("not tested: the two sides scored the same in every seed: nothing told them "
                "apart (another data set)")
    assert generator.cell_text(claim(generator), comparison, 5)[1] == untested
    assert generator.cell_text(claim(generator, "~", 0.02), comparison, 5)[1] == untested


def test_a_clustered_side_that_never_clustered_gets_no_verdict(
    generator: ModuleType, sweep: Sweep,
) -> None:
    accuracy = {("ifca", "paper"): [a + 0.05 for a in FEDAVG],
                ("ifca", "robust"): [a + 0.05 for a in FEDAVG],
                ("fedavg", "paper"): FEDAVG, ("fedavg", "robust"): FEDAVG}
    runs = lines(sweep, accuracy)
    for line in runs:
        clustered = line["cell"]["preset"] == "robust" and line["cell"]["seed"] == "3"
        line["summary"]["num_clusters_found"] = 4 if clustered else 1
    # One seed with clusters is enough for a verdict; none leaves the claim untested.
    robust = generator.compare(sweep, runs, claim(generator), "robust")
    assert generator.cell_text(claim(generator), robust, 5)[1] == "reproduced"
    paper = generator.compare(sweep, runs, claim(generator), "paper")
    assert generator.cell_text(claim(generator), paper, 5)[1].startswith(
        "not tested: ifca never clustered (one cluster in every seed)")


def test_no_recorded_verdict_rests_on_two_identical_sides(generator: ModuleType) -> None:
    """Over the sweeps' recorded runs: sides that score the same in every seed, or a
    clustered side with one cluster in every seed, never get a verdict."""
    for claim in generator.CLAIMS:
        runs = generator._runs(claim.sweep)
        sweep = load_sweep(generator.SWEEPS / f"{claim.sweep}.toml")
        seeds = len({cell.labels["seed"] for cell in sweep.cells})
        for preset in ("paper", "robust"):
            comparison = generator.compare(sweep, runs, claim, preset)
            if len(comparison.differences) < seeds:
                continue
            outcome = generator.cell_text(claim, comparison, seeds)[1]
            identical = all(d == 0 for d in comparison.differences.values())
            never = any(not any(flags) for flags in comparison.clustered.values())
            if identical or never:
                assert outcome.startswith("not tested"), (claim.text, preset, outcome)


def test_a_sections_clustering_table_counts_the_seeds_that_ended_with_several_clusters(
    generator: ModuleType, sweep: Sweep,
) -> None:
    accuracy = {(s, p): FEDAVG for s in ("ifca", "fedavg") for p in ("paper", "robust")}
    runs = lines(sweep, accuracy)
    for line in runs:
        split = line["cell"]["preset"] == "robust" or line["cell"]["seed"] == "0"
        line["run_config"] = {"strategy": line["cell"]["strategy"]}
        line["summary"].update(num_clusters_found=4 if split else 1, ari=1.0 if split else 0.0)
    table = generator.clustering_table(sweep, runs)
    # One row per clustered cell (FedAvg has none), over its 5 seeds.
    assert [row for row in table if row.startswith("| ifca")] == [
        "| ifca, 1.0 | more than one cluster in 1 of 5 seeds; 1.6 clusters; ARI 0.20 "
        "| more than one cluster in 5 of 5 seeds; 4.0 clusters; ARI 1.00 |",
        "| ifca, 0.4 | more than one cluster in 1 of 5 seeds; 1.6 clusters; ARI 0.20 "
        "| more than one cluster in 5 of 5 seeds; 4.0 clusters; ARI 1.00 |"]
    assert not any(row.startswith("| fedavg") for row in table)


def test_an_equivalence_claim_needs_its_interval_inside_the_margin(
    generator: ModuleType,
) -> None:
    assert generator.verdict([0.004, -0.003, 0.001, 0.0, -0.002], "~", 0.02) == "reproduced"
    assert generator.verdict([0.10, 0.12, 0.09, 0.11, 0.10], "~", 0.02) == "contradicted"
    assert generator.verdict([0.03, -0.04, 0.02, -0.03, 0.01], "~", 0.02) == "not significant"
    with pytest.raises(ValueError, match="margin"):
        claim(generator, "~")
    with pytest.raises(ValueError, match="two seeds"):
        generator.verdict([0.1], ">")


def test_a_sweep_with_missing_or_failed_seeds_gives_no_figures(
    generator: ModuleType, sweep: Sweep,
) -> None:
    accuracy = {(s, p): FEDAVG for s in ("ifca", "fedavg") for p in ("paper", "robust")}
    three = generator.compare(sweep, lines(sweep, accuracy, seeds=3), claim(generator),
                              "paper")
    assert generator.cell_text(claim(generator), three, 5) == (
        "not run yet (3 of 5 seeds)", "not run yet")
    runs = lines(sweep, accuracy)
    for line in runs:
        if line["cell"]["seed"] == "4" and line["cell"]["strategy"] == "ifca":
            line["status"] = "failed"
    failed = generator.compare(sweep, runs, claim(generator), "paper")
    assert sorted(failed.differences) == [0, 1, 2, 3]
    assert generator.cell_text(claim(generator), generator.Comparison(), 5) == (
        "not run yet", "not run yet")


def test_a_list_field_counts_as_the_mean_of_its_numbers(generator: ModuleType) -> None:
    line = {"status": "ok", "summary": {"cluster_accuracy": [0.9, None, 0.7]}}
    assert generator.value(line, "cluster_accuracy") == pytest.approx(0.8)
    assert generator.value({**line, "status": "failed"}, "cluster_accuracy") is None


def test_every_reproduction_sweep_has_claims_that_name_its_cells(
    generator: ModuleType,
) -> None:
    files = {path.stem for path in (ROOT / "benchmarks" / "sweeps").glob("reproduce-*.toml")}
    claimed = {claim.sweep for claim in generator.CLAIMS}
    assert claimed == files
    for each in generator.CLAIMS:
        labels = [cell.labels for cell in load_sweep(
            ROOT / "benchmarks" / "sweeps" / f"{each.sweep}.toml").cells]
        for side in (each.cell, each.other):
            assert any(generator._matches(cell, side) for cell in labels), (each.text, side)


def test_the_reproductions_page_is_up_to_date(generator: ModuleType) -> None:
    assert generator.render() == (ROOT / "docs" / "reproductions.md").read_text(), (
        "docs/reproductions.md is out of date; run: python docs/generate_reproductions.py")


def test_a_cell_recorded_from_another_cells_run_is_read_and_follows_that_run(
    generator: ModuleType, sweep: Sweep,
) -> None:
    from fl_clusters.sweep.twins import SAME_RUN_AS, SameRuns

    accuracy = {("ifca", "paper"): [a + 0.05 for a in FEDAVG],
                ("ifca", "robust"): FEDAVG, ("fedavg", "robust"): FEDAVG,
                ("fedavg", "paper"): [0.0] * 5}
    runs = [{**line, "started": "2026-01-01T00:00:00+00:00", "seconds": 3600.0}
            for line in lines(sweep, accuracy)
            if (line["cell"]["strategy"], line["cell"]["preset"]) != ("fedavg", "paper")]
    # FedAvg's paper cells: recorded from its robust runs, as the sweep does.
    same_runs = SameRuns(sweep)
    by_labels = {tuple(sorted(cell.labels.items())): cell for cell in sweep.cells}
    keyed = {line["key"]: line for line in runs}
    twins = []
    for cell in sweep.cells:
        if cell.labels["strategy"] == "fedavg" and cell.labels["preset"] == "paper":
            robust = by_labels[tuple(sorted({**cell.labels, "preset": "robust"}.items()))]
            twins.append(same_runs.twin_line(cell, keyed[robust.key], "2026-01-02T00:00:00"))
    paper = generator.compare(sweep, runs + twins, claim(generator), "paper")
    assert paper.differences == pytest.approx({seed: 0.05 for seed in range(5)})
    assert paper.stale == 0
    # The hours count the runs made, not the cells recorded from them.
    assert generator._hours(runs + twins) == pytest.approx(len(runs))
    assert all(SAME_RUN_AS in twin for twin in twins)
    # FedAvg's robust run of seed 0, alpha 1.0 run again: its paper cell repeats a run
    # that is no longer the cell's; counted stale until the next sweep records it.
    again = {**keyed[twins[0][SAME_RUN_AS]], "started": "2026-03-03T00:00:00+00:00"}
    rerun = generator.compare(sweep, runs + twins + [again], claim(generator), "paper")
    assert rerun.stale == 1
