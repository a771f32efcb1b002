"""A run's saved state: its checkpoints and their resume (checkpointing), the checksum manifest of a saved folder
(manifest), and the options a checkpoint cannot be resumed with (resume_limits)."""
