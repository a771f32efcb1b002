"""Resample ablation: each tower's state replaced by its state on another block of the batch, the joint model's loss
rise per type (tower_preference/resample_ablation.py)."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from conftest import tiny_two_tower
from twotower.evaluation.scoring.engine import score_blocks

VOCAB, SEQ, BATCH, NUM_BATCHES = 40, 12, 6, 8
HIDDEN = 16  # one tower's width


def tiny_model(seed=0, **overrides):
    return tiny_two_tower(seed=seed, vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=2, **overrides)


def successor_sequences(num_sequences, generator):
    """Sequences counting up from a random start over ids 4 .. VOCAB - 1 (wrapping round)."""
    starts = torch.randint(4, VOCAB, (num_sequences, 1), generator=generator)
    return 4 + (starts - 4 + torch.arange(SEQ)) % (VOCAB - 4)


class PassIncreases:
    """Records the increases every scoring pass carries, in order."""

    def __init__(self):
        self.increases = []

    def begin_batch(self, batch):
        pass

    def update_pass(self, scored_pass):
        self.increases.append(scored_pass.increases["resample_ablation"])


def test_the_increases_equal_the_model_recomputed_by_hand():
    model = tiny_model()
    generator = torch.Generator().manual_seed(1)
    # two batches of 3 blocks, then one of a single block: it takes the last block of the batch before
    batches = [{"input_ids": torch.randint(4, VOCAB, (rows, SEQ), generator=generator)} for rows in (3, 3, 1)]
    recorded = PassIncreases()
    score_blocks(model, batches, measures=["resample_ablation"], consumers=[recorded], disable_tqdm=True)

    previous_last = None
    with torch.no_grad():
        for batch, engine_increases in zip(batches, recorded.increases):
            input_ids = batch["input_ids"]
            fused = model.model(input_ids=input_ids).last_hidden_state[:, :-1]  # [rows, seq - 1, towers * hidden]
            donors = fused.roll(1, dims=0) if len(input_ids) > 1 else previous_last
            previous_last = fused[-1:]
            targets = input_ids[:, 1:].flatten()
            joint = F.cross_entropy(model.lm_head(fused.flatten(0, 1)[None])[0][0], targets, reduction="none")
            expected = []
            for tower in range(2):
                tower_slice = slice(tower * HIDDEN, (tower + 1) * HIDDEN)
                resampled = fused.clone()
                resampled[..., tower_slice] = donors[..., tower_slice]
                logits = model.lm_head(resampled.flatten(0, 1)[None])[0][0]
                expected.append(F.cross_entropy(logits, targets, reduction="none") - joint)
            np.testing.assert_allclose(engine_increases, torch.stack(expected).numpy(), rtol=1e-4, atol=1e-5)


def planted_model():
    """Independent towers whose states hold only the current token (no attention or MLP output: the residual stream
    is the embedding), and whose heads predict the successor of the current token: tower 0's for the even targets,
    tower 1's for the odd ones, while the other tower's head gives those targets no probability."""
    model = tiny_model(cooperative=False)
    batches = planted_batches()
    head = model.lm_head
    with torch.no_grad():
        for name, weight in model.model.towers.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                weight.zero_()
        sums, counts = torch.zeros(2, VOCAB, HIDDEN), torch.zeros(VOCAB)
        for batch in batches:  # each tower's head state, averaged per current token
            states = head.norm(head.act_fn(head.dense(model.probe_features(batch["input_ids"]).flatten(1, 2))))
            current = batch["input_ids"].flatten()
            sums.index_add_(1, current, states)
            counts.index_add_(0, current, torch.ones(current.shape))
        means = sums / counts.clamp(min=1)[None, :, None]
        head.decoder.weight.zero_()
        head.decoder.bias.fill_(-30.0)
        for target in range(4, VOCAB):
            current = 4 + (target - 5) % (VOCAB - 4)
            tower = target % 2  # the tower that carries it
            head.decoder.weight[tower][:, target] = 30 * means[tower, current] / means[tower, current].norm()
            head.decoder.bias[tower][target] = 0.0
    return model, batches


def planted_batches():
    generator = torch.Generator().manual_seed(1)
    return [{"input_ids": successor_sequences(BATCH, generator)} for _ in range(NUM_BATCHES)]


def test_resample_ablation_recovers_the_tower_planted_to_carry_each_type():
    model, batches = planted_model()
    scores = score_blocks(model, batches, measures=["resample_ablation"], disable_tqdm=True)
    result = scores.measures["resample_ablation"].accumulator.compute(min_count=5)
    # every type prefers the tower planted to carry it, beyond chance: even ids tower 0, odd ids tower 1
    np.testing.assert_array_equal(result.preferred_tower, result.token_ids % 2)
    assert result.eligible.all() and result.significant.all()
    # and the joint model loses far more without the carrying tower than without the other one
    assert (result.preference_nats[result.token_ids % 2, np.arange(result.token_ids.size)] > 5.0).all()


def test_one_block_alone_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"score at least 2 blocks, or turn the measure off \(`--resample_ablation "):
        score_blocks(tiny_model(), [{"input_ids": torch.randint(4, VOCAB, (1, SEQ))}], measures=["resample_ablation"],
                     disable_tqdm=True)
