"""The tower_preference `evaluate` module, also a package so that twotower.evaluation imports its core."""
