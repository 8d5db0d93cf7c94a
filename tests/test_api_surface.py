"""One list of options with one set of defaults: the library's signatures, ``help()``, the
CLI's ``--help``, the options table of the docs (docs/library.md) and DESIGN.md all agree with
``FetchOptions``."""

from __future__ import annotations

import ast
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
