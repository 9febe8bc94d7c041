"""GPU health: nvidia-smi's health fields, Xid and SXid events, and the findings they make."""
