"""The package's layers: no module imports one above it, and the engine knows nothing of HTTP.

Every module is placed in exactly one layer, lowest first; a module may import modules of its
own layer and of those below. Imports inside functions and ``TYPE_CHECKING`` blocks count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "batchsync"

LAYERS: list[tuple[str, set[str]]] = [
    (name, set(modules.split()))
    for name, modules in [
        (
            "generic",
            "verdict budget backoff origins history result records journal report redact decide"
            " limits columnar clock gates",
        ),
        ("engine", "engine observe progress"),
        (
            "http",
            "guard watchdog headers cookies spec template decode classify quota paginate transport"
            " hedge auth",
        ),
        ("options", "options"),
        ("jobs", "fetch calls"),
        ("integrations the assembly uses", "contrib.redis contrib.prometheus contrib.otel"),
        ("assembly", "assembly"),
        ("library", "batch api once __init__ contrib.__init__"),
        ("scale-out", "contrib.dask"),
        ("command line", "cli.inputs cli.output cli.options cli.signals cli.runner cli.command"),
        ("command line package", "cli.__init__"),
        ("entry point", "__main__"),
    ]
]
LEVEL = {module: level for level, (_, modules) in enumerate(LAYERS) for module in modules}
# Layers below the HTTP one: they run any job, so they import nothing that speaks HTTP.
HTTP_FREE = {module for _, modules in LAYERS[:2] for module in modules}
HTTP_LIBRARIES = ("requests", "urllib3", "http")


def modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE).with_suffix("").parts): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def imports_of(name: str, path: Path) -> set[str]:
    """The modules ``name`` imports: the package's own as names like ``cli.runner`` (imported
    relatively or as ``batchsync.…``), others by their top-level name."""
    package = name.split(".")[:-1]
    own = set(modules())
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(_named(alias.name.split("."), [], own) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".") if node.module else []
            if node.level == 0 and module[0] != "batchsync":
                found.add(module[0])
                continue
            base = package[: len(package) - (node.level - 1)] if node.level else []
            found.update(_named([*base, *module], [alias.name], own) for alias in node.names)
    return {_as_module(module) for module in found}


def _named(parts: list[str], imported: list[str], own: set[str]) -> str:
    """The module a dotted path names, ``batchsync.`` left out; with ``imported`` (``from X
    import y``), X.y when that is a module, else X."""
    if parts[:1] == ["batchsync"]:
        parts = parts[1:]
    elif parts and parts[0] not in own and ".".join(parts) not in own and not imported:
        return parts[0]  # another library
    candidate = ".".join([*parts, *imported])
    return candidate if imported and candidate in own else ".".join(parts) or "__init__"


def _as_module(name: str) -> str:
    return f"{name}.__init__" if name in ("cli", "contrib") else name


def test_every_module_has_a_layer() -> None:
    assert set(modules()) == set(LEVEL), "place new modules in LAYERS"


@pytest.mark.parametrize("name", sorted(LEVEL))
def test_no_module_imports_one_above_it(name: str) -> None:
    path = modules()[name]
    above = {
        module: LAYERS[LEVEL[module]][0]
        for module in imports_of(name, path)
        if module in LEVEL and LEVEL[module] > LEVEL[name]
    }
    assert above == {}, f"{name} ({LAYERS[LEVEL[name]][0]}) imports from above"


@pytest.mark.parametrize("name", sorted(HTTP_FREE))
def test_the_engine_and_what_it_stands_on_know_nothing_of_http(name: str) -> None:
    imported = imports_of(name, modules()[name])
    http = {
        module
        for module in imported
        if module.split(".")[0] in HTTP_LIBRARIES or LEVEL.get(module, 0) >= LEVEL["guard"]
    }
    assert http == set()


def test_the_checks_see_an_upward_import(tmp_path: Path) -> None:
    """The checks themselves: an engine importing the HTTP job and requests is caught."""
    planted = tmp_path / "engine.py"
    planted.write_text("from .fetch import HttpJob\nimport requests\n")
    assert imports_of("engine", planted) == {"fetch", "requests"}
    planted.write_text(
        "from batchsync.fetch import HttpJob\nimport batchsync.transport\n"
        "from batchsync import spec\nfrom batchsync.cli import runner\n"
    )
    assert imports_of("engine", planted) == {"fetch", "transport", "spec", "cli.runner"}
    runner = tmp_path / "runner.py"
    runner.write_text("from ..assembly import fetch\nfrom .signals import EXIT_INTERRUPTED\n")
    assert imports_of("cli.runner", runner) == {"assembly", "cli.signals"}
