"""A ceiling on the package's function size: no function or method above cyclomatic complexity 25, as radon
measures it. A function above it is split into named steps. Run with `-s` to see the ten most complex."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from radon.complexity import cc_visit
from radon.visitors import Class, Function
from support import REPO

PACKAGE = REPO / "exporter" / "oomguard"
CEILING = 25


class Measured(NamedTuple):
    complexity: int
    name: str
    where: str


def _functions(blocks: Iterable[Function | Class]) -> Iterator[Function]:
    """Every function and method, closures and inner classes' methods included: cc_visit lists the functions,
    the classes and their methods, but counts a closure apart from the function that holds it (a class only as
    the mean of its methods, so a class is not measured itself)."""
    for block in blocks:
        if isinstance(block, Class):
            for inner in block.inner_classes:
                yield from _functions([inner, *inner.methods])
        else:
            yield block
            yield from _functions(block.closures)


def measure(package: Path) -> list[Measured]:
    """Every function of the package with its complexity, the most complex first."""
    measured = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        for function in _functions(cc_visit(path.read_text(encoding="utf-8"))):
            name = f"{function.classname}.{function.name}" if function.classname else function.name
            measured.append(Measured(function.complexity, name, f"{where}:{function.lineno}"))
    return sorted(measured, key=lambda m: (-m.complexity, m.where))


def _lines(measured: Iterable[Measured]) -> str:
    return "\n".join(f"  {m.complexity:3d}  {m.name}  ({m.where})" for m in measured)


def test_the_package_has_functions_to_measure() -> None:
    measured = measure(PACKAGE)
    assert len(measured) > 500, f"radon found only {len(measured)} functions under {PACKAGE}"
    assert all(m.complexity >= 1 for m in measured)


def test_no_function_is_above_the_ceiling() -> None:
    measured = measure(PACKAGE)
    print(
        f"\nthe ten most complex functions of {PACKAGE.relative_to(REPO)} (ceiling {CEILING}):\n{_lines(measured[:10])}"
    )
    above = [m for m in measured if m.complexity > CEILING]
    assert not above, (
        f"{len(above)} function(s) above cyclomatic complexity {CEILING}; split each into named steps:\n"
        f"{_lines(above)}\nthe ten most complex:\n{_lines(measured[:10])}"
    )
