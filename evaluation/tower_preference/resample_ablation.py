"""
Resample ablation: which tower the trained joint model needs for a token, with each tower's state replaced by its
state on another text rather than by a mean.

A mean state is one no text produces (off-distribution: the joint head may lose more on it than on any real state),
so causal-scrubbing-style interpretability replaces a state by a resampled one instead. Here each tower's slice of the
fused representation at a scored position is replaced by that tower's slice at the same position of another block of
the batch: the blocks rolled by one (block b takes block b - 1's, the first takes the last's), a fixed derangement,
so the figure is deterministic; a batch of one block takes the last block of the batch before it. A masked LM's pass
masks the same positions in every block, so the donor state is one of a masked position too. The joint model's loss
rises by the tower's increase, and a type's preference is tested as the mean ablation's (preference_measure.py). It
costs one pass of the joint head per tower and no pass of the towers. On sentence-pair blocks a donor position may
be padding.
"""

import torch


try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .preference_measure import InterventionScores, TowerIntervention
except ImportError:
    from preference_measure import InterventionScores, TowerIntervention


def rolled_blocks(states: torch.Tensor, previous_block: torch.Tensor | None) -> torch.Tensor:
    """Each block's donor states [towers, batch, seq, hidden]: block b - 1's (the first takes the last's); a batch of
    one block takes `previous_block` [towers, 1, seq, hidden], the last block of the batch before."""
    if states.shape[1] > 1:
        return states.roll(1, dims=1)
    if previous_block is None or previous_block.shape != states.shape:
        raise ValueError(
            "Resample ablation replaces a block's states by another block's, but a batch holds one block (of "
            f"{states.shape[2]} positions) and no block of that length came before it: score at least 2 blocks, or "
            "turn the measure off (`--resample_ablation false`)."
        )
    return previous_block


class ResampleAblation(InterventionScores):
    """The resample-ablation increases of every scored position, fed into a PreferenceAccumulator."""

    def __init__(self, num_towers: int, vocab_size: int, model):
        super().__init__(ResampleAblationMeasure.name, num_towers, vocab_size, model)
        self._pass = 0  # the scoring pass of the current batch (a masked LM's k-th masking pass)
        self._last_blocks = {}  # pass -> the last block's states [towers, 1, seq, hidden] of the batch before

    def begin_batch(self, batch) -> None:
        self._pass = 0

    def replacements(self, scored_pass, scored_features) -> torch.Tensor:
        states = self.model.predicting_positions(scored_pass.features, seq_dim=2)  # [towers, batch, seq', hidden]
        donors = rolled_blocks(states, self._last_blocks.get(self._pass))
        self._last_blocks[self._pass] = states[:, -1:]
        self._pass += 1
        return donors[:, scored_pass.scored]  # [towers, n, hidden], in the scored features' order


class ResampleAblationMeasure(TowerIntervention):
    """Resample ablation: a tower's state replaced by its state at the same position of another block."""

    name = "resample_ablation"
    label = "resample ablation"
    method = "resample ablation, no probe"
    option = "resample_ablation"
    min_blocks = 2  # a donor block beside the scored one
    replacement = "its state at the same position of another block of the batch (the blocks rolled by one)"
    report_heading = "Resample-ablation preference (no probe)"

    def consumer(self, model, passes):
        return ResampleAblation(model.config.num_towers, model.config.vocab_size, model)

    def space_increases(self, model, features, targets, passage_features):
        """The Space's blocks of the text rolled by one among the whole ones (a shorter last block takes the first
        whole one's states); None for a text of fewer than two whole blocks."""
        lengths = [states.shape[1] for states in passage_features]
        whole = [index for index, length in enumerate(lengths) if length == max(lengths)]
        if len(whole) < 2:
            return None
        donors = [whole[whole.index(index) - 1] if index in whole else whole[0] for index in range(len(lengths))]
        replacements = torch.cat([passage_features[donor][:, : lengths[index]] for index, donor in enumerate(donors)],
                                 dim=1)  # [towers, n, hidden]
        return model.ablation_increases(features, targets, replacements)
