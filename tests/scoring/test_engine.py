"""The scoring engine: one pass of the towers serves the joint model and every probe set, and changes none of them."""

import copy

import numpy as np
import pytest
import torch

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.evaluation.scoring.engine import ScoredPassages, score_blocks, scoring_passes

VOCAB, SEQ, BATCH, NUM_BATCHES = 99, 13, 5, 3
MASK_TOKEN_ID, MASK_PASSES = 3, 7
MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}


class RecordingAccumulator:
    """Keeps what the engine feeds an accumulator: token ids [n] and gold log-probs [probes, n] of every pass."""

    def __init__(self):
        self.token_ids, self.gold_logprobs = [], []

    def update(self, token_ids, gold_logprobs):
        self.token_ids.append(token_ids)
        self.gold_logprobs.append(gold_logprobs)


def tiny_model(objective, seed=0):
    return tiny_two_tower(MODEL_CLASSES[objective], seed, vocab_size=VOCAB, hidden_size=16, num_attention_heads=2)


def batches():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, VOCAB, (NUM_BATCHES, BATCH, SEQ), generator=generator)  # no id is the mask token
    return [{"input_ids": input_ids} for input_ids in ids]


def probe_set_on(model, probe_replicas, seed):
    """Another probe set on the same frozen model: the same towers, new probes."""
    probe_model = copy.deepcopy(model)
    torch.manual_seed(seed)
    probe_model.reset_probes(probe_replicas, "mlp")
    return probe_model.eval()


def recorded_scores(model, probe_models):
    accumulators = [RecordingAccumulator() for _ in probe_models]
    scores = score_blocks(
        model, batches(), probe_models, accumulators, mask_passes=MASK_PASSES, mask_token_id=MASK_TOKEN_ID,
        disable_tqdm=True,
    )  # fmt: skip
    return scores, accumulators


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_two_probe_sets_in_one_pass_equal_each_scored_alone(objective):
    model = tiny_model(objective)
    replicas = probe_set_on(model, probe_replicas=3, seed=1)
    together, fed_together = recorded_scores(model, [model, replicas])
    for index, probe_model in enumerate([model, replicas]):
        alone, (fed_alone,) = recorded_scores(probe_model, [probe_model])
        np.testing.assert_array_equal(together.probe_nll_sums[index], alone.probe_nll_sums[0])
        assert together.joint_nll_sum == alone.joint_nll_sum and together.num_targets == alone.num_targets
        for got, expected in zip(fed_together[index].gold_logprobs, fed_alone.gold_logprobs, strict=True):
            np.testing.assert_array_equal(got, expected)
        for got, expected in zip(fed_together[index].token_ids, fed_alone.token_ids, strict=True):
            np.testing.assert_array_equal(got, expected)
    assert together.probe_nll_sums[1].shape == (model.config.num_towers * 3,)
    # every replica of every tower, at each scored position of the pass
    assert fed_together[1].gold_logprobs[0].shape == (model.config.num_towers * 3, len(fed_together[1].token_ids[0]))


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_joint_perplexity_is_the_models_own_forward_loss(objective):
    model = tiny_model(objective)
    scores = score_blocks(model, batches(), mask_passes=MASK_PASSES, mask_token_id=MASK_TOKEN_ID, disable_tqdm=True)
    nll_sum, num_targets = 0.0, 0
    with torch.no_grad():
        for batch in batches():
            passes = scoring_passes(batch["input_ids"], objective, model.model.towers, MASK_PASSES, MASK_TOKEN_ID)
            for inputs, labels in passes:
                predicted = labels[:, 1:] if objective == "causal" else labels  # a causal LM predicts the next token
                count = int((predicted != -100).sum())
                nll_sum += model(input_ids=inputs, labels=labels).loss.item() * count
                num_targets += count
    expected_targets = NUM_BATCHES * BATCH * (SEQ - 1 if objective == "causal" else SEQ)
    assert scores.num_targets == num_targets == expected_targets
    assert scores.joint_mean_nll == pytest.approx(nll_sum / num_targets, rel=1e-6)
    assert scores.joint_mean_nll == pytest.approx(np.log(VOCAB), rel=0.05)  # an untrained model: near uniform


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_scored_passages_hold_each_tokens_log_probabilities_from_the_one_pass(objective):
    model = probe_set_on(tiny_model(objective), probe_replicas=2, seed=1)
    max_blocks = BATCH + 2  # all of the first batch, 2 rows of the second
    passages = ScoredPassages(max_blocks)
    score_blocks(
        model, batches(), mask_passes=MASK_PASSES, mask_token_id=MASK_TOKEN_ID, disable_tqdm=True, consumers=[passages]
    )  # fmt: skip
    blocks = torch.cat([batch["input_ids"] for batch in batches()])[:max_blocks]  # [blocks, seq]
    assert len(passages.input_ids) == len(passages.gold_logprobs) == max_blocks
    np.testing.assert_array_equal(np.stack(passages.input_ids), blocks.numpy())
    assert np.stack(passages.attention_mask).all()

    # independently, token by token: a causal LM predicts token t at position t - 1; a masked LM predicts token t in
    # the pass that masks it (pass t % MASK_PASSES)
    expected = np.full((max_blocks, model.config.num_probes, SEQ), np.nan, np.float32)  # [blocks, probes, seq]
    with torch.no_grad():
        if objective == "causal":
            expected[:, :, 1:] = model.probe_logprobs(blocks, all_replicas=True).flatten(0, 1).transpose(0, 1)
        for position in range(SEQ if objective == "masked" else 0):
            masked = torch.arange(SEQ) % MASK_PASSES == position % MASK_PASSES
            inputs, labels = blocks.masked_fill(masked, MASK_TOKEN_ID), blocks.masked_fill(~masked, -100)
            every = model.probe_logprobs(inputs, labels=labels, all_replicas=True).flatten(0, 1)  # [probes, blocks, seq]
            expected[:, :, position] = every[:, :, position].transpose(0, 1)
    np.testing.assert_allclose(np.stack(passages.gold_logprobs), expected, rtol=1e-5, atol=1e-6)


def test_scoring_with_the_compiled_parts_equals_eager(monkeypatch):
    # compile_for_scoring (score --torch_compile) compiles every part a pass runs; dynamo's capture of each, run by
    # its "eager" backend here (inductor's kernels take minutes to build on the CPU), scores what the model scores
    from twotower.evaluation.scoring.score import compile_for_scoring

    compiled_parts = []
    module_compile = torch.nn.Module.compile

    def capture(module, *args, **kwargs):
        compiled_parts.append(module)
        module_compile(module, backend="eager")

    monkeypatch.setattr(torch.nn.Module, "compile", capture)
    eager = score_blocks(tiny_model("causal"), batches(), ablation=True, disable_tqdm=True)
    model = tiny_model("causal")
    compile_for_scoring(model)
    compiled = score_blocks(model, batches(), ablation=True, disable_tqdm=True)
    assert compiled_parts == [model.model, model.lm_head, model.probes]
    assert compiled.joint_mean_nll == pytest.approx(eager.joint_mean_nll, rel=1e-6)
    np.testing.assert_allclose(compiled.probe_mean_nll(), eager.probe_mean_nll(), rtol=1e-6)
    np.testing.assert_allclose(compiled.ablation.mean_increase_nats(), eager.ablation.mean_increase_nats(), rtol=1e-5)
