"""The package's layers are its folders: each folder's ``__init__`` says which others it may
import, every module keeps to its folder's word, the folders stand in one order, and the
engine and the limits know nothing of HTTP.

Imports inside functions and ``TYPE_CHECKING`` blocks count. Within a folder, no import goes
round in a cycle. The development page's table of layers is this rule, written out.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "batchsync"
DEVELOPMENT_PAGE = PACKAGE.parent / "docs" / "development.md"
FOLDERS = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
# The top: the public names (``__init__``) and the entry point, above every folder but cli.
ROOF = {"__init__": set(FOLDERS) - {"cli"}, "__main__": {"cli"}}
# Folders that run any job: they import nothing that speaks HTTP.
HTTP_FREE = ("core", "limits")
HTTP_LIBRARIES = {"requests", "urllib3", "http"}
_MAY_IMPORT = re.compile(r"^May import: (.*)\.$", re.MULTILINE)


def modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE).with_suffix("").parts): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def folder_of(module: str) -> str:
    """The folder a module is in (``core`` for ``core.engine``); the roof's own name for the
    package's ``__init__`` and ``__main__``."""
    return module.split(".", maxsplit=1)[0]


def docstring(folder: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""


def may_import(folder: str) -> set[str]:
    """The other folders ``folder`` says it may import, from its ``__init__``'s docstring."""
    if folder in ROOF:
        return ROOF[folder]
    said = _MAY_IMPORT.findall(docstring(folder))
    assert len(said) == 1, f"{folder}/__init__.py must end its docstring with 'May import: ….'"
    if said[0] == "nothing else of the package":
        return set()
    if said[0] == "every other folder, and the package's public names":
        return set(FOLDERS) - {folder} | {"__init__"}
    return {name.strip() for name in said[0].split(",")}


def imports_of(name: str, path: Path) -> tuple[set[str], set[str]]:
    """What module ``name`` imports: the package's own modules (named like ``cli.runner``,
    imported relatively or as ``batchsync.…``), and other libraries by their top-level name."""
    package = name.split(".")[:-1]
    own_modules = set(modules())
    own: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "batchsync":
                    own.add(_named(parts[1:], [], own_modules))
                else:
                    others.add(parts[0])
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".") if node.module else []
            if node.level == 0 and module[0] != "batchsync":
                others.add(module[0])
                continue
            if node.level == 0:
                module = module[1:]
            base = package[: len(package) - (node.level - 1)] if node.level else []
            own.update(_named([*base, *module], [alias.name], own_modules) for alias in node.names)
    return own, others


def _named(parts: list[str], imported: list[str], own: set[str]) -> str:
    """The module a dotted path names; with ``imported`` (``from X import y``), X.y when that
    is a module, else X; a folder by its ``__init__``."""
    for candidate in (".".join([*parts, *imported]), ".".join(parts)):
        if candidate in own:
            return candidate
        if f"{candidate}.__init__" in own or candidate == "":
            return f"{candidate}.__init__".lstrip(".")
    raise AssertionError(f"no module {'.'.join(parts)} in the package")


def test_every_module_is_in_a_folder() -> None:
    assert {name for name in modules() if "." not in name} == set(ROOF)


def test_each_folder_names_only_folders() -> None:
    for folder in FOLDERS:
        assert may_import(folder) <= set(FOLDERS) | {"__init__"} - {folder}, folder


def test_the_folders_stand_in_one_order() -> None:
    """No folder may import one that may import it, by any way round."""
    rule = {folder: may_import(folder) for folder in [*FOLDERS, *ROOF]}
    try:
        order = list(TopologicalSorter(rule).static_order())
    except CycleError as exc:
        pytest.fail(f"the folders' rule goes round: {exc.args[1]}")
    assert order.index("core") == 0


@pytest.mark.parametrize("folder", [*FOLDERS, *ROOF])
def test_a_folder_imports_only_what_it_says(folder: str) -> None:
    allowed = may_import(folder) | {folder}
    strays = {
        name: sorted(
            module for module in imports_of(name, path)[0] if folder_of(module) not in allowed
        )
        for name, path in modules().items()
        if folder_of(name) == folder
    }
    assert {name: found for name, found in strays.items() if found} == {}


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_import_goes_round_within_a_folder(folder: str) -> None:
    graph = {
        name: {module for module in imports_of(name, path)[0] if folder_of(module) == folder}
        - {name}
        for name, path in modules().items()
        if folder_of(name) == folder
    }
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"an import cycle in {folder}/: {exc.args[1]}")


@pytest.mark.parametrize("folder", HTTP_FREE)
def test_the_engine_and_the_limits_know_nothing_of_http(folder: str) -> None:
    assert not may_import(folder) - set(HTTP_FREE), f"{folder} may import a folder of HTTP"
    spoken = {
        name: others & HTTP_LIBRARIES
        for name, path in modules().items()
        if folder_of(name) == folder
        for others in [imports_of(name, path)[1]]
    }
    assert {name: found for name, found in spoken.items() if found} == {}


def test_the_checks_see_an_upward_import(tmp_path: Path) -> None:
    """The checks themselves: an engine importing the HTTP job and requests is caught."""
    planted = tmp_path / "engine.py"
    planted.write_text("from ..jobs.fetch import HttpJob\nimport requests\nimport http.client\n")
    assert imports_of("core.engine", planted) == ({"jobs.fetch"}, {"requests", "http"})
    planted.write_text(
        "from batchsync.jobs.fetch import HttpJob\nimport batchsync.http.transport\n"
        "from batchsync.http import spec\nfrom batchsync.cli import runner\n"
        "from .. import limits\nfrom . import verdict\n"
    )
    own = {"jobs.fetch", "http.transport", "http.spec", "cli.runner", "limits.__init__"}
    assert imports_of("core.engine", planted) == (own | {"core.verdict"}, set())
    assert {folder_of(module) for module in own} - may_import("core") - {"core"} == {
        "jobs", "http", "cli", "limits"
    }  # fmt: skip
    planted.write_text("from .. import __version__, contrib\nfrom ..http.spec import RequestSpec\n")
    assert imports_of("cli.command", planted)[0] == {"contrib.__init__", "http.spec", "__init__"}


def layer_table() -> str:
    """The development page's table of the folders, bottom up, from their ``__init__``s."""
    order = list(TopologicalSorter({f: may_import(f) for f in FOLDERS}).static_order())
    rows = ["| folder | may import | modules |", "| --- | --- | --- |"]
    for folder in (name for name in order if name in FOLDERS):
        allowed = may_import(folder)
        said = "every other folder" if folder == "cli" else ", ".join(
            f"`{name}/`" for name in order if name in allowed
        ) or "nothing else"  # fmt: skip
        names = sorted(
            [p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__"]
            + [p.parent.name for p in (PACKAGE / folder).glob("*/__init__.py")]
        )
        rows.append(f"| `{folder}/` | {said} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows) + "\n"


def test_the_development_page_states_the_rule() -> None:
    """docs/development.md holds this table as the folders' ``__init__``s make it."""
    assert layer_table() in DEVELOPMENT_PAGE.read_text(), "update docs/development.md:\n" + (
        layer_table()
    )


def test_the_command_line_starts_without_the_optional_integrations() -> None:
    """Starting the CLI imports no integration a run did not ask for (Dask, Redis)."""
    code = (
        "import sys; from batchsync.cli.command import main; "
        "print(sorted(m for m in sys.modules if m.startswith(('batchsync.contrib.', "
        "'batchsync.run.cluster', 'distributed', 'redis'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert shown.strip() == "[]"


# --- one way out: every HTTP request leaves through http/ ----------------------------------------
# Modules that open connections themselves; outside http/ none is imported (urllib3 only for its
# exceptions), none is loaded by name, and no requests call sends.
NETWORK_MODULES = {"socket", "ssl", "http.client", "urllib.request", "urllib3", "requests"}
SENDING_CALLS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "send"}
# contrib/ talks to its own services (Redis, a Dask scheduler) through their clients.
OWN_WIRES = ("http", "contrib")


def network_calls(path: Path) -> list[str]:
    """What in a module could send a request without going through http/: an import of a
    module that opens connections (requests only for its types and Request), one loaded by
    name (``importlib``, ``__import__``), or a call that sends (``requests.get``,
    ``session.request``, ``….send`` on a session)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name in NETWORK_MODULES - {"requests", "urllib3"} or (
                    name.startswith(("urllib3.", "http.client"))
                    and not name.startswith("urllib3.exceptions")
                ):
                    found.append(f"imports {name}")
        elif isinstance(node, ast.Call):
            func = node.func
            text = ast.unparse(func)
            if isinstance(func, ast.Name) and func.id == "__import__":
                found.append(text)
            elif text.endswith("import_module") and not (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] not in {"socket", "ssl", "http"}
                and str(node.args[0].value) not in NETWORK_MODULES
            ):
                found.append(f"{text}({', '.join(ast.unparse(arg) for arg in node.args)})")
            elif isinstance(func, ast.Attribute):
                owner = ast.unparse(func.value)
                if (
                    owner == "urllib3"
                    or (owner == "requests" and func.attr in SENDING_CALLS | {"Session"})
                    or (func.attr in {"request", "send"} and "session" in owner.lower())
                ):
                    found.append(text)
    return found


def test_every_request_leaves_through_http() -> None:
    strays = {
        name: found
        for name, path in modules().items()
        if folder_of(name) not in OWN_WIRES
        for found in [network_calls(path)]
        if found
    }
    assert strays == {}


def test_the_one_way_out_check_sees_each_way_round(tmp_path: Path) -> None:
    planted = tmp_path / "client.py"
    planted.write_text(
        "import socket\nimport urllib3.poolmanager\nfrom http.client import HTTPConnection\n"
        "import importlib\nimport requests\nfrom urllib3.exceptions import HTTPError\n"
        "requests.post('u')\nself._session.request('GET', 'u')\nrequests.Session().get('u')\n"
        "importlib.import_module('http.client')\n__import__('socket')\n"
        "importlib.import_module(name)\nimportlib.import_module('tiktoken')\n"
        "requests.Request('GET', 'u')\nurllib3.PoolManager()\n"
    )
    assert sorted(network_calls(planted)) == sorted([
        "imports socket", "imports urllib3.poolmanager", "imports http.client",
        "requests.post", "self._session.request", "requests.Session",
        "importlib.import_module('http.client')", "__import__",
        "importlib.import_module(name)", "urllib3.PoolManager",
    ])  # fmt: skip
