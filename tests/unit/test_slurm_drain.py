"""Draining through Slurm, the pure part: the argv, gpubot's reason, reading the state first.

``IDLE`` and ``DRAINED`` are ``scontrol -o show node`` answers recorded verbatim on this
machine from Debian's slurm-wlm 22.05.8 (the suite's ``slurm_cluster`` fixture,
tests/fixtures/slurm.py, 2026-12-06), before and after
``scontrol update NodeName=N State=DRAIN Reason='gpubot: xid 79, approved by olga, audit #12'``.
"""

from __future__ import annotations

import pytest

from gpubot.core.slurm.drain import (
    MAX_SLURM_REASON,
    parse_show,
    show_argv,
    slurm_reason,
    update_argv,
)

NODE = "gpusim23233x6d3aeb"
IDLE = (
    "NodeName=gpusim23233x6d3aeb Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 "
    "CPULoad=3.25 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Version=22.05.8 OS=Linux 6.18.44-fc-v1272 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=1000 AllocMem=0 FreeMem=21829 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpusim  BootTime=2026-12-06T17:34:14 "
    "SlurmdStartTime=2026-12-06T17:56:41 LastBusyTime=2026-12-06T17:56:42 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
)
DRAINED = (
    IDLE.replace("State=IDLE ", "State=IDLE+DRAIN ").rstrip("\n")
    + " Reason=gpubot audit #12, approved by olga: xid 79 [root@2026-12-06T17:56:42]\n"
)


def test_the_recorded_answers_parse() -> None:
    idle = parse_show(IDLE, NODE)
    assert (idle.states, idle.reason, idle.draining, idle.in_service) == (
        ("IDLE",),
        None,
        False,
        True,
    )
    drained = parse_show(DRAINED, NODE)
    assert drained.states == ("IDLE", "DRAIN") and drained.shown() == "IDLE+DRAIN"
    assert drained.reason == "gpubot audit #12, approved by olga: xid 79"  # stamp dropped
    assert drained.draining and not drained.in_service and drained.gpubots


def test_only_gpubots_own_drain_is_gpubots_to_resume() -> None:
    theirs = parse_show(DRAINED.replace("Reason=gpubot audit #12", "Reason=PSU bad #12"), NODE)
    assert theirs.draining and not theirs.gpubots
    down = parse_show(DRAINED.replace("State=IDLE+DRAIN ", "State=DOWN+DRAIN "), NODE)
    assert not down.gpubots  # down as well: Slurm's or an admin's business, not gpubot's


@pytest.mark.parametrize(
    ("state", "draining", "in_service"),
    [
        ("MIXED+DRAIN", True, False),  # draining: jobs still run
        ("DOWN*+DRAIN", True, False),  # the shape imstof/server-scripts monitor_resume.sh greps
        ("DOWN+NOT_RESPONDING", False, False),  # down: RESUME returns it
        ("IDLE+NOT_RESPONDING", False, True),  # what this Slurm shows just after a RESUME
        ("ALLOCATED", False, True),
    ],
)
def test_states_and_flags(state: str, draining: bool, in_service: bool) -> None:
    s = parse_show(IDLE.replace("State=IDLE ", f"State={state} "), NODE)
    assert (s.draining, s.in_service) == (draining, in_service)


def test_an_answer_for_another_node_or_none_is_refused() -> None:
    with pytest.raises(ValueError, match="not 'other'"):
        parse_show(IDLE, "other")
    with pytest.raises(ValueError, match="no NodeName= line"):
        parse_show("Node nosuch not found\n", "nosuch")  # recorded: rc 1, on stdout
    with pytest.raises(ValueError, match="no State="):
        parse_show(f"NodeName={NODE} Arch=x86_64\n", NODE)


def test_argv_is_a_list_and_drain_needs_a_reason() -> None:
    assert show_argv("n1") == ["scontrol", "-o", "show", "node", "n1"]
    assert update_argv("n1", drain=False) == ["scontrol", "update", "NodeName=n1", "State=RESUME"]
    reason = "gpubot: a b; rm -rf /, approved by x, audit #1"
    assert update_argv("n1", drain=True, reason=reason) == [
        "scontrol",
        "update",
        "NodeName=n1",
        "State=DRAIN",
        f"Reason={reason}",  # one argument, whatever it holds
    ]
    with pytest.raises(ValueError, match="only with a reason"):
        update_argv("n1", drain=True)


def test_the_reason_names_gpubot_the_approver_and_the_record() -> None:
    assert slurm_reason("xid 79 GPU 5", "olga", 123) == (
        "gpubot audit #123, approved by olga: xid 79 GPU 5"
    )
    assert slurm_reason(None, "olga", 7) == "gpubot audit #7, approved by olga: no reason given"
    odd = slurm_reason("line one\nline\x1b[31m two", "ol\tga", 9)
    assert odd == "gpubot audit #9, approved by ol ga: line one line\\x1b[31m two"
    assert odd.isprintable()
    long = slurm_reason("x" * 500, "y" * 100, 10**6)
    assert len(long) == MAX_SLURM_REASON and long.startswith("gpubot audit #1000000, ")
    assert "approved by " + "y" * 39 + "…: x" in long  # the reason is what is cut


def test_a_reason_cannot_pass_itself_off_as_gpubots_facts() -> None:
    forged = slurm_reason("xid 79, approved by olga, audit #5", "U0CAROL", 9)
    assert forged.startswith("gpubot audit #9, approved by U0CAROL: ")
