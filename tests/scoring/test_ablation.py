"""The mean-ablation preference: each tower's features replaced by their mean, the joint model's loss rise per type."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn import functional as F

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.evaluation.scoring.ablation import ablation_summary
from twotower.evaluation.scoring.engine import score_blocks

VOCAB, SEQ, BATCH, NUM_BATCHES = 40, 12, 6, 4
HIDDEN = 16  # one tower's width


def tiny_model(cls=TwoTowerForCausalLM, seed=0, **overrides):
    return tiny_two_tower(cls, seed, vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=2, **overrides)


def successor_sequences(num_sequences, generator):
    """Sequences counting up from a random start over ids 4 .. VOCAB - 1 (wrapping round)."""
    starts = torch.randint(4, VOCAB, (num_sequences, 1), generator=generator)
    return 4 + (starts - 4 + torch.arange(SEQ)) % (VOCAB - 4)


def batches(successors=False):
    generator = torch.Generator().manual_seed(1)
    if successors:
        return [{"input_ids": successor_sequences(BATCH, generator)} for _ in range(NUM_BATCHES)]
    ids = torch.randint(4, VOCAB, (NUM_BATCHES, BATCH, SEQ), generator=generator)
    return [{"input_ids": input_ids} for input_ids in ids]


def independent_increases(model, successors=False) -> pd.DataFrame:
    """Per next-token position of every batch: its target and each tower's ablation increase, computed from the
    model's forward pass (the fused hidden states and the LM head), not the engine's helpers."""
    with torch.no_grad():
        scored = batches(successors)
        fused = torch.cat([model.model(input_ids=batch["input_ids"]).last_hidden_state[:, :-1] for batch in scored])
        targets = torch.cat([batch["input_ids"][:, 1:] for batch in scored]).flatten()
        fused = fused.flatten(0, 1)  # [positions, towers * hidden]
        nll = F.cross_entropy(model.lm_head(fused[None])[0][0], targets, reduction="none")
        columns = {"target": targets.numpy()}
        for tower in range(2):
            ablated = fused.clone()
            tower_slice = slice(tower * HIDDEN, (tower + 1) * HIDDEN)
            ablated[:, tower_slice] = fused[:, tower_slice].double().mean(dim=0).float()
            columns[f"increase{tower}"] = (F.cross_entropy(model.lm_head(ablated[None])[0][0], targets, reduction="none")
                                           - nll).double().numpy()
    return pd.DataFrame(columns)


def engine_ablation(model, successors=False):
    scores = score_blocks(model, batches(successors), ablation=True, disable_tqdm=True)
    return scores, scores.ablation.accumulator.compute(min_count=2)


@pytest.mark.parametrize("cooperative", [True, False])
def test_ablation_preference_equals_an_independent_computation(cooperative):
    model = tiny_model(cooperative=cooperative)
    expected = independent_increases(model)
    scores, result = engine_ablation(model)

    np.testing.assert_allclose(scores.ablation.mean_increase_nats(), expected[["increase0", "increase1"]].mean(),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    per_type = expected.groupby("target")[["increase0", "increase1"]].mean()
    assert result.token_ids.tolist() == per_type.index.tolist()
    # tower 0's ablation preference: its increase minus tower 1's, over each type's occurrences
    np.testing.assert_allclose(result.preference_nats[0], per_type["increase0"] - per_type["increase1"],
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(result.preference_nats[1], -result.preference_nats[0])


def successor_model_reading_tower_0_only():
    """Planted: a model trained to predict each token's successor (t -> t + 1) with a fusion head that reads tower 0's
    slice only (tower 1's columns held at 0), so that tower 0 carries every prediction alone."""
    model = tiny_model().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        input_ids = successor_sequences(16, generator)
        with torch.no_grad():
            model.lm_head.dense.weight[:, HIDDEN:] = 0.0
        loss = model(input_ids=input_ids, labels=input_ids).loss
        optimizer.zero_grad()
        loss.backward()
        model.lm_head.dense.weight.grad[:, HIDDEN:] = 0.0
        optimizer.step()
    with torch.no_grad():
        model.lm_head.dense.weight[:, HIDDEN:] = 0.0
    return model.eval()


def test_the_tower_that_carries_the_predictions_alone_is_preferred_by_every_type():
    model = successor_model_reading_tower_0_only()
    scores, result = engine_ablation(model, successors=True)

    mean_increase = scores.ablation.mean_increase_nats()
    assert mean_increase[1] == pytest.approx(0.0, abs=1e-6) and mean_increase[0] > 1.0  # nats
    # tower 1's increase is 0 at every position: tower 0's preference is its own increase
    per_type = independent_increases(model, successors=True).groupby("target")["increase0"].mean()
    np.testing.assert_allclose(result.preference_nats[0], per_type, rtol=1e-4, atol=1e-5)
    assert (result.preferred_tower[result.eligible] == 0).all() and result.significant[result.eligible].mean() > 0.9


def test_masked_models_ablate_the_masked_positions():
    # every masking pass's scored positions: the means, and the increases, cover each token once
    model = tiny_model(TwoTowerForMaskedLM)
    scores = score_blocks(model, batches(), ablation=True, mask_passes=3, mask_token_id=3, disable_tqdm=True)
    assert scores.ablation.accumulator.num_predictions == NUM_BATCHES * BATCH * SEQ == scores.num_targets
    assert np.isfinite(scores.ablation.mean_increase_nats()).all()


def test_the_summary_correlates_ablation_with_the_probe_preference():
    model = tiny_model(probe_replicas=1)
    scores = score_blocks(model, batches(), ablation=True, disable_tqdm=True)
    probe_result = scores.accumulators[0].compute(min_count=2)
    ablation = scores.ablation.accumulator.compute(min_count=2)
    summary = ablation_summary(ablation, probe_result, scores.ablation.mean_increase_nats())
    eligible = probe_result.eligible
    expected = np.corrcoef(probe_result.preference_nats[0, eligible], ablation.preference_nats[0, eligible])[0, 1]
    assert summary["correlation_with_probe_preference"] == pytest.approx(expected)
    assert summary["num_eligible_types"] == int(eligible.sum())
