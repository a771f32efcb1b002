"""How a two-tower model is trained (the joint phase, then the probes) and published as a Hub repository."""
