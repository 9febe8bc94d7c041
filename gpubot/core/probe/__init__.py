"""The node probe: one remote exec per node, read as script -> sections -> fields -> snapshot."""
