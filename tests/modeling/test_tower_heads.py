"""Each tower's own head beside the fusion head (`tower_heads`), and the joint loss's gradient stopped at the towers
(`joint_gradient=False`): the two arms of the joint-gradient experiment differ in the towers' gradient and nothing
else."""

import pytest
import torch
from torch.nn import functional as F

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.training.arguments import load_config

BATCH, SEQ, VOCAB = 3, 9, 61
NO_DROPOUT = dict(hidden_dropout=0.0, attention_dropout=0.0)


def batch(model_class):
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = input_ids.clone()
    if model_class is TwoTowerForMaskedLM:
        labels[:, ::2] = -100
    return input_ids, labels


def arm(model_class, joint_gradient, **config):
    return tiny_two_tower(model_class, vocab_size=VOCAB, tower_heads=True, joint_gradient=joint_gradient,
                          **NO_DROPOUT, **config).train()


@pytest.mark.parametrize("model_class,sparse", [(TwoTowerForCausalLM, False), (TwoTowerForMaskedLM, False),
                                                (TwoTowerForMaskedLM, True)], ids=["causal", "masked", "sparse"])
def test_tower_loss_is_each_towers_own_cross_entropy_summed(model_class, sparse):
    model = arm(model_class, True, sparse_prediction=sparse)
    input_ids, labels = batch(model_class)
    output = model(input_ids, labels=labels, output_tower_hidden_states=True)
    tower_logprobs = model.tower_heads.tower_logprobs(output.tower_hidden_states)  # [towers, batch, seq, vocab]
    targets = labels[:, 1:] if model_class is TwoTowerForCausalLM else labels
    tower_logprobs = tower_logprobs[:, :, : targets.shape[1]]
    expected = sum(F.nll_loss(logprobs.reshape(-1, VOCAB), targets.reshape(-1)) for logprobs in tower_logprobs)
    assert output.tower_loss.item() == pytest.approx(expected.item(), rel=1e-5)
    joint = tiny_two_tower(model_class, vocab_size=VOCAB, sparse_prediction=sparse, **NO_DROPOUT).train()
    joint.load_state_dict(model.state_dict(), strict=False)  # the same model without the towers' heads
    assert (output.loss - output.tower_loss).item() == pytest.approx(joint(input_ids, labels=labels).loss.item(), rel=1e-5)
    assert model(input_ids, labels=labels).tower_hidden_states is None  # computed for the loss, returned when asked


def test_the_arms_have_the_same_parameters_and_initial_weights():
    joint, stopped = arm(TwoTowerForCausalLM, True), arm(TwoTowerForCausalLM, False)
    joint_state, stopped_state = joint.state_dict(), stopped.state_dict()
    assert list(joint_state) == list(stopped_state)
    assert any(name.startswith("tower_heads.") for name in joint_state)
    for name, tensor in joint_state.items():
        assert torch.equal(tensor, stopped_state[name]), name


@pytest.mark.parametrize("model_class", [TwoTowerForCausalLM, TwoTowerForMaskedLM], ids=["causal", "masked"])
def test_stopped_arm_trains_the_towers_on_their_own_losses_only(model_class):
    joint, stopped = arm(model_class, True), arm(model_class, False)
    input_ids, labels = batch(model_class)

    def gradients(model, part):
        model.zero_grad()
        output = model(input_ids, labels=labels)
        {"total": output.loss, "towers": output.tower_loss, "joint": output.loss - output.tower_loss}[part].backward()
        return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}

    def towers(grads):
        return {name: grad for name, grad in grads.items() if name.startswith("model.towers.")}

    stopped_total, stopped_own = gradients(stopped, "total"), gradients(stopped, "towers")
    joint_total, joint_own, joint_joint = gradients(joint, "total"), gradients(joint, "towers"), gradients(joint, "joint")
    assert all(grad is None or not grad.any() for grad in towers(gradients(stopped, "joint")).values())
    assert any(grad.abs().sum() > 0 for grad in towers(joint_joint).values())
    for name, grad in towers(stopped_total).items():  # the stopped arm's towers: their own losses' gradient only
        torch.testing.assert_close(grad, stopped_own[name])
        torch.testing.assert_close(joint_own[name], stopped_own[name])  # the same in both arms
    for name, grad in stopped_total.items():  # what reads the towers' outputs trains alike in both arms
        if name.startswith(("model.fusion.", "lm_head.dense", "lm_head.norm", "tower_heads.")):
            torch.testing.assert_close(grad, joint_total[name])


def test_the_stop_is_a_training_one():
    model = arm(TwoTowerForCausalLM, False).eval()  # eval: the joint logits' gradient reaches the towers (attribution)
    input_ids, _ = batch(TwoTowerForCausalLM)
    model(input_ids).logits.logsumexp(-1).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.model.towers.parameters())


def test_save_and_load_keep_the_towers_heads(tmp_path):
    model = arm(TwoTowerForCausalLM, False).eval()
    model.save_pretrained(tmp_path)
    loaded = TwoTowerForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.tower_heads and not loaded.config.joint_gradient
    input_ids, labels = batch(TwoTowerForCausalLM)
    expected, got = model(input_ids, labels=labels), loaded(input_ids, labels=labels)
    torch.testing.assert_close(got.tower_loss, expected.tower_loss, rtol=0, atol=0)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=0)


def test_config_refuses_arms_that_make_no_sense():
    with pytest.raises(ValueError, match="has them already: drop tower_heads"):
        TwoTowerConfig(tower_heads=True, cooperative=False)
    with pytest.raises(ValueError, match="set tower_heads=True"):
        TwoTowerConfig(joint_gradient=False)


def test_training_options_set_the_arms():
    config = load_config("tiny", ["--tower_heads", "true", "--joint_gradient", "false"])
    assert config.model_overrides()["tower_heads"] is True and config.model_overrides()["joint_gradient"] is False
