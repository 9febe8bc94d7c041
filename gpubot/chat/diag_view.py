"""How ``/gpu diag`` reads in chat: one row per test (category, test, result, message) for the
GPU asked about, the verdict, DCGM's version and the audit record."""

from __future__ import annotations

from gpubot.chat.errors import error_message
from gpubot.chat.layout import Budget, clip, rows_of, table_fits, table_text
from gpubot.chat.message import Heading, Mention, Message, Section, Sentence, Table, ctx, note
from gpubot.chat.surface import Surface
from gpubot.config import Settings
from gpubot.core import commands
from gpubot.errors import GpubotError
from gpubot.services.diag import DiagRun
from gpubot.services.requests import Failed, Refusal, RequestEvent, RequestService
from gpubot.services.reset import Ask

VERDICT = {
    "pass": "✅ passed",
    "warn": "⚠ passed with warnings",
    "fail": "❌ FAILED",
    "none": "ℹ no test judged the GPU",
}


def diag_rows(run: DiagRun) -> list[list[str]]:
    """Return the table of a run: header, then one row per test on the GPU."""
    rows = [["Category", "Test", "Result", "Message"]]
    for r in run.rows:
        rows.append([r.category, r.test, r.status.upper(), clip(r.message, 200)])
    return rows


def diag_text(run: DiagRun) -> list[str]:
    """Return the run as terminal lines (the CLI's and the console's table)."""
    return table_text(diag_rows(run))


def render_diag(run: DiagRun, who: str) -> Message:
    """Render a diagnostic ``who`` (a chat id) asked for."""
    title = f"dcgmi diag {run.node} · GPU {run.gpu} · {run.level}"
    verdict = VERDICT.get(run.verdict, run.verdict)
    b = Budget()
    b.add(Heading(f"{title} · {verdict}"))
    rows = diag_rows(run)
    if len(rows) > 1 and table_fits(rows):
        b.add(Table(rows_of(rows), wrap=(3,)))
    elif len(rows) > 1:
        b.add_pre(table_text(rows), reserve=3)
    if run.report.runtime_error is not None:
        b.add(Section((Sentence(f"DCGM could not run: {run.report.runtime_error}"),)))
    version = f"DCGM {run.report.version}" if run.report.version else "DCGM version not said"
    b.add(ctx(("Requested by ", Mention(who)), version, f"audit #{run.action_id}"))
    failed = [r.test for r in run.rows if r.status in ("fail", "unknown")]
    fallback = f"{title}: {verdict}" + (f" ({', '.join(failed[:10])})" if failed else "")
    return b.message(clip(fallback, 3000))


async def run_diag(
    requests: RequestService, settings: Settings, ask: Ask, cmd: commands.Diag, out: Surface
) -> None:
    """Run DCGM's diagnostic on one GPU and show its table (or, in one line, why none ran)."""
    refusals: list[GpubotError] = []

    async def sink(event: RequestEvent) -> None:
        if isinstance(event, Refusal):
            refusals.append(event.error)

    limit = settings.reset.diag_medium_s if cmd.level == "medium" else settings.reset.diag_quick_s
    waiting = f"⏳ dcgmi diag ({cmd.level}) on {cmd.node} GPU {cmd.gpu}, at most {limit:g} s …"
    handle = await out.post(note(waiting))
    outcome = await requests.diag(ask, cmd, sink)
    if isinstance(outcome, DiagRun):
        await out.update(handle, render_diag(outcome, ask.who.id))
    elif isinstance(outcome, Failed):
        await out.update(handle, error_message(outcome.error))
    elif refusals:
        await out.update(handle, error_message(refusals[0]))
    else:
        await out.update(handle, note("Refused: nothing was run."))
