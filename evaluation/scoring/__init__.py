"""Scoring a trained model: the score command, its one-pass engine, the ablation and cross-fitted preferences."""
