"""``make test-floors``: the lowest versions setup.cfg admits, as pins, from setup.cfg itself.

``python scripts/floors.py`` prints one ``name==floor`` line per ``install_requires`` entry (a pip
constraints file, so nothing installed beside the package can pull a floor up);
``pip freeze | python scripts/floors.py --check`` fails unless each floor is what is installed.
"""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"
# `name>=floor`, a plain release and nothing after it: an upper bound or a marker would need more
# than a pin to stand for the lowest version admitted.
FLOOR = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*>=\s*([0-9]+(?:\.[0-9]+)*)")
PINNED = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


def floors() -> dict[str, str]:
    """Each dependency's normalized name and its floor; a dependency without one is an error."""
    config = configparser.ConfigParser()
    config.read(SETUP_CFG, encoding="utf-8")
    found = {}
    for line in config["options"]["install_requires"].split("\n"):
        if not line.strip():
            continue
        match = FLOOR.fullmatch(line.strip())
        if match is None:
            sys.exit(f"setup.cfg: {line.strip()!r} is not `name>=floor`")
        found[normalized(match[1])] = match[2]
    return found


def normalized(name: str) -> str:
    """The name as pip compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """2.6 and 2.6.0 are one release (PEP 440 pads with zeros)."""
    parts = [int(part) for part in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def check(frozen: str) -> list[str]:
    """The floors that `pip freeze` shows missing or at another version."""
    installed = {normalized(m[1]): m[2] for m in PINNED.finditer(frozen)}
    return [
        f"{name}: wanted {floor}, installed {installed.get(name, 'nothing')}"
        for name, floor in floors().items()
        if name not in installed or release(installed[name]) != release(floor)
    ]


def main() -> None:
    if sys.argv[1:] == ["--check"]:
        wrong = check(sys.stdin.read())
        if wrong:
            sys.exit("not at the floor: " + "; ".join(wrong))
        print("at the floor: " + ", ".join(f"{n}=={v}" for n, v in floors().items()))
    else:
        print("\n".join(f"{name}=={floor}" for name, floor in floors().items()))


if __name__ == "__main__":
    main()
