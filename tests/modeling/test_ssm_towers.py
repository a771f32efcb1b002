"""The selective state-space towers (`tower_type="ssm"`, towers_ssm.py): causal and forward + backward, trained,
saved, loaded as Hub custom code, generating, probed, and their FLOPs counted."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import HANG_LIMIT_S, tiny_two_tower
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.towers_ssm import TwoTowerSSMTowers
from twotower.training.objectives import make_collators, needs_masking
from twotower.training.data import collate_blocks
from twotower.training.throughput import flops_per_token

MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}
BATCH, SEQ = 3, 10


def ssm_model(objective="causal", seed=0, **config):
    return tiny_two_tower(MODEL_CLASSES[objective], seed=seed, tower_type="ssm", **config)


def random_ids(seed=1):
    return torch.randint(0, 99, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("objective", MODEL_CLASSES)
def test_forward_and_probes_have_the_families_shapes(objective):
    model, input_ids = ssm_model(objective), random_ids()
    assert isinstance(model.model.towers, TwoTowerSSMTowers)
    output = model(input_ids, labels=input_ids, output_tower_hidden_states=True)
    assert output.logits.shape == (BATCH, SEQ, 99) and output.loss.isfinite()
    assert output.tower_hidden_states.shape == (2, BATCH, SEQ, 12)
    predicted = SEQ - model.target_shift
    assert model.probe_logprobs(input_ids, labels=input_ids).shape == (2, BATCH, predicted)
    assert model.joint_logprobs(input_ids, labels=input_ids).shape == (BATCH, predicted)


def test_the_causal_towers_never_read_a_later_token():
    model, input_ids = ssm_model("causal"), random_ids()
    changed = input_ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 99
    with torch.no_grad():
        before, after = model(input_ids).logits, model(changed).logits
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=0)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


def test_the_masked_towers_never_read_the_token_they_predict():
    # the forward + backward pair: position t reads tokens before and after t only, so nothing needs masking
    model, input_ids = ssm_model("masked"), random_ids()
    changed = input_ids.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 99
    with torch.no_grad():
        before, after = model(input_ids).logits, model(changed).logits
    torch.testing.assert_close(after[:, 4], before[:, 4], rtol=0, atol=0)
    assert not torch.allclose(after[:, 3], before[:, 3]) and not torch.allclose(after[:, 5], before[:, 5])
    assert not model.model.towers.sees_predicted_token and not needs_masking("masked", model.model.towers)
    assert make_collators("masked", model.model.towers, None, 0.15, seed=0) == (collate_blocks, collate_blocks)


@pytest.mark.parametrize("objective", MODEL_CLASSES)
def test_the_loss_falls_over_a_few_steps(objective):
    model, input_ids = ssm_model(objective, hidden_dropout=0.0).train(), random_ids()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_save_load_and_remote_code_give_the_same_outputs(tmp_path):
    model, input_ids = ssm_model("causal", probe_replicas=2), random_ids()
    model.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "towers_ssm.py").is_file()  # copied as Hub custom code
    with torch.no_grad():
        expected = {"logits": model(input_ids).logits, "probes": model.probe_logprobs(input_ids, all_replicas=True)}
        reloaded = TwoTowerForCausalLM.from_pretrained(tmp_path / "model")
        assert torch.equal(reloaded(input_ids).logits, expected["logits"])
    torch.save({"input_ids": input_ids, **expected}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        """
        import sys
        sys.modules["modeling_twotower"] = None  # the package must not be importable here
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True)
        expected = torch.load("expected.pt")
        assert type(model.model.towers).__module__.startswith("transformers_modules"), type(model.model.towers)
        assert torch.equal(model(expected["input_ids"]).logits, expected["logits"])
        assert torch.equal(model.probe_logprobs(expected["input_ids"], all_replicas=True), expected["probes"])
        print("remote code OK", type(model.model.towers).__name__)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code OK TwoTowerSSMTowers" in result.stdout


def test_generation_recomputes_the_prefix_and_matches_greedy_decoding():
    model, prompt = ssm_model("causal"), random_ids()[:1, :4]
    assert not model.model.towers.has_cache and model.config.use_cache is False
    generated = model.generate(prompt, max_new_tokens=5, do_sample=False)
    expected = prompt
    with torch.no_grad():
        for _ in range(5):  # independently: the argmax of the last position, the whole prefix each time
            expected = torch.cat([expected, model(expected).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, expected)
    with pytest.raises(ValueError, match="does not apply to state-space towers"):
        model(prompt, use_cache=True)


@pytest.mark.parametrize("objective", MODEL_CLASSES)
def test_flops_per_token_equal_the_flops_torch_counts(objective):
    # Every matmul torch's counter sees (projections, the scan's readout, heads) in forward and backward, per token,
    # against the count from the built model plus the stack's declared scan term. The depthwise convolutions are
    # counted by hand (2 FLOPs per channel and tap, times 3 with the backward): torch's counter charges the padded
    # positions and, in the backward, every input channel as if the convolution were not grouped.
    model, input_ids = ssm_model(objective, hidden_dropout=0.0).train(), random_ids()
    with FlopCounterMode(display=False) as counter:
        model(input_ids, labels=input_ids).loss.backward()
    counted = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    matmuls = sum(flops for op, flops in counted.items() if "convolution" not in op) / (BATCH * SEQ)
    directions = 2 if objective == "masked" else 1
    mixers = directions * 2 * 2  # towers x layers
    convolutions = mixers * 6 * 37 * 4  # intermediate_size channels, kernel 4
    assert matmuls + convolutions == flops_per_token(model, SEQ, "pretrain")


@pytest.mark.parametrize("padded", [False, True])
def test_the_mixer_computes_transformers_reference_mamba_path(padded):
    from transformers.models.mamba.modeling_mamba import MambaMixer

    from modeling_twotower.towers_ssm import TwoTowerMambaMixer, mamba_config

    torch.manual_seed(0)
    mixer = TwoTowerMambaMixer(mamba_config(TwoTowerConfig.from_preset("tiny", tower_type="ssm")), 0)
    mixer.init_mamba_weights()
    hidden_states = torch.randn(3, 17, 64, requires_grad=True)
    mask = torch.ones(3, 17, dtype=torch.long)
    if padded:
        mask[1, 12:] = 0
    ours = mixer(hidden_states, attention_mask=mask)
    (ours_grad,) = torch.autograd.grad(ours.square().sum(), hidden_states)
    reference = MambaMixer.forward(mixer, hidden_states, attention_mask=mask)
    (reference_grad,) = torch.autograd.grad(reference.square().sum(), hidden_states)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_grad, reference_grad, rtol=1e-4, atol=1e-5)
