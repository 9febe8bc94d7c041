"""gpubot's packages, found rather than listed, so that a new subpackage ships without an edit.

pyproject.toml cannot say this alone: its ``packages.find`` finds ``migrations/`` under that name,
and the wheel ships it as ``gpubot_migrations``. The simulator (``sim/``) is not among them.
"""

from setuptools import find_packages, setup

MIGRATIONS = ["gpubot_migrations", *(f"gpubot_migrations.{p}" for p in find_packages("migrations"))]

setup(
    packages=[*find_packages(include=["gpubot", "gpubot.*"]), *MIGRATIONS],
    package_dir={"gpubot_migrations": "migrations"},
)
