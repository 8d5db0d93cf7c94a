"""One list of options with one set of defaults: each option declared once (``FetchOptions``,
``CallOptions``), the CLI's options and the library's typed keywords (jobs/settings.py,
generated here) made from the declarations, and the library's signatures, ``help()``, the
options table of the docs (docs/library.md) and DESIGN.md agreeing with them."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import pydoc
import re
import typing
from pathlib import Path
from typing import Any

import click
import pytest

import batchsync
from batchsync import Batch, fetch_all, run_all
from batchsync.cli import command
from batchsync.jobs.flags import Flag
from batchsync.jobs.options import CallOptions, FetchOptions, FlowOptions

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT.parent / "shared" / "DESIGN.md"
# The page of the documentation site that holds the options table (under "## Options").
OPTIONS_PAGE = ROOT / "docs" / "library.md"
MODEL = {name: field.default for name, field in FetchOptions.model_fields.items()}
# Library options that are not the model's: where a Batch keeps itself, the bar, and the
# template that turns rows into requests.
BATCH_ONLY = {
    "journal": None, "fresh": False, "progress": None, "url": None, "method": "GET",
    "body": None, "id_field": None,
}  # fmt: skip
# What DESIGN.md already names for an issue still open: LLM batches' token budget and usage
# (issue 28). Each leaves this set when its issue lands, and the test then checks it.
PLANNED: set[str] = set()
# CLI defaults DESIGN.md describes in words, as --help shows them.
DESCRIBED = {"--output": "INPUT's name without its extension; stdin: batch"}
# The CLI options that are library options too, by the click parameter's name.
CLI_NAMES = {
    "concurrency", "attempts", "timeout", "budget", "deadline", "expect", "max_bytes", "rate",
    "per_host", "cooldown", "adaptive", "dedup", "cookies", "deny_private", "namespace",
    "lease_ttl", "breaker", "quota_headers", "retry_statuses",
}  # fmt: skip


def shown(value: Any) -> str:
    """A default as the options table writes it: ``Backoff()`` for a settings object as it comes."""
    is_settings = dataclasses.is_dataclass(value) and not isinstance(value, type)
    if is_settings and value == type(value)():
        return f"{type(value).__name__}()"
    return repr(value)


def keyword_defaults(function: Any) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_batch_and_fetch_all_take_every_option_typed_with_the_models_default() -> None:
    for function in (Batch.__init__, fetch_all):
        assert keyword_defaults(function) == MODEL | BATCH_ONLY, function
        parameters = inspect.signature(function).parameters.values()
        assert all(
            p.annotation is not inspect.Parameter.empty for p in parameters if p.name != "self"
        )


def test_help_shows_every_option_with_its_default() -> None:
    text = pydoc.render_doc(fetch_all, renderer=pydoc.TextDoc())
    for name, default in (MODEL | BATCH_ONLY).items():
        assert f"{name}: " in text, name
        assert f"= {default!r}" in text or name in ("backoff", "breaker"), name


def test_run_all_takes_every_call_option_typed_with_the_models_default() -> None:
    calls = {name: field.default for name, field in CallOptions.model_fields.items()}
    assert keyword_defaults(run_all) == calls | dict.fromkeys(
        ("progress", "journal", "encode", "decode")
    ) | {"fresh": False}
    assert calls["concurrency"] == 4  # DESIGN.md: run_all(fn, items, concurrency=4, ...)
    parameters = inspect.signature(run_all).parameters.values()
    assert all(p.annotation is not inspect.Parameter.empty for p in parameters)
    # The options every batch has are the same options, with the same defaults, but the
    # concurrency (calls are often heavier than requests) and the breaker (calls share no
    # host: off unless asked for, with a per_key).
    shared = set(FlowOptions.model_fields) - {"concurrency", "breaker"}
    assert calls["breaker"] is None
    assert {name: calls[name] for name in shared} == {name: MODEL[name] for name in shared}


def test_the_cli_defaults_are_the_libraries() -> None:
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    for name in CLI_NAMES:
        default = options[name].default
        parse = options[name].callback
        if parse is not None and isinstance(default, str):
            default = parse(click.Context(command), options[name], default)
        assert default == MODEL[name], name


def test_each_flag_declared_with_an_option_is_the_commands_option() -> None:
    """The CLI's library options are made from the declarations: each flagged field is the
    command's option of that name, spelled and explained as its flag says, and no option of
    the command is a library option declared by hand."""
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    flagged = {}
    for name, field in FetchOptions.model_fields.items():
        flag = next((m for m in field.metadata if isinstance(m, Flag)), None)
        if flag is not None:
            flagged[name] = flag
            spelled = [word for names in flag.names for word in names.split("/")]
            assert [*options[name].opts, *options[name].secondary_opts] == spelled, name
            assert options[name].help == flag.help, name
    assert set(options) & set(FetchOptions.model_fields) == set(flagged)
    assert set(flagged) >= CLI_NAMES


def test_call_resilient_and_limits_name_the_call_options_with_their_defaults() -> None:
    """The single-call forms spell their options out (their ``**kwargs`` are the function's,
    DESIGN.md names them): each is a call option, with the model's default."""
    calls = {name: field.default for name, field in CallOptions.model_fields.items()}
    for function in (batchsync.call, batchsync.resilient, batchsync.Limits.__init__):
        given = keyword_defaults(function)
        assert len(set(given) & set(calls)) >= 7, function
        for name in set(given) & set(calls):
            assert given[name] == calls[name], (function, name)


def test_the_keywords_are_typed_for_type_checkers() -> None:
    """mypy --strict (``make lint``) reads this file: an option of the wrong type is its
    error here, which each ignore expects (strict mode makes an unneeded ignore an error)."""
    with pytest.raises(ValueError, match="invalid option: concurrency"):
        fetch_all([], concurrency="many")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid option: attempts"):
        run_all(str, [], attempts=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'concurency'"):
        Batch([], concurency=4)  # type: ignore[call-arg]


def options_table_text() -> str:
    text = OPTIONS_PAGE.read_text()
    assert text.count("\n## Options\n") == 1, f"{OPTIONS_PAGE} has one '## Options' section"
    table = text.split("\n## Options", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    assert table.startswith("| option | default | meaning |"), table[:200]
    return table


def options_table() -> dict[str, str]:
    table = options_table_text()
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {row[0].strip("| `"): row[1] for row in rows}


def test_the_docs_options_table_lists_every_option_with_its_default() -> None:
    table = options_table()
    assert set(table) == set(MODEL) | set(BATCH_ONLY)
    for name, default in (MODEL | BATCH_ONLY).items():
        assert table[name] == f"`{shown(default)}`", name


def test_the_docs_options_table_says_which_options_run_all_and_call_take() -> None:
    table = options_table_text()
    marks = {
        row[0].strip("| `"): row[3].strip(" |").split("·")
        for row in (line.split(" | ") for line in table.splitlines()[2:])
    }
    run_all_takes = {name for name, mark in marks.items() if mark[0].strip()}
    call_takes = {name for name, mark in marks.items() if len(mark) > 1 and mark[1].strip()}
    assert run_all_takes == set(keyword_defaults(run_all)) & set(marks)
    assert call_takes == set(keyword_defaults(batchsync.call)) & set(marks) - {"limits"}


@pytest.mark.skipif(not DESIGN.exists(), reason="DESIGN.md lives beside the checkout")
def test_design_md_gives_the_same_defaults() -> None:
    text = DESIGN.read_text()
    call = re.search(r"rs = fetch_all\(items, (.*?)\)\n", text, re.DOTALL)
    assert call is not None
    for keyword in ast.parse(f"f({call[1]})").body[0].value.keywords:  # type: ignore[attr-defined]
        if keyword.arg in PLANNED:
            continue
        assert (
            eval(compile(ast.Expression(keyword.value), "DESIGN.md", "eval"))
            == ((MODEL | BATCH_ONLY)[keyword.arg])
        ), keyword.arg
    calls = re.search(r"rs = run_all\(fn, items, (.*?)\)  #", text, re.DOTALL)
    assert calls is not None
    for keyword in ast.parse(f"f({calls[1]})").body[0].value.keywords:  # type: ignore[attr-defined]
        value = eval(compile(ast.Expression(keyword.value), "DESIGN.md", "eval"))
        if value is not Ellipsis and keyword.arg not in PLANNED:  # ("...": not given)
            assert value == keyword_defaults(run_all)[keyword.arg], keyword.arg
    cli = text.split("python -m batchsync [OPTIONS] INPUT", 1)[1].split("```", 1)[0]
    options = {p.opts[-1]: p for p in command.params if isinstance(p, click.Option)}
    for flag, default in re.findall(r"(--[a-z-]+)[^\n]*?\s\[([^\]]+)\]", cli):
        if default.startswith("auto") or flag in PLANNED:
            continue
        if flag in DESCRIBED:
            assert options[flag].show_default is None
            assert DESCRIBED[flag] in str(options[flag].help)
            assert default == "the input's name without its extension; stdin: batch"
            continue
        value = default.split(";")[0]  # (what follows says more: "none; a bare N is …")
        given = options[flag].default
        assert str(given).lower() == value.lower() or _same_number(given, value), flag


def test_the_error_types_and_kinds_a_caller_handles_are_exported() -> None:
    for name in ("ErrorKind", "Retryable", "JournalMismatch", "JournalInUse", "JournalFailed"):
        assert name in batchsync.__all__
    assert "circuit_open" in typing.get_args(batchsync.ErrorKind)


def _same_number(given: object, written: str) -> bool:
    try:
        return float(written) == given
    except ValueError:
        return given is None and written == "none"


# The library's typed keywords (``**options: Unpack[FetchSettings]``), generated from the
# declarations: ``python tests/test_api_surface.py`` writes it again.
SETTINGS = ROOT / "batchsync" / "jobs" / "settings.py"
DECLARATIONS = ROOT / "batchsync" / "jobs" / "options.py"
# Each TypedDict, the model it spells out and the TypedDict it extends (None: the first): the
# keywords every batch takes are written once, in FlowSettings.
SETTINGS_OF = {
    "FlowSettings": ("FlowOptions", None),
    "FetchSettings": ("FetchOptions", "FlowSettings"),
    "CallSettings": ("CallOptions", "FlowSettings"),
}
SETTINGS_DOC = '''"""The options as keywords, for ``**options: Unpack[FetchSettings]``: what a
caller may give for each option that ``FetchOptions`` (``fetch_all``, ``Batch``) and
``CallOptions`` (``run_all``, ``CallBatch``) declare in options.py: its type there, or its
``Takes``.

Generated from those declarations by ``python tests/test_api_surface.py`` (and checked by it):
change the declarations, never this file.
"""'''


def settings_source() -> str:
    """settings.py as the declarations in options.py make it: a TypedDict per options
    model, a key per field typed as written there (its ``Takes`` when it has one), and the
    imports of the names those types use, as options.py imports them; read from its source."""
    source = DECLARATIONS.read_text()
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    used: set[str] = {"TypedDict"}
    written = []
    keys: dict[str, dict[str, str]] = {}
    for name, (model, base) in SETTINGS_OF.items():
        lines = [
            f"class {name}({base or 'TypedDict'}, total=False):",
            f'    """``{model}`` as keywords."""',
            "",
        ]
        inherited = keys.get(base or "", {})
        keys[name] = dict(inherited)
        for field, annotation in _fields(classes, model).items():
            given = _given_type(annotation)
            text = " ".join(str(ast.get_source_segment(source, given)).split())
            if inherited.get(field) == text:  # (declared again for its default alone)
                continue
            assert field not in inherited, f"{model}.{field} takes another type than {base}'s"
            used |= {n.id for n in ast.walk(given) if isinstance(n, ast.Name)}
            keys[name][field] = text
            lines.append(f"    {field}: {text}")
        written.append("\n".join(lines))
    return "\n\n\n".join([SETTINGS_DOC + "\n\n" + _imports(tree, used), *written]) + "\n"


def _fields(classes: dict[str, ast.ClassDef], name: str) -> dict[str, ast.expr]:
    """A model's fields, its bases' first, in pydantic's order: an option declared again
    keeps its place and takes the new annotation."""
    node = classes[name]
    fields: dict[str, ast.expr] = {}
    for base in reversed(node.bases):  # (pydantic takes the last base's fields first)
        if isinstance(base, ast.Name) and base.id in classes:
            fields |= _fields(classes, base.id)
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            fields[statement.target.id] = statement.annotation
    return fields


def _given_type(annotation: ast.expr) -> ast.expr:
    """The type a caller gives: a field's annotation, less ``Annotated``'s markers, or what
    its ``Takes(...)`` says."""
    if not (isinstance(annotation, ast.Subscript) and _named(annotation.value, "Annotated")):
        return annotation
    assert isinstance(annotation.slice, ast.Tuple)
    kept, *markers = annotation.slice.elts
    for marker in markers:
        if isinstance(marker, ast.Call) and _named(marker.func, "Takes"):
            return marker.args[0]
    return kept


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _imports(tree: ast.Module, used: set[str]) -> str:
    """``from X import ...`` lines for ``used``, from where options.py takes each name (its
    own names from ``.options``), in the order ruff's isort keeps: the standard library's,
    then the package's, farthest first."""
    where: dict[str, tuple[int, str]] = {"TypedDict": (0, "typing")}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            where |= {alias.name: (node.level, node.module or "") for alias in node.names}
        elif isinstance(node, ast.Assign):
            where |= {t.id: (1, "options") for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ClassDef):
            where[node.name] = (1, "options")
    modules: dict[tuple[int, str], list[str]] = {}
    for name in sorted(used - set(dir(builtins))):
        modules.setdefault(where[name], []).append(name)
    order = sorted(modules, key=lambda place: (place[0] > 0, -place[0], place[1]))
    lines = [_import_line("." * level + module, modules[level, module]) for level, module in order]
    standard = sum(1 for level, _ in order if level == 0)
    return "\n\n".join(
        [
            "from __future__ import annotations",
            "\n".join(lines[:standard]),
            "\n".join(lines[standard:]),
        ]
    )


def _import_line(module: str, names: list[str]) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= 100:
        return line
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")"


def test_the_typed_keywords_are_generated_from_the_declarations() -> None:
    assert SETTINGS.read_text() == settings_source(), (
        "the options' declarations changed: run python tests/test_api_surface.py"
    )


if __name__ == "__main__":
    SETTINGS.write_text(settings_source())
