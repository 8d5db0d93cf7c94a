"""What ``pip install batchsync`` brings: the built wheel holds the mock server, and the mock
runs from the wheel alone with its help (``python -m batchsync.mock --help``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .mockserver import ROOT

pytestmark = pytest.mark.integration


def test_the_wheel_holds_the_mock_and_its_help_runs_from_it(tmp_path: Path) -> None:
    source = tmp_path / "source"  # (a copy: a build leaves build/ and egg-info behind)
    shutil.copytree(ROOT / "batchsync", source / "batchsync",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        check=False, cwd=source, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("batchsync-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    mock = sorted(name for name in names if name.startswith("batchsync/mock/"))
    expected = ["__init__", "__main__", "batch", "gemini", "llm", "server"]
    assert mock == [f"batchsync/mock/{module}.py" for module in expected]
    unpacked = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(unpacked)
    shown = subprocess.run(
        [sys.executable, "-m", "batchsync.mock", "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": str(unpacked)},
    ).stdout  # fmt: skip
    assert "/llm/KEY/LIMITS/..." in shown and "--port" in shown
