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
        ("strategy", "kmeans", "acfl, cfl, fedavg, fedem, fedprox"),
        ("dataset", "imagenet", "digits, fashion-mnist"),
        ("num-clusters", 0, "int >= 1"),
        ("fraction-train", 1.5, "float in [0.0, 1.0]"),
        ("num-rounds", 2.5, "int >= 1"),
        ("mcfl", "yes", "bool"),
    ],
)
def test_bad_value_names_key_value_and_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_run_config({key: value})
    message = str(err.value)
    assert f"'{key}'" in message
    assert repr(value) in message
    assert allowed in message


def test_unknown_key_is_named() -> None:
    with pytest.raises(ValueError, match="num-cluster"):
        parse_run_config({"num-cluster": 3})


def test_whole_float_becomes_int() -> None:
    assert parse_run_config({"num-rounds": 3.0})["num-rounds"] == 3


def test_a_strategy_key_takes_its_constraint_from_the_declaration() -> None:
    with pytest.raises(ValueError, match=r"'ifca-server-lr'.*allowed: float > 0.0"):
        parse_run_config({"ifca-server-lr": 0})
    with pytest.raises(ValueError, match=r"'acfl-converge-tolerance'.*float in \(0.0, 1.0\)"):
        parse_run_config({"acfl-converge-tolerance": 1.0})
    # fldc-eps 0 stands for "chosen by fldc-eps-method" (the constructor's None).
    assert parse_run_config({"fldc-eps": 0})["fldc-eps"] == 0.0
    with pytest.raises(ValueError, match=r"allowed: 0.0 or float > 0.0"):
        parse_run_config({"fldc-eps": -1.0})


def test_keys_are_grouped_common_first_then_by_declaring_class() -> None:
    groups = {getattr(owner, "name", None) or getattr(owner, "__name__", ""): keys
              for owner, keys in key_groups()}
    assert [key.name for key in groups[""]][:2] == ["strategy", "dataset"]
    assert [key.name for key in groups["HardClusteredStrategy"]] == [
        "awcfl-beta", "mcfl", "mcfl-feature-samples"]
    assert [key.name for key in groups["fedsoft"]] == [
        "fedsoft-tau", "fedsoft-sigma", "fedsoft-clients-per-cluster", "fedsoft-lambda",
        "fedsoft-init"]
    assert "num-clusters" not in {key.name for key in groups["ifca"]}  # a common key
