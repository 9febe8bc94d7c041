"""The simulated GPU fleet: a product feature (demo, trials) and the test bed.

``gpusim.fleet.SimFleet`` starts N nodes, each a state directory with device files, a
stand-in ``nvidia-smi`` and real workload processes, served over real SSH on 127.0.0.1
(asyncssh in-process, or OpenSSH ``sshd``), and writes a ``gpubot.toml`` that the rest of
gpubot uses unchanged. ``gpubot sim up|down|spawn|fault|state`` (or ``python -m gpusim``)
drives it from a shell.

A distribution of its own (gpubot's ``demo`` extra), so that gpubot ships without it: it imports
nothing of gpubot (its errors are ``gpusim.errors``), and of gpubot only ``gpubot.cli.demo``
imports it (``tests/unit/test_layers.py`` holds both).

The fleet side: ``fleet`` (with ``fleet_setup``, ``inventory``, ``placements``, ``driver``,
``control``, ``server*``) builds ``node.SimNode``s, which lay out their files (``node_layout``),
start workloads (``spawning``, ``spec``, ``cgroups``) and ask the fleet for the rest through
``host.NodeHost``.

The node side (``fleet_setup.STANDALONE``: ``simstate``, ``nvidia_smi``, ``smi_faults``,
``workload``, ``sudo``, ``sudoers``, ``runtimes``, ``runtime_registry``, ``containers``,
``jobs``) is standalone: standard library only, importing one another relatively; the fleet
copies those modules next to the nodes (``gpusim``) so that they run with the system Python as
any user.
"""
