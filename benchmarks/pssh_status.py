"""The parallel-ssh baseline: one fresh process, one exec per node running the two queries.

``python -m benchmarks.pssh_status SPEC.json`` (written by ``benchmarks.fleet_status``) connects to
every node with pssh's ``ParallelSSHClient`` (libssh2), runs the node's command, prints every
output line and exits non-zero if a node failed. Note: parallel-ssh does not check host keys.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    """Run the spec's command on every node; print the outputs."""
    from pssh.clients import ParallelSSHClient  # type: ignore[import-untyped]
    from pssh.config import HostConfig  # type: ignore[import-untyped]

    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    nodes = spec["nodes"]
    configs = [
        HostConfig(port=n["port"], user=spec["user"], private_key=spec["key"]) for n in nodes
    ]
    client = ParallelSSHClient(
        ["127.0.0.1"] * len(nodes),
        host_config=configs,
        pool_size=len(nodes),
        allow_agent=False,
        num_retries=1,
        timeout=60,
    )
    output = client.run_command("%s", host_args=[n["command"] for n in nodes], stop_on_errors=False)
    client.join(output)
    bad = 0
    for i, host_out in enumerate(output):
        if host_out.exception is not None:
            print(f"node {i}: {host_out.exception!r}", file=sys.stderr)
            bad += 1
            continue
        for line in host_out.stdout:
            print(line)
        if host_out.exit_code != 0:
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
