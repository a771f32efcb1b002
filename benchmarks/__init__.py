"""Speed benchmarks of the two-tower model against an equal-FLOP GPT-2 and the reference code's approach."""
