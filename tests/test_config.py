"""Run-config validation: defaults, conversions and the errors a user sees."""

import pytest

from fl_clusters.config import config_keys, key_groups, parse_run_config


def test_defaults_fill_an_empty_run_config() -> None:
    settings = parse_run_config({})
    assert settings["strategy"] == "ifca"
    assert settings["dataset"] == "digits"
    assert settings["num-groups"] == settings["num-clusters"] == 4


def test_pyproject_lists_every_key_with_its_default() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    config = pyproject["tool"]["flwr"]["app"]["config"]
    assert set(config) == set(config_keys())
    assert parse_run_config(config) == parse_run_config({})


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("strategy", "kmeans",
         "must be one of 'acfl', 'cfl', 'fedavg', 'fedem', 'fedmedian', 'fedprox'"),
        ("dataset", "imagenet", "must be one of 'digits', 'fashion-mnist'"),
        ("num-clusters", 0, "must be an int >= 1; got 0 (int)"),
        ("fraction-train", 1.5, "must be a number in (0, 1]; got 1.5 (float)"),
        # 0 samples no client: CFL (and every strategy) would train no one, unnamed.
        ("fraction-train", 0.0, "must be a number in (0, 1]; got 0.0 (float)"),
        # k-means (IFCA's and WeCFL's warm start) takes seeds below 2**32 only.
        ("seed", 2**32, "must be an int in [0, 4294967295]; got 4294967296 (int)"),
        ("seed", -1, "must be an int in [0, 4294967295]; got -1 (int)"),
        ("num-rounds", 2.5, "must be an int >= 1; got 2.5 (float)"),
        ("num-rounds", True, "must be an int >= 1; got True (bool)"),
        ("num-rounds", float("inf"), "must be an int >= 1; got inf (float)"),
        ("lr", "0.1", "must be a number >= 0; got '0.1' (str)"),
        ("mcfl", "yes", "must be a bool (True or False); got 'yes' (str)"),
        ("data-root", 3, "must be a string; got 3 (int)"),
    ],
)
def test_bad_value_names_key_value_and_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_run_config({key: value})
    message = str(err.value)
    assert message.startswith(f"run-config key '{key}' must be ")
    assert f'--run-config "{key}=..."' in message
    assert repr(value) in message
    assert allowed in message


def test_unknown_key_is_named() -> None:
    with pytest.raises(ValueError, match="num-cluster"):
        parse_run_config({"num-cluster": 3})


def test_toml_numbers_become_the_key_kind() -> None:
    settings = parse_run_config({"num-rounds": 3.0, "lr": 1})
    assert settings["num-rounds"] == 3 and type(settings["num-rounds"]) is int
    assert settings["lr"] == 1.0 and type(settings["lr"]) is float


def test_a_strategy_key_takes_its_constraint_from_the_declaration() -> None:
    with pytest.raises(ValueError, match=r"'ifca-server-lr' must be a number > 0; got 0 "):
        parse_run_config({"ifca-server-lr": 0})
    with pytest.raises(ValueError,
                       match=r"'acfl-converge-tolerance' must be a number in \(0, 1\); got 1.0"):
        parse_run_config({"acfl-converge-tolerance": 1.0})
    # fldc-eps 0 stands for "chosen by fldc-eps-method" (the constructor's None).
    assert parse_run_config({"fldc-eps": 0})["fldc-eps"] == 0.0
    with pytest.raises(ValueError, match=r"'fldc-eps' must be a number > 0 or 0.0; got -1.0"):
        parse_run_config({"fldc-eps": -1.0})


def test_keys_are_grouped_common_first_then_by_declaring_class() -> None:
    groups = {getattr(owner, "name", None) or getattr(owner, "__name__", ""): keys
              for owner, keys in key_groups()}
    assert [key.key for key in groups[""]][:2] == ["strategy", "dataset"]
    assert [key.key for key in groups["HardClusteredStrategy"]] == [
        "awcfl-beta", "mcfl", "mcfl-feature-samples"]
    assert [key.key for key in groups["fedsoft"]] == [
        "fedsoft-tau", "fedsoft-sigma", "fedsoft-clients-per-cluster", "fedsoft-lambda",
        "fedsoft-init"]
    assert "num-clusters" not in {key.key for key in groups["ifca"]}  # a common key


def test_the_largest_seed_accepted_runs_the_k_means_warm_start() -> None:
    import numpy as np

    from fl_clusters.clustering.assignment import group_by_kmeans

    settings = parse_run_config({"seed": 2**32 - 1})
    points = np.vstack([np.zeros((3, 2)), np.ones((3, 2))])
    groups = group_by_kmeans(points, 2, settings["seed"])
    assert len(set(groups[:3])) == 1 and len(set(groups[3:])) == 1
    assert groups[0] != groups[3]
