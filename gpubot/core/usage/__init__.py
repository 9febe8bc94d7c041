"""Sharing: GPU-hours, idle runs per holder, and the reclaim ladder."""
