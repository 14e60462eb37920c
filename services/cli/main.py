"""`engram`: what operators script, over the admin REST with the master key.

    engram [--url URL] [--key KEY] [--json] COMMAND ...

The key comes from --key, else ENGRAM_MASTER_KEY (also MEMENTO_CLI_KEY, the reference CLI's
name); the URL from --url, else ENGRAM_URL (also MEMENTO_CLI_REMOTE), else
http://127.0.0.1:57332. --json prints one JSON document on stdout and nothing else there.
Exit codes: services/cli/client.py `Exit` (0 ok, 1 error, 2 usage, 3 auth, 4 not found,
5 unavailable, 6 the operation failed).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.cli import transfer
from services.cli.client import AdminClient, CliError, Exit

DEFAULT_URL = "http://127.0.0.1:57332"
RUN_DONE = ("succeeded", "failed", "skipped")
POLL_SECONDS = 1.0

app = typer.Typer(name="engram", help="Operate an Engram server over its admin REST API.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
keys_app = typer.Typer(help="API keys: list, create, deactivate, activate, delete.", no_args_is_help=True)
session_app = typer.Typer(help="MCP sessions: list, show, end, rotate.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(session_app, name="session")

out = Console(soft_wrap=True)
err = Console(stderr=True)


@dataclass
class Options:
    url: str
    key: str | None
    json: bool
    timeout: float

    def client(self) -> AdminClient:
        return AdminClient(self.url, self.key, self.timeout)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(envvar=["ENGRAM_URL", "MEMENTO_CLI_REMOTE"], help="The server's base URL.")] = DEFAULT_URL,
    key: Annotated[str | None, typer.Option(envvar=["ENGRAM_MASTER_KEY", "MEMENTO_CLI_KEY"], help="The master key.",
                                            show_default=False)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON document on stdout (for scripts).")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for one HTTP answer.")] = 60.0,
) -> None:
    ctx.obj = Options(url=url, key=key, json=json_output, timeout=timeout)


def _opts(ctx: typer.Context) -> Options:
    opts: Options = ctx.find_root().obj
    return opts


def _emit(opts: Options, data: Any, human: Any = None) -> None:
    if opts.json:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    elif human is not None:
        out.print(human)
    else:
        out.print_json(json.dumps(data, ensure_ascii=False, default=str))


def _run(ctx: typer.Context, action: Any) -> None:
    """Run a command; a CliError becomes its message on stderr and its exit code."""
    opts = _opts(ctx)
    client = opts.client()
    try:
        code = action(opts, client)
    except CliError as exc:
        if opts.json:
            sys.stderr.write(json.dumps({"error": exc.message, "status": exc.status, "exitCode": int(exc.code)}) + "\n")
        else:
            err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        raise typer.Exit(int(exc.code)) from None
    except KeyboardInterrupt:
        err.print("interrupted; run the same command again to resume where it stopped" if opts else "interrupted")
        raise typer.Exit(130) from None
    finally:
        client.close()
    raise typer.Exit(int(code or Exit.OK))


def _table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> Table:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    return table


def _progress(opts: Options, label: str) -> Progress:
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                    disable=opts.json or not err.is_terminal, transient=False)


# -- keys -----------------------------------------------------------------------------------------

@keys_app.command("list")
def keys_list(ctx: typer.Context) -> None:
    """Every API key (never its raw value)."""
    def action(opts: Options, client: AdminClient) -> None:
        keys = client.get("/keys")
        _emit(opts, keys, _table(keys, ["id", "name", "key_prefix", "status", "permissions", "default_workspace", "default_mode",
                                        "daily_limit", "calls_today", "fragment_count"]))
    _run(ctx, action)


@keys_app.command("create")
def keys_create(
    ctx: typer.Context, name: str,
    permissions: Annotated[str, typer.Option(help="Comma-separated: read, write, admin.")] = "read,write",
    workspace: Annotated[str | None, typer.Option(help="The key's default workspace.")] = None,
    mode: Annotated[str | None, typer.Option(help="Default mode: recall-only, write-only, onboarding, audit.")] = None,
    daily_limit: Annotated[int | None, typer.Option(help="Tool calls per UTC day.")] = None,
    fragment_limit: Annotated[int | None, typer.Option(help="Fragments the key may hold.")] = None,
) -> None:
    """Create a key; its raw value is shown this once."""
    def action(opts: Options, client: AdminClient) -> None:
        body = {"name": name, "permissions": [p.strip() for p in permissions.split(",") if p.strip()],
                "default_workspace": workspace, "default_mode": mode, "daily_limit": daily_limit, "fragment_limit": fragment_limit}
        created = client.json("POST", "/keys", json={k: v for k, v in body.items() if v is not None})
        _emit(opts, created, f"created key {created['id']} ({created['name']})\n"
                             f"raw key (shown once, store it now): [bold]{created['raw_key']}[/bold]")
    _run(ctx, action)


def _set_status(ctx: typer.Context, key_id: str, status: str) -> None:
    def action(opts: Options, client: AdminClient) -> None:
        updated = client.json("PUT", f"/keys/{key_id}", json={"status": status})
        _emit(opts, updated, f"key {key_id} is {updated['status']}")
    _run(ctx, action)


@keys_app.command("deactivate")
def keys_deactivate(ctx: typer.Context, key_id: str) -> None:
    """Set a key inactive (its sessions end; it can be activated again)."""
    _set_status(ctx, key_id, "inactive")


@keys_app.command("activate")
def keys_activate(ctx: typer.Context, key_id: str) -> None:
    """Set a key active again."""
    _set_status(ctx, key_id, "active")


@keys_app.command("delete")
def keys_delete(ctx: typer.Context, key_id: str,
                yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False) -> None:
    """Delete a key (its fragments stay, owned by no key)."""
    if not yes and not _opts(ctx).json and sys.stdin.isatty():
        typer.confirm(f"delete key {key_id}?", abort=True)

    def action(opts: Options, client: AdminClient) -> None:
        deleted = client.json("DELETE", f"/keys/{key_id}")
        _emit(opts, {**deleted, "id": key_id}, f"key {key_id} deleted")
    _run(ctx, action)


# -- stats ----------------------------------------------------------------------------------------

@app.command()
def stats(ctx: typer.Context) -> None:
    """The dashboard's figures (GET /stats)."""
    def action(opts: Options, client: AdminClient) -> None:
        data = client.get("/stats")
        table = Table(title="Engram", show_header=False)
        for label, value in (
            ("fragments", data["fragments"]), ("open sessions", data["sessions"]), ("API calls today", data["apiCallsToday"]),
            ("active keys", data["activeKeys"]), ("redis", data["redis"]), ("services", data.get("services")),
            ("system", data["system"]), ("queues", data["queues"]),
            ("recall p50 / p90 ms", f"{data['searchMetrics']['total']['p50']} / {data['searchMetrics']['total']['p90']}"),
            ("health flags", ", ".join(data["healthFlags"]) or "none"),
        ):
            table.add_row(label, str(value))
        _emit(opts, data, table)
    _run(ctx, action)


# -- export / import ----------------------------------------------------------------------------

@app.command("export")
def export_cmd(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="JSON Lines output file.")],
    key_id: Annotated[str | None, typer.Option(help="Only this key's fragments (master: the master key's own).")] = None,
    topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
    page_size: Annotated[int, typer.Option(min=1, max=5000, help="Fragments per page (one checkpoint each).")] = 1000,
    restart: Annotated[bool, typer.Option(help="Ignore a checkpoint and start over.")] = False,
    max_pages: Annotated[int | None, typer.Option(min=1, help="Stop after this many pages (resume later).")] = None,
) -> None:
    """Export fragments to FILE, page by page; an interrupted export resumes where it stopped."""
    def action(opts: Options, client: AdminClient) -> Exit:
        with _progress(opts, "export") as bar:
            task = bar.add_task("export", total=None)
            result = transfer.export(client, file, key_id=key_id, topic=topic, page_size=page_size, restart=restart,
                                     max_pages=max_pages, progress=lambda done, total: bar.update(task, completed=done, total=total))
        state = "complete" if result.complete else f"stopped; resume with the same command ({transfer.export_checkpoint(file).name})"
        _emit(opts, asdict(result), f"exported {result.rows} fragments to {file} in {result.pages} pages: {state}")
        return Exit.OK
    _run(ctx, action)


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSON Lines (an export) or a JSON array.")],
    key_id: Annotated[str | None, typer.Option(help="Put every fragment in this key's tenant.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=1000, help="Fragments per request (one checkpoint each).")] = 200,
    restart: Annotated[bool, typer.Option(help="Ignore a checkpoint and start over.")] = False,
    max_batches: Annotated[int | None, typer.Option(min=1, help="Stop after this many batches (resume later).")] = None,
) -> None:
    """Import fragments through the write path, in batches; an interrupted import resumes."""
    def action(opts: Options, client: AdminClient) -> Exit:
        with _progress(opts, "import") as bar:
            task = bar.add_task("import", total=None)
            result = transfer.import_file(client, file, key_id=key_id, batch_size=batch_size, restart=restart,
                                          max_batches=max_batches,
                                          progress=lambda done, total: bar.update(task, completed=done, total=total))
        totals = ", ".join(f"{v} {k}" for k, v in result.totals.items())
        state = "complete" if result.complete else "stopped; resume with the same command"
        human = f"imported {result.done} of {result.total} items ({totals}): {state}"
        for failure in result.failures[:10]:
            human += f"\n  item {failure.get('index')}: {failure.get('error')}"
        _emit(opts, asdict(result), human)
        return Exit.FAILED if result.totals.get("failed") else Exit.OK
    _run(ctx, action)


# -- maintenance ----------------------------------------------------------------------------------

def _wait_run(opts: Options, client: AdminClient, path: str, timeout: float) -> dict[str, Any]:
    """Poll a run until it finishes, showing its stage / phase progress."""
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    shown = None
    with _progress(opts, "run") as bar:
        task = bar.add_task("queued", total=None)
        while time.monotonic() < deadline:
            run = client.get(path)
            progress = run.get("progress") or {}
            label = progress.get("stage") or progress.get("phase") or run["status"]
            total = progress.get("total") or progress.get("phases")
            done = progress.get("done", progress.get("phaseIndex", 0))
            bar.update(task, description=str(label), completed=done or 0, total=total)
            if not opts.json and not err.is_terminal and label != shown:  # no bar: a line per stage instead
                shown = label
                err.print(f"run {run['runId']}: {label}" + (f" ({done}/{total})" if total else ""), highlight=False)
            if run["status"] in RUN_DONE:
                bar.update(task, completed=total or 1, total=total or 1, description=run["status"])
                return run
            time.sleep(POLL_SECONDS)
    raise CliError(f"run did not finish within {timeout:.0f} s (still {run.get('status')}); it goes on in the worker", Exit.UNAVAILABLE)


def _stages_table(run: dict[str, Any]) -> Table:
    stages = (run.get("result") or {}).get("stages") or {}
    table = Table(title=f"run {run['runId']}: {run['status']}")
    for column in ("stage", "processed", "ms", "note"):
        table.add_column(column)
    for name, stage in stages.items():
        note = stage.get("error") or stage.get("skipped") or ""
        table.add_row(name, str(stage.get("processed", "")), str(stage.get("durationMs", "")), str(note))
    return table


@app.command()
def consolidate(
    ctx: typer.Context,
    stage: Annotated[list[str] | None, typer.Option(help="Run only this stage (repeatable).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the run and show its stages.")] = True,
    wait_timeout: Annotated[float, typer.Option(help="Seconds to wait for the run.")] = 1800,
) -> None:
    """Run a consolidation cycle of every tenant now; waits, showing each stage as it runs."""
    def action(opts: Options, client: AdminClient) -> Exit:
        started = client.json("POST", "/maintenance/consolidation", json={"stages": stage} if stage else {})
        if not wait:
            _emit(opts, started, f"consolidation run {started['runId']} queued")
            return Exit.OK
        run = _wait_run(opts, client, f"/maintenance/runs/{started['runId']}", wait_timeout)
        _emit(opts, run, _stages_table(run))
        return Exit.OK if run["status"] == "succeeded" else Exit.FAILED
    _run(ctx, action)


@app.command()
def fsck(
    ctx: typer.Context,
    scope: Annotated[str, typer.Option(help="all, master or key.")] = "all",
    key_id: Annotated[str | None, typer.Option(help="With --scope key: whose fragments.")] = None,
    incremental: Annotated[bool, typer.Option(help="Only fragments changed since their last check.")] = False,
    apply: Annotated[bool, typer.Option(help="Apply every fix the check proposes.")] = False,
    wait: Annotated[bool, typer.Option(help="Wait for the check and list its issues.")] = True,
    wait_timeout: Annotated[float, typer.Option(help="Seconds to wait for the check.")] = 1800,
) -> None:
    """Check memories (duplicates, contradictions, quality, secrets); optionally apply the fixes."""
    def action(opts: Options, client: AdminClient) -> Exit:
        body: dict[str, Any] = {"scope": scope, "incremental": incremental}
        if key_id:
            body["keyId"] = key_id
        started = client.json("POST", "/fsck", json=body)
        if not wait:
            _emit(opts, started, f"fsck run {started['id']} queued")
            return Exit.OK
        run = _wait_run(opts, client, f"/fsck/{started['id']}", wait_timeout)
        applied = client.json("POST", f"/fsck/{started['id']}/apply", json={}) if apply and run["status"] == "succeeded" else None
        issues = run.get("issues") or []
        columns = ["id", "issue_type", "severity", "confidence", "fragments", "reason", "status"]
        rows = [{**i, "fragments": ", ".join(i.get("fragment_ids") or [])} for i in issues]
        table = _table(rows, columns, title=f"fsck run {run['runId']}: {run['status']}")
        _emit(opts, {**run, "applied": applied}, table if applied is None else f"{len(issues)} issues; applied: {applied}")
        return Exit.OK if run["status"] == "succeeded" else Exit.FAILED
    _run(ctx, action)


# -- sessions -------------------------------------------------------------------------------------

@session_app.command("list")
def session_list(
    ctx: typer.Context,
    status: Annotated[str, typer.Option(help="active, ended or all.")] = "active",
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
) -> None:
    """Sessions with their activity, and how many ended sessions await reflect."""
    def action(opts: Options, client: AdminClient) -> None:
        data = client.get("/sessions", status=status, limit=limit)
        rows = [{**s, "calls": s["activity"]["totalCalls"]} for s in data["sessions"]]
        _emit(opts, data, _table(rows, ["sessionId", "status", "keyName", "mode", "calls", "lastAccessedAt", "currentSegment"],
                                 title=f"{data['counts']['total']} open, {data['counts']['unreflected']} unreflected"))
    _run(ctx, action)


@session_app.command("show")
def session_show(ctx: typer.Context, session_id: str) -> None:
    """A session: segments, activity, search events, tool feedback."""
    def action(opts: Options, client: AdminClient) -> None:
        _emit(opts, client.get(f"/sessions/{session_id}"))
    _run(ctx, action)


@session_app.command("end")
def session_end(ctx: typer.Context, session_id: str) -> None:
    """End a session now (its id stops working; its last segment goes to reflect)."""
    def action(opts: Options, client: AdminClient) -> None:
        ended = client.json("DELETE", f"/sessions/{session_id}")
        _emit(opts, ended, f"session {ended['sessionId']} ended")
    _run(ctx, action)


@session_app.command("rotate")
def session_rotate(
    ctx: typer.Context, session_id: str,
    reason: Annotated[str | None, typer.Option(help="For the audit log (at most 128 characters).")] = None,
    origin: Annotated[str | None, typer.Option(help="Origin header (default: the server URL's origin).")] = None,
) -> None:
    """seed `session rotate <sessionId>`: POST /session/rotate, a new id for the session, its state
    kept. The key must be the session's own (the master key for the master key's sessions)."""
    def action(opts: Options, client: AdminClient) -> None:
        parts = urlsplit(opts.url)
        headers = {"Mcp-Session-Id": session_id, "Origin": origin or f"{parts.scheme}://{parts.netloc}"}
        rotated = client.json("POST", "/session/rotate", admin=False, headers=headers, json={"reason": reason} if reason else {})
        _emit(opts, rotated, f"session {rotated['oldSessionId']} is now {rotated['newSessionId']} ({rotated['reason']})")
    _run(ctx, action)


if __name__ == "__main__":
    app()
