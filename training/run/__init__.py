"""A run around its loop: its output folder and lock (run_folder), what it prepares before the loop (run_setup),
and early stopping on the validation loss (early_stopping)."""
