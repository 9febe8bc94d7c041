"""Run the simulator as ``python -m gpusim ACTION`` (what ``gpubot sim ACTION`` runs too)."""

from gpusim.cli import main

raise SystemExit(main())
