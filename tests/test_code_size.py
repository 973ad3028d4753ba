"""The project's Python code keeps its modules short and its functions shorter.

No module of fl_clusters/, docs/, deploy/, benchmarks/ or examples/ is over
:data:`MODULE_LIMIT` lines and no function there (``def`` or ``async def``,
methods and nested functions included, its docstring counted, its decorators
not) is over :data:`FUNCTION_LIMIT`. tests/ are exempt. The files are the ones
git tracks, so untracked scratch files are not read.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterable
from pathlib import Path

from tests.conftest import ROOT

MODULE_LIMIT = 450
FUNCTION_LIMIT = 60
CHECKED = ("fl_clusters", "docs", "deploy", "benchmarks", "examples")
# Folders a checkout may hold that are no source of the project's.
NOT_SOURCE = {".venv", "venv", "build", "dist", "__pycache__", "node_modules", ".git"}
FIX = (
    "Fix: move a cohesive piece (a class, a family of helpers, a block of data) into a "
    "module of its own beside it and import it from there; split a long function into "
    "named steps. Do not cram lines to get under the limit."
)


def project_files(root: Path) -> list[Path]:
    """The Python files of :data:`CHECKED` under ``root``: those git tracks, or, outside a
    git checkout, every one not under a folder of :data:`NOT_SOURCE`."""
    if (root / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z", "--", *CHECKED], cwd=root,
                                capture_output=True, check=True).stdout.decode()
        names: Iterable[Path] = (Path(name) for name in listed.split("\0") if name)
    else:
        names = (path.relative_to(root) for folder in CHECKED
                 for path in (root / folder).rglob("*.py"))
    return sorted(root / name for name in names
                  if name.suffix == ".py" and not NOT_SOURCE & set(name.parts)
                  and (root / name).is_file())


def oversized(path: Path, root: Path) -> list[str]:
    """One line per limit ``path`` exceeds: the module's length, each long function's."""
    text = path.read_text()
    where = path.relative_to(root)
    found = []
    lines = len(text.splitlines())
    if lines > MODULE_LIMIT:
        found.append(f"{where}: module of {lines} lines (limit {MODULE_LIMIT})")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LIMIT:
                found.append(f"{where}:{node.lineno}: function {node.name} of {length} "
                             f"lines (limit {FUNCTION_LIMIT})")
    return found


def test_no_module_or_function_is_over_its_limit() -> None:
    files = project_files(ROOT)
    assert len(files) > 50, f"found only {len(files)} Python files under {CHECKED}"
    problems = [line for path in files for line in oversized(path, ROOT)]
    assert not problems, "\n".join([*problems, FIX])


def test_the_check_names_a_long_module_and_a_long_nested_function(tmp_path: Path) -> None:
    nested = ["def outer():", "    def inner():", *["        x = 1"] * FUNCTION_LIMIT,
              "    return inner"]
    source = "\n".join([*nested, *["y = 2"] * (MODULE_LIMIT - len(nested) + 1)]) + "\n"
    at_limit = "\n".join(["def at_limit():", *["    x = 1"] * (FUNCTION_LIMIT - 1)]) + "\n"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "long.py").write_text(source)
    (tmp_path / "benchmarks" / "short.py").write_text(at_limit)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "exempt.py").write_text(source)

    files = project_files(tmp_path)  # no git checkout: every .py of the checked folders
    assert [path.name for path in files] == ["long.py", "short.py"]
    problems = [line for path in files for line in oversized(path, tmp_path)]
    assert problems == [
        f"benchmarks/long.py: module of {MODULE_LIMIT + 1} lines (limit {MODULE_LIMIT})",
        f"benchmarks/long.py:1: function outer of {FUNCTION_LIMIT + 3} lines "
        f"(limit {FUNCTION_LIMIT})",
        f"benchmarks/long.py:2: function inner of {FUNCTION_LIMIT + 1} lines "
        f"(limit {FUNCTION_LIMIT})",
    ]
