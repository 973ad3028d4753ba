"""Numbers in the README and docs/, rendered from the files under benchmarks/measured/.

A measured number in a page is written between two HTML comments, invisible when the
page is rendered::

    FedSoft reaches <!--m reproduce/fedsoft.json: d["personalized_accuracy"]-->0.909<!--/m-->

The opening comment names a file under ``benchmarks/measured/`` and, after the colon,
an expression over ``d``, the file's content: a ``.json`` file's object, a ``.jsonl``
file's list of lines, a ``.csv`` file's list of rows (numbers as floats). The
expression may index, do arithmetic, build lists and call :data:`FUNCTIONS`
(``mean``, ``std``, ``row(d, strategy="cfl")``, ``runs(d, "ari", strategy="cfl")`` for
a sweep's runs.jsonl, ...); nothing else. The written text
fixes the format: ``0.909`` is rendered with three decimals, ``+0.036`` keeps its sign,
``1,234`` its separator, ``12`` is rounded to a whole number, and whatever follows the
digits (``x``, `` s``, `` %``) is kept. A value that is a string or a list of strings
is written as it is (joined by ", "); a list of numbers written ``[3, 4, 4]`` as such
a list, each number like the first.

A table of a sweep is a block::

    <!--table sweeps/held-out-->
    | ... |
    <!--/table-->

rendered from the sweep folder's ``runs.jsonl`` and ``sweep.toml`` by
:func:`fl_clusters.sweep.report.markdown` (its table lines only).

A number from a sweep is stale when a run it rests on used a setting that has
another value now (:meth:`fl_clusters.sweep.cells.Cell.changed_settings`): a table
rests on every run of its sweep, an inline number on the lines of ``runs.jsonl``
its expression reads beyond their ``key``, ``cell`` and ``status``. A stale number
keeps rendering from its file, followed by a note the reader sees, rendered too
(``<!--stale-->(stale: 5 runs ran with paper-revision=1, now 2)<!--/stale-->``,
on the line after a table); the check names it, the run and the setting.

``python docs/measured_numbers.py`` rewrites every page in place, notes included
(``python docs/generate_strategies.py`` runs it too); ``--check`` lists the
numbers that disagree with their files, the stale numbers whose note is missing
or out of date, and the stale ones, and exits 1 if any disagree or lack their
note. tests/test_measured_docs.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import zip_longest
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "benchmarks" / "measured"
INLINE = re.compile(r"<!--m (?P<source>[^:>]+?): (?P<expr>.+?)-->(?P<text>.*?)<!--/m-->", re.S)
TABLE = re.compile(r"<!--table (?P<source>[^>]+?)-->\n(?P<text>.*?)<!--/table-->", re.S)
# A stale number's note: after an inline number on its line, after a table on the next.
STALE_NOTE = re.compile(r"(?: |\n)<!--stale-->(?P<text>.*?)<!--/stale-->", re.S)
WRITTEN_NUMBER = re.compile(r"^(?P<sign>[+-]?)(?P<whole>\d[\d,]*)(?:\.(?P<decimals>\d+))?"
                            r"(?P<suffix>\D*)$")


class MeasuredNumberError(ValueError):
    """A marker that cannot be evaluated: a missing file, a bad expression."""


def _row(rows: Sequence[Mapping[str, Any]], **match: Any) -> Mapping[str, Any]:
    """The one row whose fields equal ``match`` (strings compared as text)."""
    found = [r for r in rows if all(str(r.get(k)) == str(v) for k, v in match.items())]
    if len(found) != 1:
        raise MeasuredNumberError(f"row({match}) matches {len(found)} rows, not 1")
    return found[0]


def _runs(lines: Sequence[Mapping[str, Any]], field: str, **cell: Any) -> list[Any]:
    """``field`` of the summary of every ``ok`` line of a sweep's runs.jsonl whose cell
    labels equal ``cell`` (compared as text), in file order; the latest line of a
    cell counts."""
    latest = {line["key"]: line for line in lines}
    return [line["summary"][field] for line in latest.values() if line["status"] == "ok"
            and all(str(line["cell"].get(k)) == str(v) for k, v in cell.items())]


def _std(values: Sequence[float]) -> float:
    return statistics.stdev(values)


def _key(*parts: object) -> str:
    """A record key of ``|``-joined parts, ``key("cfl", "rotation", 0)``: a page's
    table cell cannot hold a literal ``|``, even inside a comment."""
    return "|".join(map(str, parts))


def _numbers_after(text: str, label: str) -> list[float]:
    """The number after each ``label`` in ``text``: the figures of a logged line,
    ``numbers_after("norm 0.7 < 0.8 | norm 0.5 < 0.8", "norm ")`` is [0.7, 0.5]."""
    number = r"\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
    return [float(found) for found in re.findall(re.escape(label) + number, text)]


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "mean": statistics.fmean, "median": statistics.median, "std": _std, "min": min,
    "max": max, "sum": sum, "len": len, "abs": abs, "round": round, "sorted": sorted,
    "row": _row, "sqrt": math.sqrt, "key": _key, "numbers_after": _numbers_after,
    "runs": _runs, "values": lambda mapping: list(mapping.values()),
}
# Expression nodes a marker may use: data access, arithmetic, comparisons, list
# building and calls of FUNCTIONS; no attributes, lambdas or imports.
_ALLOWED_NODES = (
    ast.Expression, ast.Subscript, ast.Constant, ast.Name, ast.Load, ast.Store,
    ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Compare, ast.cmpop, ast.BoolOp,
    ast.boolop, ast.IfExp, ast.Call, ast.keyword, ast.List, ast.Tuple, ast.Slice,
    ast.ListComp, ast.GeneratorExp, ast.comprehension,
)


def _check_expression(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise MeasuredNumberError(f"cannot parse {expr!r}: {err.msg}") from err
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise MeasuredNumberError(f"{expr!r} uses {type(node).__name__}, which a "
                                      "marker may not (index, arithmetic, calls only)")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
        ):
            raise MeasuredNumberError(f"{expr!r} calls something outside {sorted(FUNCTIONS)}")
    return tree


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


@cache
def load_measured(source: str) -> Any:
    """The content of ``benchmarks/measured/<source>`` (json, jsonl or csv)."""
    path = MEASURED / source
    if not path.is_file():
        raise MeasuredNumberError(f"benchmarks/measured/{source} does not exist")
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".csv":
        with path.open(newline="") as rows:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(rows)]
    raise MeasuredNumberError(f"benchmarks/measured/{source}: not a .json, .jsonl or .csv")


def evaluate(source: str, expr: str, content: Any = None) -> Any:
    """The value of ``expr`` over the content ``d`` of ``source`` (or ``content``)."""
    tree = _check_expression(expr)
    # One namespace as globals: a comprehension's body is a scope of its own and
    # sees globals only, so ``[r for r in d if d[r]]`` needs ``d`` there.
    data = load_measured(source) if content is None else content
    names = {"__builtins__": {}, "d": data, **FUNCTIONS}
    try:
        return eval(compile(tree, source, "eval"), names)
    except MeasuredNumberError:
        raise
    except Exception as err:  # any failure of the expression is the marker's
        raise MeasuredNumberError(f"{source}: {expr}: {type(err).__name__}: {err}") from err


def format_like(value: Any, written: str) -> str:
    """``value`` written the way ``written`` is (decimals, sign, separator, suffix)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and written.startswith("[") and written.endswith("]"):
        # A list of numbers, ``[3, 4, 4]``: each written like the first.
        first = written[1:-1].split(",")[0].strip() or "0"
        return "[" + ", ".join(format_like(v, first) for v in value) + "]"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MeasuredNumberError(f"value {value!r} is not a number or text")
    shape = WRITTEN_NUMBER.match(written.strip())
    if shape is None:
        raise MeasuredNumberError(f"{written!r} is not a written number")
    decimals = len(shape["decimals"] or "")
    spec = ("+" if shape["sign"] == "+" else "") + ("," if "," in shape["whole"] else "")
    text = f"{value:{spec}.{decimals}f}"
    return text + shape["suffix"]


def _sweep(folder_source: str) -> tuple[Any, list[dict[str, Any]]]:
    """The sweep file and runs of the folder ``benchmarks/measured/<folder_source>``."""
    from fl_clusters.sweep.runner import read_runs
    from fl_clusters.sweep.spec import load_sweep

    folder = MEASURED / folder_source
    if not (folder / "runs.jsonl").is_file() or not (folder / "sweep.toml").is_file():
        raise MeasuredNumberError(
            f"benchmarks/measured/{folder_source}: no runs.jsonl/sweep.toml"
        )
    return load_sweep(folder / "sweep.toml"), read_runs(folder / "runs.jsonl")


def sweep_table(source: str) -> str:
    """The table lines of the sweep whose folder is ``benchmarks/measured/<source>``."""
    from fl_clusters.sweep.report import markdown, table_rows

    sweep, runs = _sweep(source)
    text = markdown(sweep, table_rows(sweep, runs))
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("|"))


# The fields that pick a run's line out; reading any other field reads its numbers.
_SELECTING_FIELDS = ("key", "cell", "status")


class _WatchedLine(dict[str, Any]):
    """A line of runs.jsonl that records whether an expression read its numbers."""

    read = False

    def __getitem__(self, field: str) -> Any:
        if field not in _SELECTING_FIELDS:
            self.read = True
        return super().__getitem__(field)


def lines_read(source: str, expr: str) -> list[dict[str, Any]]:
    """The lines of the runs.jsonl ``source`` whose numbers ``expr`` reads."""
    watched = [_WatchedLine(line) for line in load_measured(source)]
    evaluate(source, expr, watched)
    return [line for line in watched if line.read]


@dataclass(frozen=True)
class Stale:
    """A number on a page that rests on a run whose settings have changed since."""

    line: int
    number: str
    run: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.number} rests on {self.run}, which {self.why}"


Sweeps = dict[str, tuple[Any, list[dict[str, Any]]]]


def _loaded(folder_source: str, sweeps: Sweeps) -> tuple[Any, list[dict[str, Any]]]:
    """:func:`_sweep` of ``folder_source``, read once into ``sweeps``."""
    if folder_source not in sweeps:
        sweeps[folder_source] = _sweep(folder_source)
    return sweeps[folder_source]


def _stale_in_table(source: str, sweeps: Sweeps) -> list[tuple[str, str]]:
    """``(run, why)`` for each stale run of the sweep table of ``source``."""
    from fl_clusters.sweep.report import stale_runs

    sweep, runs = _loaded(source, sweeps)
    return [(cell.name, "ran with " + "; ".join(map(str, changes)))
            for cell, changes in stale_runs(sweep, runs)]


def _stale_inline(source: str, expr: str, sweeps: Sweeps) -> list[tuple[str, str]]:
    """``(run, why)`` for each stale line of a runs.jsonl ``source`` that ``expr`` reads."""
    from fl_clusters.sweep.twins import latest_by_key, line_changes

    folder = source.rpartition("/")[0]
    sweep, runs = _loaded(folder, sweeps)
    cells = {cell.key: cell for cell in sweep.cells}
    latest = latest_by_key(runs)
    found = []
    for line in lines_read(source, expr):
        name = ",".join(f"{axis}={label}" for axis, label in line["cell"].items())
        cell = cells.get(line["key"])
        if cell is None:
            found.append((name, f"is no cell of {folder}/sweep.toml any more"))
        elif changes := line_changes(cell, line, latest, cells):
            found.append((name, "ran with " + "; ".join(map(str, changes))))
    return found


def _stale_markers(text: str) -> Iterator[tuple[re.Match[str], list[Stale]]]:
    """Every marker of ``text`` over a sweep with the stale runs its number rests on.

    A sweep's table rests on every run of the sweep; an inline number over a
    sweep's ``runs.jsonl`` on the lines its expression reads (:func:`lines_read`).
    """
    # Each sweep is read once a page.
    sweeps: Sweeps = {}
    for match in TABLE.finditer(text):
        source = match["source"].strip()
        yield match, [Stale(text.count("\n", 0, match.start()) + 1, f"table {source}", run, why)
                      for run, why in _stale_in_table(source, sweeps)]
    for match in INLINE.finditer(text):
        source, expr = match["source"].strip(), match["expr"].strip()
        if source.startswith("sweeps/") and source.endswith("/runs.jsonl"):
            number = f"{match['text']!r} ({source}: {expr})"
            yield match, [Stale(text.count("\n", 0, match.start()) + 1, number, run, why)
                          for run, why in _stale_inline(source, expr, sweeps)]


def stale_numbers(text: str) -> list[Stale]:
    """The numbers of ``text`` that rest on a sweep's run whose settings changed since."""
    found = [stale for _, stales in _stale_markers(text) for stale in stales]
    return sorted(found, key=lambda stale: stale.line)


def stale_note(stales: Sequence[Stale], table: bool) -> str:
    """The note a stale number carries on its page (``""`` for none): its runs and why."""
    if not stales:
        return ""
    whys = "; ".join(sorted({stale.why for stale in stales}))
    runs = f"{len(stales)} run{'s' if len(stales) > 1 else ''}"
    text = f"stale: {runs} {whys}"
    return ("\n" if table else " ") + f"<!--stale-->({text})<!--/stale-->"


def without_notes(text: str) -> str:
    """``text`` without its stale notes."""
    return STALE_NOTE.sub("", text)


@dataclass(frozen=True)
class NoteMismatch:
    """A stale number without its note, or with another, or a note on a current number."""

    line: int
    written: str
    rendered: str

    def __str__(self) -> str:
        return (f"line {self.line}: stale note written {self.written!r}, the runs give "
                f"{self.rendered!r}")


def note_mismatches(text: str) -> list[NoteMismatch]:
    """The markers of ``text`` whose stale note is not :func:`stale_note` of their runs."""
    found = []
    for match, stales in _stale_markers(text):
        note = STALE_NOTE.match(text, match.end())
        written = note[0] if note else ""
        if written != (rendered := stale_note(stales, match.re is TABLE)):
            found.append(NoteMismatch(text.count("\n", 0, match.start()) + 1, written, rendered))
    return found


@dataclass(frozen=True)
class Mismatch:
    """A written number that is not what its file gives."""

    line: int
    written: str
    rendered: str
    source: str
    expr: str

    def __str__(self) -> str:
        written, rendered = self.written, self.rendered
        if self.expr == "table":  # name the first row that differs, not the whole table
            pairs = zip_longest(written.splitlines(), rendered.splitlines(), fillvalue="")
            written, rendered = next((w, r) for w, r in pairs if w != r)
        return (f"line {self.line}: written {written!r}, {self.source} gives "
                f"{rendered!r} ({self.expr})")


def _markers(text: str) -> Iterator[tuple[re.Match[str], str]]:
    """Every marker of ``text`` with what its file renders, in order."""
    for match in TABLE.finditer(text):
        yield match, sweep_table(match["source"].strip())
    for match in INLINE.finditer(text):
        yield match, format_like(evaluate(match["source"].strip(), match["expr"].strip()),
                                 match["text"])


def mismatches(text: str) -> list[Mismatch]:
    """The markers of ``text`` whose written number differs from their file's."""
    found = []
    for match, rendered in _markers(text):
        if match["text"] != rendered:
            found.append(Mismatch(text.count("\n", 0, match.start()) + 1, match["text"],
                                  rendered, match["source"].strip(),
                                  match.groupdict().get("expr") or "table"))
    return sorted(found, key=lambda m: m.line)


def render(text: str) -> str:
    """``text`` with every marker's number rewritten from its file, and stale notes after
    the stale ones (:func:`stale_note`)."""
    text = without_notes(text)
    pieces, at = [], 0
    for match, rendered in sorted(_markers(text), key=lambda pair: pair[0].start()):
        pieces += [text[at:match.start("text")], rendered]
        at = match.end("text")
    text = "".join(pieces) + text[at:]
    notes = sorted(((match.end(), stale_note(stales, match.re is TABLE))
                    for match, stales in _stale_markers(text)), reverse=True)
    for end, note in notes:
        text = text[:end] + note + text[end:]
    return text


def pages() -> list[Path]:
    """The pages that may hold measured numbers: the README and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    """Rewrite every page's measured numbers and stale notes, or with ``--check`` list the
    numbers that disagree with their files, the missing notes and the stale numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="list mismatches and stale numbers, change nothing")
    args = parser.parse_args(argv)
    problems = 0
    for page in pages():
        text = page.read_text()
        if args.check:
            for problem in [*mismatches(text), *note_mismatches(text)]:
                print(f"{page.relative_to(ROOT)}: {problem}")
                problems += 1
            for number in stale_numbers(text):
                print(f"{page.relative_to(ROOT)}: {number}")
        elif (new := render(text)) != text:
            page.write_text(new)
            print(f"rendered {page.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
