"""``gpubot doctor``'s checks: what it asks a node and the database, and what it makes of it."""
