"""The CLI stays thin, checked on the source: no function in ``slurm_pal/cli/`` grows past 80
lines (a command parses its options, calls one function of the library and prints), and the
simulator never reaches back into the CLI. Read with ``ast`` only: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "slurm_pal"
CLI = PACKAGE / "cli"
SIM = PACKAGE / "sim"
MAX_FUNCTION_LINES = 80


def _functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines from the ``def`` to the end of its body) of every function, nested ones and
    methods included; decorators do not count."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _package_of(path: Path) -> str:
    """``slurm_pal/sim/tune.py`` -> ``slurm_pal.sim``."""
    return ".".join(path.relative_to(PACKAGE.parent).parts[:-1])


def _imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, at any depth (function bodies and ``if TYPE_CHECKING``
    blocks included), relative imports resolved against ``package``, the one it is in."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _cli_imports(path: Path, package: str) -> list[str]:
    imported = _imports(path, package)
    return sorted(m for m in imported if m == "slurm_pal.cli" or m.startswith("slurm_pal.cli."))


@pytest.mark.parametrize("path", sorted(CLI.rglob("*.py")), ids=lambda p: p.name)
def test_no_cli_function_is_over_80_lines(path: Path) -> None:
    too_long = [(name, n) for name, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert not too_long, (
        f"cli/{path.name}: functions over {MAX_FUNCTION_LINES} lines: {too_long}; move what is "
        "not option parsing or printing into the library (sim/, campaigns/, ...)"
    )


@pytest.mark.parametrize("path", sorted(SIM.rglob("*.py")), ids=lambda p: p.name)
def test_the_simulator_imports_nothing_of_the_cli(path: Path) -> None:
    assert _cli_imports(path, _package_of(path)) == []


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The helpers find a long function and a CLI import, relative or not (so a passing test
    means something)."""
    long = tmp_path / "long.py"
    long.write_text("def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert _functions(long) == [("long", MAX_FUNCTION_LINES + 1)]
    imports = tmp_path / "imports.py"
    imports.write_text(
        "def lazy():\n"
        "    from slurm_pal.cli.common import fail\n"
        "from ..cli import sim\n"
        "import slurm_pal.sim.engine\n"
    )
    assert _cli_imports(imports, "slurm_pal.sim") == [
        "slurm_pal.cli",
        "slurm_pal.cli.common",
        "slurm_pal.cli.common.fail",
        "slurm_pal.cli.sim",
    ]
    assert _package_of(SIM / "peers" / "x.py") == "slurm_pal.sim.peers"
