"""The data of a run: raw text to blocks of token ids (blocks), the tokenizer, and what the objective makes of
the blocks (objectives: the batches, what each position predicts)."""
