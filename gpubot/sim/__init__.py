"""The simulated GPU fleet: a product feature (demo, trials) and the test bed.

``gpubot.sim.fleet.SimFleet`` starts N nodes, each a state directory with device files, a
stand-in ``nvidia-smi`` and real workload processes, served over real SSH on 127.0.0.1
(asyncssh in-process, or OpenSSH ``sshd``), and writes a ``gpubot.toml`` that the rest of
gpubot uses unchanged. ``gpubot sim up|down|spawn|fault|state`` drives it from a shell.

``simstate``, ``nvidia_smi`` and ``workload`` are standalone (standard library only): the
fleet copies them next to the nodes so that they run with the system Python as any user.
"""
