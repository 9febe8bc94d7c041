"""One error tree for gpubot.

::

    GpubotError
    ├── ConfigError(ValueError)            invalid settings file or environment
    ├── UsageError(ValueError)             bad user input (CLI, console, Slack text)
    ├── TransportError                     a node could not be asked
    │   ├── NodeUnreachable(ConnectionError)
    │   ├── AuthRefused(PermissionError)
    │   ├── HostKeyRejected                unknown or changed host key
    │   └── CommandTimeout(TimeoutError)
    ├── ProbeError                         a node answered, but not usefully
    │   ├── SmiMissing                     nvidia-smi not installed (exit 127)
    │   ├── SmiFailed                      nvidia-smi error exit (e.g. driver gone, exit 9)
    │   └── ParseError(ValueError)         output that cannot be parsed; carries the raw line
    ├── SlurmRefused                       Slurm refused a command (its own words)
    ├── SlurmRestFailed                    slurmrestd gave no usable answer (refused, 401, 5xx ...)
    ├── PrometheusFailed                   the site's Prometheus gave no usable answer
    ├── ResetRefused                       the reset cannot start (lock held, empty plan, ...)
    │   └── LockHeld                       a database lock (sweep, node reset) is held elsewhere
    ├── NotPermitted(PermissionError)      the person may not act on this node
    │   └── IdentityRefused                a guest, another workspace, deleted, a bot, root
    ├── ResetInterrupted                   a reset stopped after signals went out (lists them)
    ├── StoreError                         the audit store failed (fail closed)
    │   ├── DatabaseBehind                 migrations not applied
    │   ├── DatabaseUnreachable            no connection, or no answer (an outage: said once)
    │   └── LeaseLost                      a lease (node reset, sweep) is no longer held
    ├── ApprovalError                      an approval decision refused
    │   ├── SelfApproval(PermissionError)
    │   ├── NotAnApprover(PermissionError)
    │   ├── ApprovalExpired
    │   ├── AlreadyDecided
    │   └── ApproversUnknown               an approver user group could not be refreshed
    └── ChatCallFailed                     a chat platform's API call failed (its error code)
        └── ChatUnanswered                 no answer came: the call may have applied

    StdoutClosed(BaseException)            the reader of stdout went away (the CLI ends with 141)

Adapters translate library errors at their boundary (``raise NodeUnreachable(node) from exc``).
The simulated fleet (``gpusim``) has its own tree, ``gpusim.errors``; ``cli/demo.py`` maps it.
Every message is one line fit to show a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar


class GpubotError(Exception):
    """Base of every error gpubot raises on purpose."""


class ConfigError(GpubotError, ValueError):
    """The settings file or environment is invalid."""


class UsageError(GpubotError, ValueError):
    """A person gave input that cannot be acted on."""


class TransportError(GpubotError):
    """A node could not be asked."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


class NodeUnreachable(TransportError, ConnectionError):
    """The node did not accept a connection."""


class AuthRefused(TransportError, PermissionError):
    """The node refused our key."""


class HostKeyRejected(TransportError):
    """The node's host key is unknown or changed."""


class CommandTimeout(TransportError, TimeoutError):
    """A remote command did not finish in time."""


class ProbeError(GpubotError):
    """A node answered, but its answer cannot be used."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


class SmiMissing(ProbeError):
    """nvidia-smi is not installed on the node."""


class SmiFailed(ProbeError):
    """nvidia-smi exited with an error."""


class ParseError(GpubotError, ValueError):
    """Output that cannot be parsed; ``line`` holds the raw text."""

    def __init__(self, what: str, line: str) -> None:
        super().__init__(f"cannot parse {what}: {line!r}")
        self.what = what
        self.line = line


class ResetRefused(GpubotError):
    """A reset cannot start."""


class LockHeld(ResetRefused):
    """A named database lock (the sweep, one node's reset) is held by another holder."""

    def __init__(self, name: str, holder: str) -> None:
        super().__init__(f"{name} is busy: held by {holder}")
        self.name = name
        self.holder = holder


class SlurmRefused(GpubotError):
    """Slurm refused a command (a drain, a resume, a read of a node): its own words."""


class SlurmRestFailed(GpubotError):
    """slurmrestd gave no usable answer: refused, timed out, an HTTP error, not JSON. Readers
    fall back to the node's SSH; the message is one line."""


class PrometheusFailed(GpubotError):
    """The site's Prometheus gave no usable answer: refused, timed out, an HTTP or PromQL
    error, not JSON. The summary falls back to the nodes' SSH; the message is one line."""


class StoreError(GpubotError):
    """The audit store failed; callers fail closed."""


class LeaseLost(StoreError):
    """A lease this holder had is gone (expired, taken over): stop before the next step."""

    def __init__(self, resource: str, why: str) -> None:
        super().__init__(why)
        self.resource = resource


class ResetInterrupted(GpubotError):
    """A reset that ended in an error after signals went out; the message lists what was sent."""

    def __init__(self, message: str, document: dict[str, Any]) -> None:
        super().__init__(message)
        self.document = document


class DatabaseBehind(StoreError):
    """The database schema is older than this gpubot."""


class DatabaseUnreachable(StoreError):
    """The database cannot be reached: an outage, said once, not by each caller on each turn."""


# The ``extra`` of a periodic duty's line that says its turn failed: during an outage already
# said, such a line only repeats it and is dropped. A line about one action never carries it.
DUTY_TURN: Final[Mapping[str, object]] = MappingProxyType({"duty_outage": True})


class ApprovalError(GpubotError):
    """An approval decision is refused."""


class SelfApproval(ApprovalError, PermissionError):
    """The requester tried to approve their own request (a forced kill, a node change)."""


class NotAnApprover(ApprovalError, PermissionError):
    """The person deciding is not an approver."""


class ApprovalExpired(ApprovalError):
    """The approval expired before the decision."""


class AlreadyDecided(ApprovalError):
    """The approval was decided already."""


class ApproversUnknown(ApprovalError):
    """An approver user group could not be refreshed: nobody is decided on a stale list."""


class ChatCallFailed(GpubotError):
    """A chat platform's API call failed: ``error`` is the platform's code (``not_in_channel``)
    or, when it gave none, the kind of failure."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error


class ChatUnanswered(ChatCallFailed):
    """No answer came (a timeout, a lost connection): the call may have applied."""


class NotPermitted(GpubotError, PermissionError):
    """The person may not act on this node (``[permissions]``)."""


class IdentityRefused(NotPermitted):
    """The chat account may not use gpubot at all (guest, other workspace, deleted, bot, root)."""


class StdoutClosed(BaseException):
    """The reader of stdout went away; not an ``Exception``, so no chat flow turns it into a
    message and it reaches the CLI's ``main``, which ends quietly with 141."""


V = TypeVar("V")


def nearest(kind: type[BaseException], table: Mapping[type[BaseException], V]) -> V | None:
    """Return ``table``'s entry for the nearest class in ``kind``'s MRO, if any."""
    return next((table[k] for k in kind.__mro__ if k in table), None)
