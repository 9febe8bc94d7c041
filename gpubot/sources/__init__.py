"""Sources: what gpubot reads from services beside the nodes (the cluster's slurmrestd, the
site's Prometheus)."""
