"""How the trained parameters are updated: AdamW over an accumulation window, its weight-decay groups and clipping
(optimization), and full-batch L-BFGS for linear probes (linear_probes)."""
