"""The selective state-space towers' own mixer (`tower_type="ssm"`, towers_ssm.py); what every kind does (train,
save, load as Hub custom code, generate, probe, score, count FLOPs): tests/modeling/test_kind_conformance.py."""

import pytest
import torch
from transformers.models.mamba.modeling_mamba import MambaMixer

from modeling_twotower import TwoTowerConfig
from modeling_twotower.towers_ssm import TwoTowerMambaMixer, mamba_config


@pytest.mark.parametrize("padded", [False, True])
def test_the_mixer_computes_transformers_reference_mamba_path(padded):
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
