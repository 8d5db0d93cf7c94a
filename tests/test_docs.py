"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken
link, a missing anchor, a page left out of the nav or a reference to a name batchsync does not
have fails it. Its CLI reference, generated from the click command, names every option the
command has, and its library reference documents everything ``batchsync.__all__`` exports."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

import batchsync
from batchsync.cli import command

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_click")


def _missing_tools() -> list[str]:
    missing = []
    for name in TOOLS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


needs_mkdocs = pytest.mark.skipif(
    bool(_missing_tools()),
    reason=f"the docs extra is not installed ({', '.join(_missing_tools())} missing): "
    "pip install -e '.[docs]' (make test installs it)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # This checkout's batchsync, whatever else the environment has installed.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = os.environ | {"PYTHONPATH": path, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(
        [*build, "--config-file", str(ROOT / "mkdocs.yml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


def _text(page: Path) -> str:
    """A built page's text, tags dropped and entities read."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


@needs_mkdocs
def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in ("index", "getting-started/", "cli/", "library/", "reference/", "semantics/"):
        built = site / page / "index.html" if page.endswith("/") else site / f"{page}.html"
        assert built.is_file(), built
    assert (site / "benchmarks" / "index.html").is_file()


@needs_mkdocs
def test_the_cli_reference_is_generated_with_every_option_of_the_command(site: Path) -> None:
    page = (site / "cli" / "index.html").read_text()
    assert 'id="reference"' in page
    # The generated part only: the hand-written table above it does not count.
    reference = _text_of(page.split('id="reference"', 1)[1])
    assert "python -m batchsync" in reference
    assert "[OPTIONS] INPUT" in reference
    words = _words(reference)
    options = [p for p in command.params if isinstance(p, click.Option)]
    assert len(options) > 30
    for option in options:
        for flag in (*option.opts, *option.secondary_opts):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", reference), flag
        # Its help too, as far as markup allows: the words of its first line, in order.
        help_words = _words((option.help or "").split("\n")[0])[:8]
        assert " ".join(help_words) in " ".join(words), option.name


@needs_mkdocs
def test_the_library_reference_documents_every_export(site: Path) -> None:
    page = (site / "reference" / "index.html").read_text()
    for name in batchsync.__all__:
        assert f'id="batchsync.{name}"' in page, name
    text = _text(site / "reference" / "index.html")
    # From the docstrings, not written by hand.
    assert "Fetch every item" in text
    assert "Call fn(item) for every item" in " ".join(text.split())


def _text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def test_the_cli_pages_short_table_lists_every_option() -> None:
    """docs/cli.md's hand-written table, "## Options", has a row naming each flag."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    # The first cell of each row: the flags it names.
    cells = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `-")]
    for option in (p for p in command.params if isinstance(p, click.Option)):
        for flag in (*option.opts, *option.secondary_opts):
            if flag in ("-h", "--help"):
                continue
            pattern = rf"(?<![\w-]){re.escape(flag)}(?![\w-])"
            named = any(re.search(pattern, cell) for cell in cells)
            assert named, f"{flag}: add a row for it to the options table in docs/cli.md"
