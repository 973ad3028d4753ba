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

``python docs/measured_numbers.py`` rewrites every page in place (``python
docs/generate_strategies.py`` runs it too); ``--check`` lists the numbers that
disagree with their files and exits 1. tests/test_measured_docs.py runs the check.
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


def evaluate(source: str, expr: str) -> Any:
    """The value of ``expr`` over the content ``d`` of ``source``."""
    tree = _check_expression(expr)
    # One namespace as globals: a comprehension's body is a scope of its own and
    # sees globals only, so ``[r for r in d if d[r]]`` needs ``d`` there.
    names = {"__builtins__": {}, "d": load_measured(source), **FUNCTIONS}
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


def sweep_table(source: str) -> str:
    """The table lines of the sweep whose folder is ``benchmarks/measured/<source>``."""
    from fl_clusters.sweep.report import markdown, table_rows
    from fl_clusters.sweep.runner import read_runs
    from fl_clusters.sweep.spec import load_sweep

    folder = MEASURED / source
    if not (folder / "runs.jsonl").is_file() or not (folder / "sweep.toml").is_file():
        raise MeasuredNumberError(f"benchmarks/measured/{source}: no runs.jsonl/sweep.toml")
    sweep = load_sweep(folder / "sweep.toml")
    text = markdown(sweep, table_rows(sweep, read_runs(folder / "runs.jsonl")))
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("|"))


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
    """``text`` with every marker's number rewritten from its file."""
    pieces, at = [], 0
    for match, rendered in sorted(_markers(text), key=lambda pair: pair[0].start()):
        pieces += [text[at:match.start("text")], rendered]
        at = match.end("text")
    return "".join(pieces) + text[at:]


def pages() -> list[Path]:
    """The pages that may hold measured numbers: the README and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    """Rewrite every page's measured numbers, or with ``--check`` list the stale ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list mismatches, change nothing")
    args = parser.parse_args(argv)
    stale = 0
    for page in pages():
        text = page.read_text()
        if args.check:
            for mismatch in mismatches(text):
                print(f"{page.relative_to(ROOT)}: {mismatch}")
                stale += 1
        elif (new := render(text)) != text:
            page.write_text(new)
            print(f"rendered {page.relative_to(ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
