"""Run gpubot as ``python -m gpubot``."""

from gpubot.cli import main

raise SystemExit(main())
