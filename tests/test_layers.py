"""The package's layers: no module imports one placed after it, and the engine knows no HTTP.

Every module has one place in one order, lowest first, grouped in layers for the reader; a
module may import only modules placed before it, in its own layer as in those below, so the
check is made module by module and an import cycle (even through a layer's own modules) cannot
pass. Imports inside functions and ``TYPE_CHECKING`` blocks count.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "batchsync"

# Each layer's modules in their order: a module may import those before it.
LAYERS: list[tuple[str, list[str]]] = [
    (name, modules.split())
    for name, modules in [
        (
            "generic",
            "numbers rates tokens provider verdict kinds budget backoff origins history redact"
            " decide clock gates window announced limits tokenrate result records journal",
        ),
        ("engine", "task observe engine progress"),
        (
            "http",
            "guard watchdog headers cookies spec template decode httpfacts retries classify quota"
            " paginate transport hedge auth",
        ),
        ("options", "options"),
        ("jobs", "fetch calls"),
        (
            "integrations the assembly uses",
            "contrib.redis contrib.prometheus contrib.otel contrib.__init__",
        ),
        ("assembly", "resume assembly"),
        ("results written out", "columnar report resultset"),
        ("library", "batch api once __init__"),
        ("scale-out", "contrib.dask"),
        ("command line", "cli.inputs cli.output cli.options cli.signals cli.runner cli.command"),
        ("command line package", "cli.__init__"),
        ("entry point", "__main__"),
    ]
]
ORDER = [module for _, modules in LAYERS for module in modules]
PLACE = {module: place for place, module in enumerate(ORDER)}
LAYER = {module: name for name, modules in LAYERS for module in modules}
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
    if imported and (candidate in own or f"{candidate}.__init__" in own):
        return candidate
    return ".".join(parts) or "__init__"


def _as_module(name: str) -> str:
    return f"{name}.__init__" if name in ("cli", "contrib") else name


def test_every_module_has_one_place() -> None:
    assert len(ORDER) == len(PLACE), "a module is placed twice"
    assert set(modules()) == set(PLACE), "place new modules in LAYERS"


@pytest.mark.parametrize("name", ORDER)
def test_no_module_imports_one_placed_after_it(name: str) -> None:
    path = modules()[name]
    after = {
        module: LAYER[module]
        for module in imports_of(name, path)
        if module in PLACE and PLACE[module] >= PLACE[name] and module != name
    }
    assert after == {}, f"{name} ({LAYER[name]}) imports modules placed after it"


@pytest.mark.parametrize("name", sorted(HTTP_FREE))
def test_the_engine_and_what_it_stands_on_know_nothing_of_http(name: str) -> None:
    imported = imports_of(name, modules()[name])
    http = {
        module
        for module in imported
        if module.split(".")[0] in HTTP_LIBRARIES or PLACE.get(module, 0) >= PLACE["guard"]
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
    planted.write_text("from .. import __version__, contrib\nfrom ..spec import RequestSpec\n")
    assert imports_of("cli.command", planted) == {"contrib.__init__", "spec", "__init__"}


def test_the_command_line_starts_without_the_optional_integrations() -> None:
    """Starting the CLI imports no integration a run did not ask for (Dask, Redis)."""
    code = (
        "import sys; from batchsync.cli.command import main; "
        "print(sorted(m for m in sys.modules if m.startswith('batchsync.contrib.')))"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert shown.strip() == "[]"
