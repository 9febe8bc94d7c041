"""Approvals of forced actions: the value, the store port, and the posts that must appear once."""
