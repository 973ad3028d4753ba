"""Measured numbers in the README and docs/ agree with the files they come from."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import load_script

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _renderer() -> ModuleType:
    return load_script(DOCS / "measured_numbers.py")


RENDERER = _renderer()


@pytest.mark.parametrize("page", RENDERER.pages(), ids=lambda p: p.name)
def test_every_measured_number_agrees_with_its_file(page: Path) -> None:
    stale = RENDERER.mismatches(page.read_text())
    assert not stale, (f"{page.name}: " + "; ".join(map(str, stale))
                       + " -- run: python docs/measured_numbers.py")


@pytest.mark.parametrize("page", RENDERER.pages(), ids=lambda p: p.name)
def test_a_number_resting_on_a_run_whose_settings_changed_is_marked_stale(page: Path) -> None:
    unmarked = RENDERER.note_mismatches(page.read_text())
    assert not unmarked, (f"{page.name}: " + "; ".join(map(str, unmarked))
                          + " -- run: python docs/measured_numbers.py, or the sweep again "
                          "(docs/sweeps.md, \"Keys and resuming\")")


def test_a_stale_number_renders_with_its_note_and_a_missing_note_is_found() -> None:
    text = (DOCS / "results.md").read_text()
    stale = RENDERER.stale_numbers(text)
    notes = list(RENDERER.STALE_NOTE.finditer(text))
    # The presets sweep's paper-preset runs ran before the preset's paper revision rose.
    assert any("paper-revision=1, now" in s.why for s in stale)
    assert len(notes) == len({(s.line, s.number) for s in stale})
    bare = RENDERER.without_notes(text)
    assert len(RENDERER.note_mismatches(bare)) == len(notes)
    assert RENDERER.render(bare) == text


def _sweep_folders() -> list[str]:
    return sorted(f"sweeps/{p.name}" for p in (RENDERER.MEASURED / "sweeps").iterdir()
                  if p.is_dir())


def _patch_key_groups(monkeypatch: pytest.MonkeyPatch,
                      change: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> None:
    """Make every run config validate with ``change`` applied to today's key groups."""
    import fl_clusters.config as config

    groups = change(config.key_groups())
    monkeypatch.setattr(config, "key_groups", lambda: groups)


def test_a_new_run_config_key_orphans_no_run_and_changes_no_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fl_clusters.config import config_keys
    from fl_clusters.params import Param
    from fl_clusters.sweep.report import latest_lines, stale_runs

    class NearestCentre:  # what a new strategy's declared parameter brings
        pass

    new_key = Param("init", "random", "str", "initial centres", choices=("random", "kmeans"),
                    key="fesem-init")
    stale_before = {folder: stale_runs(*RENDERER._sweep(folder)) for folder in _sweep_folders()}
    numbers_before = {page: RENDERER.stale_numbers(page.read_text())
                      for page in RENDERER.pages()}
    _patch_key_groups(monkeypatch, lambda groups: (*groups, (NearestCentre, (new_key,))))
    assert config_keys()["fesem-init"] == new_key
    for folder in _sweep_folders():
        sweep, runs = RENDERER._sweep(folder)
        assert all(cell.settings["fesem-init"] == "random" for cell in sweep.cells)
        assert len(latest_lines(sweep, runs)) == len({line["key"] for line in runs}), folder
        assert [(cell.name, changes) for cell, changes in stale_runs(sweep, runs)] == [
            (cell.name, changes) for cell, changes in stale_before[folder]], folder
    for page in RENDERER.pages():
        text = page.read_text()
        assert RENDERER.render(text) == text, page.name
        assert RENDERER.stale_numbers(text) == numbers_before[page], page.name


def of_its_preset(expr: str, cells: set[str]) -> set[str]:
    """The ``cells`` a number reads: one preset's runs only when ``expr`` picks a preset."""
    if 'preset="paper"' in expr:
        return {cell for cell in cells if "preset=paper" in cell}
    if 'preset="robust"' in expr:
        return {cell for cell in cells if "preset=paper" not in cell}
    return cells


def test_a_changed_default_names_exactly_the_numbers_that_rest_on_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from dataclasses import replace

    from fl_clusters.sweep.cells import keys_the_paper_sets
    from fl_clusters.sweep.report import latest_lines

    stale_before = {page: {(s.line, s.number, s.run)
                           for s in RENDERER.stale_numbers(page.read_text())}
                    for page in RENDERER.pages()}
    _patch_key_groups(monkeypatch, lambda groups: tuple(
        (owner, tuple(replace(key, default=0.5) if key.key == "cfl-eps2" else key
                      for key in keys)) for owner, keys in groups))
    # The runs that used the old default: CFL's, where the sweep left cfl-eps2 unset
    # and no paper preset replaced it with the paper's value.
    used_it: dict[str, set[str]] = {}
    for folder in _sweep_folders():
        sweep, runs = RENDERER._sweep(folder)
        used_it[folder] = {cell.name for cell in sweep.cells
                           if cell.key in latest_lines(sweep, runs)
                           and cell.settings["strategy"] == "cfl"
                           and "cfl-eps2" not in cell.run_config
                           and "cfl-eps2" not in keys_the_paper_sets(cell.settings)}
    assert sum(map(len, used_it.values())) >= 30
    reported_somewhere = False
    changed = "cfl-eps2=0.45, now 0.5"
    for page in RENDERER.pages():
        text = page.read_text()
        stale = RENDERER.stale_numbers(text)
        # A number stale before (a paper revision since) may be stale for more now.
        assert all(changed in s.why or (s.line, s.number, s.run) in stale_before[page]
                   for s in stale)
        stale = [s for s in stale if changed in s.why]
        # Stale numbers keep rendering, with a note that the page has yet to carry.
        assert RENDERER.without_notes(RENDERER.render(text)) == RENDERER.without_notes(text)
        for match in RENDERER.TABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            assert {s.run for s in stale if s.line == line} == used_it[match["source"]]
        for match in RENDERER.INLINE.finditer(text):
            source, expr = match["source"].strip(), match["expr"].strip()
            if not source.endswith("/runs.jsonl"):
                continue
            line = text.count("\n", 0, match.start()) + 1
            number = f"{match['text']!r} ({source}: {expr})"
            runs = {s.run for s in stale if (s.line, s.number) == (line, number)}
            reads_cfl = '"cfl"' in expr or "strategy=" not in expr
            expected = bool(reads_cfl and of_its_preset(expr, used_it[source.rpartition("/")[0]]))
            assert bool(runs) == expected, (page.name, line, expr)
            assert all("strategy=cfl" in run for run in runs)
            reported_somewhere |= bool(runs)
    assert reported_somewhere
    assert RENDERER.main(["--check"]) == 1
    printed = capsys.readouterr().out
    assert ("rests on seed=0,model=mlp,strategy=cfl,structure=rotation,data=digits, which "
            "ran with cfl-eps2=0.45, now 0.5") in printed


def test_the_pages_carry_measured_numbers() -> None:
    counts = {p.name: len(RENDERER.INLINE.findall(p.read_text())) for p in RENDERER.pages()}
    assert counts["README.md"] >= 1 and counts["results.md"] >= 10, counts


def test_a_number_edited_by_hand_is_found() -> None:
    text = (DOCS / "results.md").read_text()
    marker = next(RENDERER.INLINE.finditer(text))
    written = marker["text"]
    edited_digit = re.search(r"\d", written)
    assert edited_digit is not None
    digit = edited_digit.start()
    other = "1" if written[digit] != "1" else "2"
    edited = (text[:marker.start("text") + digit] + other
              + text[marker.start("text") + digit + 1:])
    stale = RENDERER.mismatches(edited)
    assert len(stale) == 1 and stale[0].rendered == written
    assert RENDERER.render(edited) == text


def test_every_file_a_page_cites_records_its_provenance() -> None:
    for page in RENDERER.pages():
        text = page.read_text()
        for match in RENDERER.INLINE.finditer(text):
            source = match["source"].strip()
            path = RENDERER.MEASURED / source
            if path.suffix == ".json":
                record = RENDERER.load_measured(source)
                assert isinstance(record, dict) and "provenance" in record, (page.name, source)
            else:
                assert (path.parent / "manifest.json").is_file(), (page.name, source)


@pytest.mark.parametrize(("value", "written", "expected"), [
    (0.90947, "0.910", "0.909"),
    (0.036, "+0.01", "+0.04"),
    (1234.4, "1,000 s", "1,234 s"),
    (3.26, "3.1x", "3.3x"),
    (12.6, "9", "13"),
    (["ifca", "cfl"], "x", "ifca, cfl"),
    ([3, 4, 5], "[3, 4, 4]", "[3, 4, 5]"),
    ([0.51, 0.27], "[0.1]", "[0.5, 0.3]"),
    ([], "[3]", "[]"),
])
def test_a_value_is_written_the_way_the_page_writes_it(value: object, written: str,
                                                       expected: str) -> None:
    assert RENDERER.format_like(value, written) == expected


@pytest.mark.parametrize("expr", ["d.__class__", "__import__('os')", "(lambda: 1)()",
                                  "open('x')"])
def test_a_marker_runs_no_code_but_data_access(expr: str) -> None:
    with pytest.raises(RENDERER.MeasuredNumberError):
        RENDERER.evaluate("sweep_speed-2cells.json", expr)


def test_a_comprehension_sees_the_file_and_the_functions() -> None:
    value = RENDERER.evaluate("flhc_copies.json",
                              "len([k for k in d if k != 'provenance' and d[k] != mean([1])])")
    assert value == len(RENDERER.load_measured("flhc_copies.json")) - 1


def test_a_key_of_parts_reads_a_record_without_a_pipe_in_the_page() -> None:
    matrix = RENDERER.load_measured("clustering_matrix.json")
    value = RENDERER.evaluate("clustering_matrix.json",
                              'd[key("cfl", "rotation", "digits", "mlp", 0)]["ari"]')
    assert value == matrix["cfl|rotation|digits|mlp|0"]["ari"]


def test_numbers_after_reads_each_figure_of_a_logged_line() -> None:
    line = ("CFL round 3 gate: cluster 0 (6 trained): |mean|/avg norm 0.332 < 0.8, max 4.073 "
            "> 0 | cluster 1 (3 trained): |mean|/avg norm 0.739 < 0.8, max 1.2e-3 > 0")
    numbers_after = RENDERER.FUNCTIONS["numbers_after"]
    assert numbers_after(line, "avg norm ") == [0.332, 0.739]
    assert numbers_after(line, "max ") == [4.073, 0.0012]
    assert numbers_after(line, "silhouette ") == []


def test_a_missing_file_is_named() -> None:
    with pytest.raises(RENDERER.MeasuredNumberError, match=r"no-such\.json does not exist"):
        RENDERER.evaluate("no-such.json", "d")


def test_runs_reads_the_latest_ok_line_of_each_matching_cell() -> None:
    def line(key: str, strategy: str, status: str, ari: float) -> dict[str, object]:
        return {"key": key, "cell": {"strategy": strategy, "seed": "0"}, "status": status,
                "summary": {"ari": ari} if status == "ok" else None}

    lines = [line("a", "ifca", "failed", 0.0), line("b", "cfl", "ok", 0.5),
             line("a", "ifca", "ok", 1.0), line("c", "ifca", "ok", 0.25)]
    assert RENDERER.FUNCTIONS["runs"](lines, "ari", strategy="ifca") == [1.0, 0.25]
    assert RENDERER.FUNCTIONS["runs"](lines, "ari", strategy="cfl", seed=0) == [0.5]


def test_a_sweep_table_block_is_the_sweeps_own_table() -> None:
    text = (DOCS / "results.md").read_text()
    block = next(b for b in RENDERER.TABLE.finditer(text) if b["source"] == "sweeps/presets")
    assert block["text"].startswith("| preset | strategy |")
    edited = text.replace(block["text"], block["text"].replace("| robust |", "| paper |", 1))
    assert [m.expr for m in RENDERER.mismatches(edited)] == ["table"]


def test_the_recipe_axis_section_is_rendered_from_its_file() -> None:
    # benchmarks/recipe_matrix.py writes the last section of docs/clustering-matrix.md
    # from benchmarks/measured/recipe_matrix.json (its grid runs the plug-in example,
    # which a sweep of the built-in app cannot).
    recipes = load_script(DOCS.parent / "benchmarks" / "recipe_matrix.py")
    page = (DOCS / "clustering-matrix.md").read_text()
    assert page[page.index(recipes.SECTION):] == recipes.section(recipes.load(recipes.OUT)), (
        "docs/clustering-matrix.md's recipe section is stale: run "
        "python benchmarks/recipe_matrix.py --table")
