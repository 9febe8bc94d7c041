"""What gpubot asks the cluster's slurmrestd, and how it reads the answers (pure, no I/O).

slurmrestd serves its OpenAPI description at ``/openapi/v3`` (22.05 and later; ``/openapi``
before) whatever the token, and the plugin versions it loaded under ``/slurm/v0.0.NN/``: Debian's
22.05 serves v0.0.36 to v0.0.38, 24.11 v0.0.40 to v0.0.42 (``tests/corpus/slurm/openapi-*``).
The version is discovered, never assumed: the highest of those this parser reads
(``parse.pick_version``). A node is asked for alone (``/node/NAME``); the jobs are the whole
``/jobs`` list in every version up to v0.0.44 (it has no node filter), which ``jobs_on`` sorts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from gpubot.core.slurm import parse
from gpubot.core.text import cut, one_line

DISCOVERY = ("/openapi/v3", "/openapi")  # the description's paths, newest first
INVALID_NODE_NAME = 2018  # ESLURM_INVALID_NODE_NAME (slurm/slurm_errno.h)


def node_path(version: str, slurm_node: str) -> str:
    return f"/slurm/{version}/node/{quote(slurm_node, safe='')}"


def jobs_path(version: str) -> str:
    return f"/slurm/{version}/jobs"


def versions_said(versions: list[str]) -> str:
    """``v0.0.36, v0.0.37`` or ``none``: for a line saying what a slurmrestd serves."""
    return ", ".join(versions) or "none"


def no_version(versions: list[str]) -> str:
    """The line of a slurmrestd that serves no version gpubot reads."""
    known = f"{parse.KNOWN_VERSIONS[0]} to {parse.KNOWN_VERSIONS[-1]}"
    return f"it serves /slurm/ {versions_said(versions)}; gpubot reads {known}"


def http_failure(status: int, doc: Any) -> str:
    """One line for an HTTP error answer: its status, what it means, Slurm's first error."""
    said = ""
    if isinstance(doc, Mapping):
        errors = doc.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], Mapping):
            first = errors[0].get("description") or errors[0].get("error")
            if isinstance(first, str) and first:
                said = f": {cut(one_line(first), 160)}"
    meaning = {401: " (the token or the user was refused)", 403: " (not allowed)"}
    return f"HTTP {status}{meaning.get(status, '')}{said}"


def node_answer(status: int, doc: Any, slurm_node: str) -> bool:
    """Whether a ``/node/NAME`` answer is one to read: a 200, or the error slurmrestd gives for
    a node Slurm does not know, whatever its status (``node_state`` reads it as None): v0.0.44
    "Failure to query node NAME" without ``nodes``; 22.05's v0.0.38 HTTP 500 with an empty
    ``nodes`` and ``{"error": "Invalid node name specified", "errno": 2018}`` (seen here)."""
    if status == 200:
        return True
    if not isinstance(doc, Mapping):
        return False
    if "nodes" not in doc:
        return parse.unknown_node(doc, slurm_node)
    errors = doc.get("errors")
    return (
        doc.get("nodes") == []
        and isinstance(errors, list)
        and len(errors) == 1
        and isinstance(errors[0], Mapping)
        and errors[0].get("errno") == INVALID_NODE_NAME
    )
