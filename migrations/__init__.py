"""gpubot's Alembic migrations (installed as the package ``gpubot_migrations``)."""
