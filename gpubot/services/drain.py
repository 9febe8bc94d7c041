"""Drain and resume a Slurm node, audited like a reset: intent → read → ``scontrol update`` →
outcome.

The intent is written before anything goes out to the node (fail closed), and its id is what
gpubot's reason in Slurm names (``gpubot audit #123, approved by olga: xid 79``). The node's
state is read first: a node drained already, or in service already, is told so and nothing is
sent (``unchanged``); a resume of a node out of service for another reason than gpubot's drain
(an admin's, Slurm's own ``Kill task failed``, a node down) is refused: a person lifts that.
Slurm's refusal (a non-zero exit) is one line with Slurm's own words, recorded as the action's
``error``. Everything runs over the node's transport as argv, with ``sudo -n`` where the node
says so. Who may ask is the caller's to decide (``RequestService``): this service records the
approval it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from gpubot.config import Settings
from gpubot.core.models import ActionStatus, NodeConfig
from gpubot.core.names import as_root
from gpubot.core.nodelog import Attribution, NodeLog, line, logged_argv, quoted, split_logged
from gpubot.core.ports import AuditStore, Locks, Transport
from gpubot.core.slurm.drain import (
    SLURM,
    NodeDrainState,
    one_line_error,
    parse_show,
    show_argv,
    slurm_reason,
    update_argv,
)
from gpubot.errors import GpubotError, SlurmRefused, UsageError
from gpubot.services.reset import Ask
from gpubot.services.status import StatusService


@dataclass(frozen=True)
class DrainResult:
    """What a drain or resume did: ``changed`` False when the node was so already."""

    node: str
    slurm_node: str
    drain: bool  # False: a resume
    changed: bool
    before: NodeDrainState
    after: NodeDrainState | None  # None: not read again (unchanged)
    reason: str | None  # the reason written into Slurm (None: none written)
    action_id: int
    node_log: NodeLog | None = None  # the node's log line and what logger said (None: unchanged)

    @property
    def verb(self) -> str:
        return "drain" if self.drain else "resume"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "slurm_node": self.slurm_node,
            "action": self.verb,
            "changed": self.changed,
            "before": _state(self.before),
            "after": None if self.after is None else _state(self.after),
            "slurm_reason": self.reason,
            "node_log": None if self.node_log is None else self.node_log.to_dict(),
        }


def _state(s: NodeDrainState) -> dict[str, Any]:
    return {"state": s.shown(), "reason": s.reason}


def drain_lock(node: str) -> str:
    """The lease that one drain or resume of ``node`` holds (one at a time)."""
    return f"slurm-state:{node}"


def slurm_node_of(node: NodeConfig) -> str:
    """Return ``node``'s NodeName in Slurm, or a one-line ``UsageError`` if Slurm does not own
    it (``scheduler = "slurm"``)."""
    if node.scheduler != SLURM:
        raise UsageError(
            f'{node.name} is not a Slurm node (its settings name no scheduler = "{SLURM}"): '
            "gpubot drains and resumes Slurm nodes only"
        )
    return node.slurm_name


class DrainService:
    """Drains and resumes Slurm nodes over their transport, each change audited."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        store: AuditStore,
        status: StatusService,
        locks: Locks,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.store = store
        self.status = status
        self.locks = locks

    def check(self, node_name: str) -> NodeConfig:
        """Return the node if it is known and Slurm owns it (``UsageError`` otherwise)."""
        node = self.status.node(node_name)
        slurm_node_of(node)
        return node

    async def change(
        self,
        ask: Ask,
        node_name: str,
        *,
        drain: bool,
        reason: str | None = None,
        approval: Mapping[str, Any],
    ) -> DrainResult:
        """Drain (``drain``) or resume the node as ``ask`` asks, audited; the ``approval`` (who
        approved, and how) is recorded with the intent and its approver named in Slurm."""
        node = self.check(node_name)
        name = slurm_node_of(node)
        kind = "drain" if drain else "resume"
        actor = ask.who.id
        async with self.locks.hold(drain_lock(node.name), holder=actor) as lease:
            intent = {
                "slurm_node": name,
                "state": "DRAIN" if drain else "RESUME",
                "reason": reason,
                "approval": dict(approval),
            }
            if lease.took_over is not None:
                intent["lease"] = {"took_over": lease.took_over}
            action_id = await self.store.begin_action(
                kind=kind,
                actor=actor,
                source=ask.source,
                command=ask.command,
                node=node.name,
                gpus=(),
                plan=intent,
                fence=lease.fence,
            )
            sent: list[str] = []
            logs: list[NodeLog] = []
            who = Attribution.of(actor, ask.who.name, action_id, approval)
            try:
                # Slurm's reason names the approver by what they cannot choose: their Linux
                # user, else their chat id (the node's log line quotes their name)
                approver = str(approval.get("approver_user") or approval.get("approver") or "?")
                result = await self._change(node, name, drain, reason, (who, approver), sent, logs)
                status = ActionStatus.DONE if result.changed else ActionStatus.UNCHANGED
                await self.store.finish_action(
                    action_id, status=status, result=result.to_dict(), fence=lease.fence
                )
                return result
            except BaseException as exc:
                doc: dict[str, Any] = {
                    "error": str(exc) or type(exc).__name__,
                    "sent": sent,
                    "ok": False,
                }
                if logs:  # the update went out: what logger said of its line
                    doc["node_log"] = logs[0].to_dict()
                # written without the fence: it records what happened; if even that fails the
                # action stays without an outcome, listed as interrupted
                with suppress(GpubotError):
                    await self.store.finish_action(action_id, status=ActionStatus.ERROR, result=doc)
                raise

    async def _change(
        self,
        node: NodeConfig,
        name: str,
        drain: bool,
        reason: str | None,
        by: tuple[Attribution, str],
        sent: list[str],
        logs: list[NodeLog],
    ) -> DrainResult:
        who, approver = by
        before = await self.read(node, name)
        if (drain and before.draining) or (not drain and before.in_service):
            return DrainResult(node.name, name, drain, False, before, None, None, who.action_id)
        if not drain and not before.gpubots:
            why = f": {before.reason}" if before.reason else ""
            raise SlurmRefused(
                f"{name} is {before.shown().lower()}, not by gpubot{why}; gpubot resumes only its "
                f"own drains (scontrol update NodeName={name} State=RESUME, by hand)"
            )
        written = None
        verb = "drain" if drain else "resume"
        if drain:
            written = slurm_reason(reason, approver, who.action_id)
        argv = update_argv(name, drain=drain, reason=written)
        sent.append(" ".join(argv))
        why = f" because {quoted(reason, 120)}" if drain and reason else ""
        note = line(verb, node.name, (), f"Slurm node {quoted(name)}{why}", who)
        cmd = logged_argv(note, as_root(argv, sudo=node.sudo))
        res = await self.transport.run(node, cmd, timeout=self.settings.ssh.command_timeout_s)
        log, stdout = split_logged(res.stdout, note)
        logs.append(log)
        if res.exit_status != 0:
            said = one_line_error((stdout + "\n" + res.stderr).strip())
            raise SlurmRefused(f"Slurm refused to {verb} {name}: {said}")
        after = await self.read(node, name)
        return DrainResult(node.name, name, drain, True, before, after, written, who.action_id, log)

    async def read(self, node: NodeConfig, name: str) -> NodeDrainState:
        """Return the node's state as Slurm says it (``SlurmRefused``: Slurm would not)."""
        status, out = await self._run(node, show_argv(name))
        if status != 0:
            raise SlurmRefused(f"Slurm cannot show node {name}: {one_line_error(out)}")
        try:
            return parse_show(out, name)
        except ValueError as exc:
            raise SlurmRefused(f"cannot read Slurm's state of {name}: {exc}") from None

    async def _run(self, node: NodeConfig, argv: list[str]) -> tuple[int, str]:
        res = await self.transport.run(node, argv, timeout=self.settings.ssh.command_timeout_s)
        return res.exit_status, (res.stdout + "\n" + res.stderr).strip()
