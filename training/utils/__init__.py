"""Helpers of every command: one-line user errors (errors, cli), atomic file and folder writes (atomic), and processes
that fail and finish together (collective)."""
