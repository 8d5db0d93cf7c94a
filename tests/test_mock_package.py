"""The mock server (``batchsync.mock``): its routes, its ``--help`` and its page (docs/mock.md)
list the same routes, each one the table answers on the page and each one on the page in the
table; and it stands beside the library, which never imports it."""

from __future__ import annotations

import re
import subprocess
import sys

from batchsync.mock.server import PROXY_HELP, ROUTES, route_of

from .mockserver import ROOT
from .test_layers import folder_of, imports_of, modules

PAGE = ROOT / "docs" / "mock.md"


def usages() -> list[str]:
    """Every route's usage as the help shows it: the table's, those under them, the proxy's."""
    found = []
    for route in ROUTES:
        found += [route.usage, *(usage for usage, _ in route.more)]
    return [*found, PROXY_HELP[0]]


def test_every_route_is_on_the_page_and_every_listed_route_is_one() -> None:
    routes = PAGE.read_text(encoding="utf-8").split("\n## Routes\n", 1)[1]
    listed = re.findall(r"^ *- `([^`]+)`:", routes, flags=re.MULTILINE)
    assert sorted(listed) == sorted(usages())


def test_the_help_lists_every_route() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "batchsync.mock", "--help"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
    ).stdout  # fmt: skip
    assert all(f"  {usage}\n" in shown for usage in usages()), shown


def test_each_route_answers_its_own_path() -> None:
    for route in ROUTES:
        assert route_of(route.path) is route
        assert route.exact or route_of(route.path + "/more") is route


def test_nothing_in_the_library_imports_the_mock() -> None:
    importers = {
        name: sorted(module for module in imports_of(name, path)[0] if folder_of(module) == "mock")
        for name, path in modules().items()
        if folder_of(name) != "mock"
    }
    assert {name: found for name, found in importers.items() if found} == {}
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, batchsync; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
    ).stdout  # fmt: skip
    assert "batchsync.mock" not in loaded
