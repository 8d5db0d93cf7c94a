"""``python -m batchsync``: the click command, its messages and exit codes, around the run in
``runner``."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from functools import partial
from itertools import chain, pairwise
from pathlib import Path
from typing import Any, Unpack

import click
import urllib3
from click.core import ParameterSource
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import __version__, contrib
from ..batches.providers import PROVIDERS, endpoint_of
from ..core.redact import RedactingFilter, Secrets
from ..core.result import error_kinds
from ..http.auth import AuthFailed, CommandToken
from ..http.template import Template, parse_body
from ..jobs.flags import header_names
from ..jobs.options import FetchOptions, build
from ..jobs.settings import FetchSettings
from ..output.columnar import FORMATS, MAX_COLUMNS, pyarrow_missing
from ..run.plan import LaneRefused
from ..run.processes import process_options
from ..run.progress import wanted
from ..store.journal import JournalUnusable
from .inputs import TABLE_FORMATS, Input, InputError, TableInput, is_spooled
from .options import (
    HELP_SECTIONS,
    FilePath,
    WholeNumberRange,
    auth_command_text,
    dask_address_text,
    library_options,
    long_name,
    metrics_port_text,
    names_folder,
    prefix_text,
    reading,
    redis_url_text,
    resume_command,
    split_address,
)
from .runner import Continuing, Outcome, Refused, journal_path, run_batch
from .signals import EXIT_INTERRUPTED, signals_deferred, stop_on_signals

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


class _Command(click.Command):
    """The command, whose bare --retry-failed and --batch-api never take INPUT for a value,
    and whose help lists its options by section (``HELP_SECTIONS``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        bare = [f"{word}={BARE[word]}" if word in BARE else word for word in args[:end]]
        try:
            return super().parse_args(ctx, [*bare, *args[end:]])
        except click.UsageError as exc:
            meant = _value_apart(args[:end])
            if type(exc) is not click.UsageError or meant is None:
                raise
            raise click.UsageError(
                f"{exc.message}: did you mean {meant}? ({meant.partition('=')[0]} takes its "
                "value after =)",
                ctx,
            ) from None

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        """INPUT, then the options in --help's order (the generated reference lists them so)."""
        return sorted(super().get_params(ctx), key=_help_place)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The options by section, in the order users reach for them."""
        params = self.get_params(ctx)
        by_name = {long_name(p): p for p in params if isinstance(p, click.Option)}
        for title, names in HELP_SECTIONS.items():
            records = [by_name[name].get_help_record(ctx) for name in names]
            with formatter.section(title):
                formatter.write_dl([record for record in records if record is not None])


# Each option's place in --help: its section's, then its own in the section.
_HELP_PLACE = {name: n for n, name in enumerate(chain.from_iterable(HELP_SECTIONS.values()))}


def _help_place(param: click.Parameter) -> int:
    """Where ``param`` stands in --help: INPUT first, then each option in its section."""
    return _HELP_PLACE[long_name(param)] if isinstance(param, click.Option) else -1


RETRY_FAILED = "--retry-failed"
# What a bare --retry-failed stands for (every failure): a value no command line can give,
# so that --retry-failed= (an unset shell variable's kinds) is not taken for it.
_EVERY_KIND = "\0"
# What each option given bare stands for (--batch-api: the provider the URL names).
BARE = {RETRY_FAILED: _EVERY_KIND, "--batch-api": "auto"}


def _names_kinds(word: str) -> bool:
    try:
        error_kinds(word.split(","))
    except ValueError:
        return False
    return True


# Whether a word is a value of each option in BARE (given apart, it is an extra argument).
_VALUE_OF: dict[str, Callable[[str], bool]] = {
    RETRY_FAILED: _names_kinds,
    "--batch-api": lambda word: word in ("auto", *PROVIDERS),
}


def _value_apart(args: Sequence[str]) -> str | None:
    """``--batch-api=openai`` when ``args`` give ``--batch-api openai`` (one of BARE, then a
    value of it, which click reads as an argument): what was meant, or None."""
    for option, word in pairwise(args):
        if option in _VALUE_OF and _VALUE_OF[option](word):
            return f"{option}={word}"
    return None


@contextlib.contextmanager
def _usage_errors(
    kinds: type[Exception] | tuple[type[Exception], ...] = ValueError,
) -> Iterator[None]:
    """What raises one of ``kinds`` is a usage line: exit 2, nothing sent."""
    try:
        yield
    except kinds as exc:
        raise click.UsageError(str(exc)) from None


def _retry_kinds(value: str | None) -> frozenset[str] | None:
    """--retry-failed's error kinds (empty: every failure), None when it was not given."""
    if value is None:
        return None
    if value == _EVERY_KIND:
        return frozenset()
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    if not kinds:
        raise ValueError(
            "names no error kind: give =KIND,... or --retry-failed alone for every failure"
        )
    return error_kinds(kinds)


# --cert and --key: a PEM file each.
_PEM_FILE: dict[str, Any] = {
    "type": FilePath(exists=True, dir_okay=False, readable=True),
    "metavar": "FILE",
}


@click.command(
    cls=_Command,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    epilog=(
        "INPUT holds one item per line: a URL, or a JSON object with url, method, headers, "
        "params, json, data, id, idempotency_key, fallbacks (URLs tried after url has used "
        "its retries). Blank lines and # comments are skipped; a "
        "file starting with [ is a JSON array of items. Writes PREFIX-results.jsonl (or .csv, "
        ".parquet: --format; one result per item, in input order), PREFIX-failed.jsonl (the "
        "failed items, valid INPUT again) and PREFIX-report.html (charts and tables of the "
        "run; --no-report: none); PREFIX is INPUT's name without its extension (stdin or "
        "another pipe: batch). "
        "Each result is journaled as it is made (PREFIX-journal.sqlite3): after a crash or "
        "Ctrl-C, the same command with --resume fetches only the rest; --retry-failed sends "
        "the failures again and writes the whole input's results; a prefix that holds a "
        "journal is never replaced without --fresh. Exit status: 0 all ok, "
        "1 some failed (outputs written), 2 usage or input error (nothing sent), 3 the run "
        "could not be completed: the journal or output files could not be written (outputs "
        "not replaced; fix the cause and rerun with --resume), 130 interrupted."
    ),
)
@click.argument("input_name", metavar="INPUT")
@click.option(
    "--url",
    "url_template",
    metavar="TEMPLATE",
    help="Make one request per row of INPUT, a table (CSV/TSV with a header row, or JSON "
    "records): TEMPLATE is the URL with {field} where a row's value goes, percent-encoded "
    "(a / in a value stays in its path segment); {{ and }} are literal braces. Fields may "
    "stand in the path and query, not the scheme, host or port.  [default: none: INPUT holds "
    "items]",
)
@click.option(
    "--method",
    default="GET",
    metavar="METHOD",
    help="With --url: the HTTP method of every row's request.  [default: GET; with "
    "--row-as-body: POST]",
    show_default=False,
)
@click.option(
    "--body-template",
    metavar="JSON",
    help='With --url: a JSON body for every row\'s request. A string that is exactly "{field}" '
    "takes the row's value with its type; {field} inside a longer string is put in as text.",
)
@click.option(
    "--row-as-body",
    is_flag=True,
    help="With --url, a plain URL (no {field}): send each row, a JSON object, as the JSON "
    "body, less its metadata field, whose value becomes the result's id (the OpenAI "
    "cookbook's request files run as they are). INPUT must be JSON records.",
)
@click.option(
    "--id-field",
    metavar="NAME",
    help="With --url: the field that becomes each result's id (with --row-as-body it stays "
    "in the body).  [default: id, when a row has it; with --row-as-body: metadata]",
)
@click.option(
    "--input-format",
    type=click.Choice(["auto", *TABLE_FORMATS]),
    default="auto",
    help="With --url: how INPUT is read. auto: .csv is CSV, .tsv or .tab is TSV (both with a "
    "header row), anything else (and -) JSON records, one object per line.",
)
@library_options(FetchOptions)
@click.option(
    "--auth-command",
    metavar="'CMD'",
    callback=reading(auth_command_text),
    help="Get the token from CMD (run by sh, stdin closed, 30 s at most): what it prints, "
    "stripped, is the --auth-header value (e.g. 'Bearer abc'), a secret. It is run once "
    "before anything is sent (if it fails, the run does not start) and again whenever the "
    "server answers 401 to the current token: one refresh for all workers, the items resent "
    "with the new token.  [default: none]",
)
@click.option(
    "--auth-header",
    default="Authorization",
    metavar="NAME",
    callback=reading(header_names),
    help="The header --auth-command's output goes in.",
)
@click.option(
    "--cacert",
    type=FilePath(exists=True, readable=True),
    metavar="FILE",
    help="Trust the CA certificates in FILE (PEM; or a directory of them) instead of the "
    "default bundle; wins over REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE.",
)
@click.option(
    "--cert",
    "client_cert",
    **_PEM_FILE,
    help="Client certificate (PEM) to present, with its key unless --key is given.",
)
@click.option(
    "--key", "client_key", **_PEM_FILE, help="Private key (PEM) of the --cert client certificate."
)
@click.option(
    "-k",
    "--insecure",
    is_flag=True,
    help="Do not verify servers' certificates (for test servers only).",
)
@click.option(
    "--redis",
    "redis_url",
    metavar="URL",
    callback=reading(redis_url_text),
    help="Share the limits (rate, per-host slots, cooldowns, breakers) with other processes "
    "through this Redis server, e.g. redis://127.0.0.1:6379/0; needs the redis extra.",
)
@click.option(
    "--dask",
    "dask_address",
    metavar="ADDRESS",
    callback=reading(dask_address_text),
    help="Run the batch on the Dask cluster at ADDRESS (tcp://scheduler:8786), a partition "
    "per task; add --redis so that all workers share the limits; needs the dask extra.",
)
@click.option(
    "--partition-size",
    type=WholeNumberRange(min=1),
    default=1000,
    metavar="N",
    help="With --dask: items per partition.",
)
@click.option(
    "--metrics-port",
    metavar="[HOST:]PORT",
    callback=reading(metrics_port_text),
    help="Serve Prometheus metrics on this port, 1 to 65535 (HOST defaults to 127.0.0.1), "
    "while the run goes; needs the metrics extra.",
)
@click.option(
    "-o",
    "--output",
    "prefix",
    metavar="PREFIX",
    callback=reading(prefix_text),
    help="Prefix of the output files (and of PREFIX-journal.sqlite3); its folders are made "
    "as needed. A PREFIX that ends in / (or is . or ..) is a folder: the files go in it, "
    "under the default name.  [default: INPUT's name without its extension; stdin: batch, "
    "as for any pipe]",
)
@click.option(
    "--format",
    "form",
    type=click.Choice(FORMATS),
    default="jsonl",
    help="The results file's format: PREFIX-results.jsonl, .csv (RFC 4180, a header row, "
    "typed columns: data and attempt_log as JSON text, null as an empty cell) or .parquet "
    "(needs the parquet extra). PREFIX-failed.jsonl stays JSONL.",
)
@click.option(
    "--flatten",
    is_flag=True,
    help="With --format csv or parquet: spread the successes' JSON bodies into data.KEY "
    f"columns (nested keys joined by dots, as to_pandas(expand=True)), at most {MAX_COLUMNS}; "
    "data keeps what was not spread.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run journaled in PREFIX-journal.sqlite3: fetch only the items "
    "that have no final result yet (and finish a --retry-failed that was interrupted).",
)
@click.option(
    RETRY_FAILED,
    "retry_failed",
    metavar="[=KIND,...]",
    callback=reading(_retry_kinds),
    help="Send again the items whose final result in PREFIX-journal.sqlite3 failed (with "
    "=KIND,...: only those failed with these error kinds, e.g. =status,timeout), each with a "
    "fresh budget, and write the whole input's results in order; the failed file then holds "
    "what still fails. With --resume, also finish the items never done.",
)
@click.option(
    "--cancel",
    is_flag=True,
    help="With --batch-api --resume: cancel the journal's batches still running at the "
    "provider, then collect what they ran (the rows they did not run end batch_cancelled).",
)
@click.option(
    "--live",
    is_flag=True,
    help="With --resume or --retry-failed on a run that went through --batch-api: send the "
    "rows left live, one call each, under every limit (--rate, --token-rate, the headers). "
    "Refused while batches of the run are still open at the provider.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Replace the run that PREFIX-journal.sqlite3 (and the output files) hold with a new "
    "one. Without --resume, --retry-failed or --fresh, a prefix that holds a journal is "
    "refused, nothing sent.",
)
@click.option(
    "--report/--no-report",
    default=True,
    help="Write PREFIX-report.html: one self-contained page of charts (with the report "
    "extra, plotly; tables without it) and tables of the slowest and the failed items, made "
    "from the journal. A report that cannot be written is a warning; the exit status stays.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr.  [default: on for a terminal]",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    show_default=False,
    help="Log each retry and failure (-vv: more).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@click.version_option(__version__, prog_name="batchsync", message="%(prog)s %(version)s")
def command(
    *,
    input_name: str,
    url_template: str | None,
    method: str,
    body_template: str | None,
    row_as_body: bool,
    id_field: str | None,
    input_format: str,
    auth_command: str | None,
    auth_header: str,
    cacert: str | None,
    client_cert: str | None,
    client_key: str | None,
    insecure: bool,
    redis_url: str | None,
    dask_address: str | None,
    partition_size: int,
    metrics_port: str | None,
    prefix: str | None,
    form: str,
    flatten: bool,
    resume: bool,
    retry_failed: frozenset[str] | None,
    cancel: bool,
    live: bool,
    fresh: bool,
    report: bool,
    progress: bool | None,
    verbose: int,
    quiet: bool,
    **options: Unpack[FetchSettings],
) -> int:
    """Fetch every item of INPUT (a file, a pipe, or - for stdin) with bounded concurrency and
    retries."""
    batch = options.get("batch_api") is not None
    template = _template(
        url_template, method, body_template, id_field, row_as_body=row_as_body, batch=batch
    )
    _check_format(form, flatten)
    tls = _tls(insecure, cacert, client_cert, client_key)
    continuing = _continuing(resume, retry_failed, fresh, cancel=cancel, live=live)
    prefix = output_prefix(prefix, input_name)
    if insecure:  # asked for in so many words: no warning per request
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
    context = click.get_current_context()
    for name in list(options):  # (the options' own defaults are the flags': only what was given)
        if context.get_parameter_source(name) is ParameterSource.DEFAULT:
            options.pop(name)  # type: ignore[misc]
    with _usage_errors():
        checked = build(FetchOptions, **{**options, **tls})
    if checked.batch_api is not None and (auth_command is not None or redis_url is not None):
        given = "--auth-command" if auth_command is not None else "--redis"
        raise click.UsageError(
            f"--batch-api sends through the provider: {given} cannot apply to it"
        )
    checked, cluster = _scaled_out(checked, redis_url, dask_address)
    _check_batch_api(checked, template, continuing, cluster)
    _check_processes(checked, cluster, metrics_port)
    _configure_logging(verbose, quiet)
    show_progress = not quiet and wanted(progress)
    with _usage_errors(InputError):  # (INPUT opened: its items, or a table's rows)
        source = TableInput(input_name, template, input_format) if template else Input(input_name)
    run = partial(
        run_batch,
        continuing=continuing,
        progress=show_progress,
        dask=cluster,
        partition_size=partition_size,
        report=report,
        form=form,
        flatten=flatten,
    )
    outcome, secrets = _run(
        run,
        source,
        checked,
        prefix,
        cluster=cluster,
        auth_command=auth_command,
        auth_header=auth_header,
        metrics_port=metrics_port,
        progress=show_progress,
    )
    return _report(outcome, quiet, _as_resumed(input_name), secrets)


def _tls(insecure: bool, cacert: str | None, cert: str | None, key: str | None) -> FetchSettings:
    """--insecure, --cacert, --cert and --key as FetchOptions' ``verify`` and ``cert``."""
    if insecure and cacert is not None:
        raise click.UsageError("--insecure and --cacert contradict each other: give one")
    verify = False if insecure else cacert
    if key is None:
        return {"verify": verify, "cert": cert}
    if cert is None:
        raise click.UsageError("--key needs --cert")
    return {"verify": verify, "cert": (cert, key)}


def _scaled_out(
    options: FetchOptions, redis_url: str | None, dask_address: str | None
) -> tuple[FetchOptions, Any]:
    """``options`` sharing limits through --redis, and the --dask client to run on (None: here)."""
    with _usage_errors():
        if redis_url is not None:
            shared = contrib.shared_limits(redis_url, options.namespace, options.lease_ttl)
            options = options.model_copy(update={"limits": shared})
        cluster = None
        if dask_address is not None:  # (dask imported only when asked for)
            from ..contrib.dask import cluster_client

            cluster = cluster_client(dask_address)
    return options, cluster


def _run(
    run: Callable[..., Outcome],
    source: Input,
    options: FetchOptions,
    prefix: str,
    *,
    cluster: Any,
    auth_command: str | None,
    auth_header: str,
    metrics_port: str | None,
    progress: bool,
) -> tuple[Outcome, Secrets]:
    """``run`` the batch, closing INPUT and the cluster's client after: its outcome, secrets."""
    redirect = logging_redirect_tqdm() if progress else nullcontext()
    tokens = None
    try:
        with _usage_errors((InputError, JournalUnusable, Refused, LaneRefused)):
            _make_folder(journal_path(prefix).parent)
            if auth_command is not None:  # (once INPUT is known to be there)
                tokens = _first_token(auth_command, auth_header)
                options = options.model_copy(update={"auth": tokens})
            with stop_on_signals() as on_start, redirect, _metrics_server(metrics_port) as registry:
                options = options.model_copy(update={"metrics": registry})
                outcome = run(source, options, prefix, on_start=on_start)
    finally:
        source.close()
        if cluster is not None:
            cluster.close()
    secrets = options.secrets()
    if tokens is not None:  # (what outlives the run, its summary and resume line, hides them)
        secrets.learn(tokens.given)
    return outcome, secrets


def _continuing(
    resume: bool, retry: frozenset[str] | None, fresh: bool, *, cancel: bool, live: bool
) -> Continuing:
    if fresh and (resume or retry is not None):
        raise click.UsageError(
            "--fresh replaces the journal that --resume and --retry-failed go on with: give one"
        )
    if cancel and not resume:
        raise click.UsageError("--cancel cancels the batches of a run that --resume goes on with")
    if live and not (resume or retry is not None):
        raise click.UsageError("--live goes with --resume or --retry-failed")
    return Continuing(resume=resume, retry=retry, fresh=fresh, cancel=cancel, live=live)


def _check_batch_api(
    options: FetchOptions, template: Template | None, continuing: Continuing, cluster: Any
) -> None:
    """UsageError for a --batch-api run that cannot be one, or --cancel, --live against it."""
    if options.batch_api is None:
        if continuing.cancel:
            raise click.UsageError("--cancel goes with --batch-api")
        return
    if continuing.live:
        raise click.UsageError("--live and --batch-api contradict each other: give one")
    if template is None or (template.body is None and not template.row_as_body):
        raise click.UsageError(
            "--batch-api needs --url (the endpoint) with --row-as-body or --body-template"
        )
    if template.method != "POST":
        raise click.UsageError(f"--batch-api sends every row as a POST: --method {template.method}")
    if cluster is not None:
        raise click.UsageError("--batch-api sends through the provider, not a Dask cluster")
    with _usage_errors():
        endpoint_of(template.url, options.batch_api)


def _check_processes(options: FetchOptions, cluster: Any, metrics_port: str | None) -> None:
    """UsageError for --processes with what it cannot hold (``process_options`` says why)."""
    if options.processes == 1:
        return
    if cluster is not None:
        raise click.UsageError("--processes runs on this machine, --dask on a cluster: give one")
    if metrics_port is not None:
        raise click.UsageError(
            "--metrics-port counts the attempts of this process: --processes sends them from others"
        )
    with _usage_errors():
        process_options(options)


def _make_folder(folder: Path) -> None:
    """The output folder, made as needed (UsageError when it cannot be)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.UsageError(
            f"cannot make the output folder {folder}: {exc.strerror or exc}"
        ) from None


def output_prefix(given: str | None, input_name: str) -> str:
    """The output files' prefix: -o as given, or INPUT's default name (``default_prefix``)
    when it is not given, or inside the folder -o names (``out/``, ``.``)."""
    if given is None:
        return default_prefix(input_name)
    return str(Path(given) / default_prefix(input_name)) if names_folder(given) else given


def default_prefix(input_name: str) -> str:
    """The output prefix when -o is not given: INPUT's name without its extension, in the
    current folder (so a rerun of PREFIX-failed.jsonl writes beside, never over, its run);
    ``batch`` for stdin and an unnamed pipe, whose name (``/dev/fd/63``) says nothing of it
    (a named FIFO keeps its name)."""
    stem = "" if _unnamed_pipe(input_name) else Path(input_name).stem
    return stem or "batch"


def _as_resumed(input_name: str) -> list[str]:
    """The command line as given, with - for an INPUT pipe that a resume cannot open again."""
    argv = list(click.get_current_context().obj or [])
    if input_name == "-" or not _unnamed_pipe(input_name):
        return argv
    return ["-" if word == input_name else word for word in argv]


def _unnamed_pipe(input_name: str) -> bool:
    """Whether INPUT is stdin or a descriptor's pipe (``<(…)``): not there to read again."""
    folder = Path(input_name).parent
    return is_spooled(input_name) and (
        input_name == "-" or folder.name == "fd" or str(folder) == "/dev"
    )


def _template(
    url: str | None,
    method: str,
    body: str | None,
    id_field: str | None,
    *,
    row_as_body: bool,
    batch: bool = False,
) -> Template | None:
    """The checked --url template, or None when INPUT holds items. A body goes with a POST
    (``--method`` unsaid) when it is each row's (``row_as_body``) or goes to a ``batch`` API."""
    context = click.get_current_context()
    if url is None:  # (then none of the options that make the template may be given)
        for name in ("method", "body_template", "row_as_body", "id_field", "input_format"):
            if context.get_parameter_source(name) is not ParameterSource.DEFAULT:
                raise click.UsageError(
                    f"--{name.replace('_', '-')} goes with --url (a template filled from a table)"
                )
        return None
    if row_as_body and body is not None:
        raise click.UsageError(
            "--row-as-body sends each row as the body, --body-template builds one: give one"
        )
    if (row_as_body or batch) and context.get_parameter_source("method") is ParameterSource.DEFAULT:
        method = "POST"
    with _usage_errors():
        given = None if body is None else parse_body(body)
        return Template.parse(url, method, given, id_field, row_as_body=row_as_body)


def _check_format(form: str, flatten: bool) -> None:
    """UsageError, before anything is sent, for a results format that cannot be written."""
    if flatten and form == "jsonl":
        raise click.UsageError("--flatten goes with --format csv or parquet")
    if form == "parquet" and (problem := pyarrow_missing()) is not None:
        raise click.UsageError(problem)


def _first_token(command: str, header: str) -> CommandToken:
    """The --auth-command token source, its first token got now: a command that fails stops
    the run before anything is sent or written (exit 2, one line without its output)."""
    source = CommandToken(command, header)
    try:
        source.prime()
    except AuthFailed as exc:
        raise click.ClickException(f"--auth-command: {exc}; nothing was sent") from None
    return source


@contextlib.contextmanager
def _metrics_server(where: str | None) -> Iterator[object]:
    """A Prometheus registry served for the run (None: no metrics); a failed bind: UsageError."""
    if where is None:
        yield None
        return
    host, port = split_address(where)
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise click.UsageError(
            "--metrics-port needs prometheus-client: pip install 'batchsync[metrics]'"
        ) from None
    registry = CollectorRegistry()
    try:
        server, _thread = start_http_server(port, addr=host or "127.0.0.1", registry=registry)
    except (ValueError, OSError, OverflowError) as exc:
        raise click.UsageError(f"cannot serve metrics on {where}: {exc}") from None
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()


def _report(outcome: Outcome, quiet: bool, argv: Sequence[str], secrets: Secrets) -> int:
    summary = outcome.summary
    if not quiet:
        if outcome.replaced is not None:
            click.echo(f"--fresh: replaced {outcome.replaced}", err=True)
        click.echo(str(summary), err=True)
        written = "" if outcome.report_path is None else f"  report: {outcome.report_path}"
        click.echo(
            f"results: {outcome.results_path}  failed: {outcome.failed_path} ({summary.failed})"
            f"{written}",
            err=True,
        )
    if outcome.stopped:
        resume = resume_command(argv, secrets, command.params)
        click.echo(
            f"Interrupted: {outcome.entries - outcome.left} of {outcome.entries} done — resume "
            f"with: {resume.line}" + (" (the same input on standard input)" if "-" in argv else ""),
            err=True,
        )
        if resume.hint is not None:
            click.echo(resume.hint, err=True)
        if outcome.abandoned:
            # Attempts still in flight hold worker threads that the interpreter would wait for;
            # everything finished is journaled and written, so leave now.
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    return EXIT_OK if summary.failed == 0 else EXIT_FAILED


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(RedactingFilter())  # (every line, a run's or not: masked, printable)
    logger = logging.getLogger("batchsync")
    logger.addHandler(handler)
    logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: exit 0 all ok, 1 some failed, 2 usage or input error, 3 the run could not
    be completed (journal or output files not writable), 130 interrupted."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        click.echo("Usage: python -m batchsync [OPTIONS] INPUT", err=True)
        click.echo("Try 'python -m batchsync --help' for help.", err=True)
        sys.exit(EXIT_USAGE)
    try:
        with signals_deferred():
            code = command.main(args=args, prog_name="batchsync", standalone_mode=False, obj=args)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except OSError as exc:  # e.g. the disk filled up under the journal or the output files
        click.echo(
            f"Error: {exc}; the outputs were not replaced: fix the cause and rerun with --resume",
            err=True,
        )
        sys.exit(EXIT_INCOMPLETE)
    except (KeyboardInterrupt, click.Abort):
        click.echo("Interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
