"""
The paper's other towers: masked-LM (BERT-style), the reference's GPT and ELMo layouts, this package's LSTM towers
and the independent-towers control.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoModelForMaskedLM

from conftest import HANG_LIMIT_S, tiny_two_tower, tiny_two_tower_config
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM

BATCH, SEQ, VOCAB = 3, 9, 101


# conftest's tiny sizes, wider and with fewer heads
FAMILY_SIZES = dict(vocab_size=VOCAB, hidden_size=16, num_attention_heads=2, intermediate_size=24)


def tiny_config(**kwargs):
    return tiny_two_tower_config(**{**FAMILY_SIZES, **kwargs})


def build(model_class, seed=0, **kwargs):
    return tiny_two_tower(model_class, seed, **{**FAMILY_SIZES, **kwargs})


def random_ids(seed=1, seq=SEQ):
    return torch.randint(0, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(seed))


def changed_at(input_ids, position):
    changed = input_ids.clone()
    changed[:, position] = (changed[:, position] + 1) % VOCAB
    return changed


def lstm_fields(**kwargs):
    """This package's LSTM towers in the bert layout (the CPU recipes tiny_lstm and tiny_elmo)."""
    return dict(tower_type="lstm", lstm_hidden_size=20, **kwargs)


def elmo_fields(**kwargs):
    """The reference's ELMo layout: per tower a forward and a backward LM of width 8, cells of 20."""
    return dict(layout="elmo", lstm_hidden_size=20, **kwargs)


@pytest.mark.parametrize("preset, lstm_hidden_size", [("elmo-base", 2048), ("elmo-large", 4096)])
def test_elmo_presets_follow_the_paper(preset, lstm_hidden_size):
    config = TwoTowerConfig.from_preset(preset)
    # the reference's TwoTowerELMo: model_size 256 per direction, 2 layers, fused width 4 * 256, embedding 2 * 256
    assert (config.layout, config.tower_type, config.hidden_size, config.num_hidden_layers) == ("elmo", "lstm", 512, 2)
    assert (config.fused_hidden_size, config.embedding_size, config.probe_hidden_size) == (1024, 512, 256)
    assert config.lstm_hidden_size == lstm_hidden_size and config.use_cache is False


@pytest.mark.parametrize(
    "model_class, fields",
    [
        (TwoTowerForMaskedLM, {}),
        (TwoTowerForMaskedLM, lstm_fields()),
        (TwoTowerForCausalLM, lstm_fields()),
        (TwoTowerForCausalLM, dict(cooperative=False)),
        (TwoTowerForCausalLM, dict(layout="gpt")),
        (TwoTowerForMaskedLM, elmo_fields()),
    ],
    ids=["masked", "masked-lstm", "causal-lstm", "control", "gpt", "elmo"],
)
def test_every_family_takes_a_tower_wide_embedding(model_class, fields, tmp_path):
    model = build(model_class, embedding_size=16, **fields).train()
    assert model.model.embed_tokens.weight.shape == (VOCAB, 16)
    input_ids = random_ids()
    output = model(input_ids, labels=input_ids)
    assert output.logits.shape == (BATCH, SEQ, VOCAB) and torch.isfinite(output.loss)
    output.loss.backward()
    untrained = {name for name, param in model.named_parameters() if param.grad is None}
    assert untrained and all(name.startswith("probes.") for name in untrained)  # all but the probes train
    model.eval().save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    assert loaded.config.embedding_size == 16
    assert torch.equal(loaded(input_ids).logits, model(input_ids).logits)


def test_masked_lm_towers_are_bidirectional_and_the_loss_is_unshifted():
    model = build(TwoTowerForMaskedLM)
    assert model.model.bidirectional is True and model.model.towers.layers[0].self_attn.is_causal is False
    input_ids = random_ids()
    logits = model(input_ids).logits
    later_changed = model(changed_at(input_ids, SEQ - 1)).logits
    assert not torch.allclose(logits[:, 0], later_changed[:, 0])  # position 0 reads the last token
    labels = torch.full_like(input_ids, -100)
    labels[:, 2] = input_ids[:, 2]
    labels[:, 5] = input_ids[:, 5]
    loss = model(input_ids, labels=labels).loss
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)))


def test_masked_lm_probes_score_labelled_positions_only():
    model = build(TwoTowerForMaskedLM)
    input_ids = random_ids()
    labels = torch.full_like(input_ids, -100)
    labels[:, 4] = input_ids[:, 4]
    projected_rows = []
    hook = model.probes.decoder.register_forward_hook(lambda m, i, o: projected_rows.append(i[0].shape[1]))
    logprobs = model.probe_logprobs(input_ids, labels=labels)
    hook.remove()
    assert logprobs.shape == (2, BATCH, SEQ) and sum(projected_rows) == BATCH  # unlabelled rows are never projected
    expected = model.probes.logits(model.probe_features(input_ids))[:, :, 4].log_softmax(-1)
    expected = expected.gather(-1, input_ids[:, 4].expand(2, -1).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logprobs[:, :, 4], expected, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(logprobs[:, :, [0, 1, 2, 3, 5, 6, 7, 8]]) == 0
    nothing_labelled = model.probe_logprobs(input_ids, labels=torch.full_like(input_ids, -100))
    assert nothing_labelled.shape == (2, BATCH, SEQ) and torch.count_nonzero(nothing_labelled) == 0
    # and the probes' gradients are those of the dense computation
    model.probes.zero_grad()
    logprobs.sum().backward()
    sparse_grads = [p.grad.clone() for p in model.probes.parameters()]
    model.probes.zero_grad()
    expected.sum().backward()
    for sparse, dense in zip(sparse_grads, [p.grad for p in model.probes.parameters()]):
        torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lstm_hidden_size, proj_size", [(20, 16), (16, 0)], ids=["projected", "tower-wide-cells"])
def test_lstm_cells_are_projected_back_to_the_tower_width_only_when_wider(lstm_hidden_size, proj_size):
    # what every kind reads and how it generates: tests/modeling/test_kind_conformance.py
    model = build(TwoTowerForCausalLM, tower_type="lstm", lstm_hidden_size=lstm_hidden_size)
    assert model.config.use_cache is False and len(model.model.towers.forward_lstms) == 2
    assert model.model.towers.forward_lstms[0].proj_size == proj_size  # cells as wide as the tower: none
    input_ids = random_ids()
    with torch.no_grad():
        changed = model(changed_at(input_ids, 5)).logits
        torch.testing.assert_close(changed[:, :5], model(input_ids).logits[:, :5], rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
@pytest.mark.parametrize("model_class", [TwoTowerForCausalLM, TwoTowerForMaskedLM])
def test_control_towers_share_nothing_after_the_embedding(model_class, layout):
    model = build(model_class, cooperative=False, layout=layout)
    assert model.get_output_embeddings() is None and not model.config.tie_word_embeddings  # nothing tied
    input_ids = random_ids()
    before = model.probe_features(input_ids)
    with torch.no_grad():
        model.model.towers.layers[-1].mlp.down_proj.bias[1] += 1.0
    after = model.probe_features(input_ids)
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    assert not torch.allclose(after[1], before[1])


def test_control_loss_is_the_sum_of_each_towers_own_loss():
    model = build(TwoTowerForCausalLM, cooperative=False)
    input_ids = random_ids()
    labels = input_ids.clone()
    labels[0, 3] = -100
    output = model(input_ids, labels=labels)
    tower_logits = model.lm_head.tower_logprobs(model.probe_features(input_ids))[:, :, :-1]
    tower_losses = [F.cross_entropy(logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1)) for logits in tower_logits]
    torch.testing.assert_close(output.loss, sum(tower_losses), rtol=1e-5, atol=1e-5)
    # logits are the towers' equal-weight mixture, a proper distribution
    torch.testing.assert_close(output.logits.exp().sum(-1), torch.ones(BATCH, SEQ), rtol=1e-5, atol=1e-5)
    # logits_to_keep keeps the last positions' logits, with or without labels, and leaves the loss alone
    kept = model(input_ids, labels=labels, logits_to_keep=2)
    torch.testing.assert_close(kept.logits, output.logits[:, -2:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kept.loss, output.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model(input_ids, logits_to_keep=2).logits, output.logits[:, -2:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "model_class, fields",
    [
        (TwoTowerForCausalLM, {}),
        (TwoTowerForCausalLM, dict(cooperative=False)),
        (TwoTowerForMaskedLM, {}),
        (TwoTowerForMaskedLM, dict(cooperative=False)),
        (TwoTowerForCausalLM, lstm_fields()),
        (TwoTowerForCausalLM, dict(layout="gpt")),
        (TwoTowerForCausalLM, dict(layout="gpt", cooperative=False)),
        (TwoTowerForMaskedLM, dict(layout="gpt")),
        (TwoTowerForMaskedLM, elmo_fields()),
        (TwoTowerForMaskedLM, elmo_fields(cooperative=False)),
    ],
    ids=[
        "causal", "causal-control", "masked", "masked-control", "lstm", "gpt", "gpt-control", "gpt-masked", "elmo",
        "elmo-control",
    ],  # fmt: skip
)
def test_one_pass_of_the_towers_gives_the_joint_logits_and_every_probes_logprobs(model_class, fields):
    model = build(model_class, **fields)
    input_ids = random_ids()
    labels = input_ids.masked_fill(torch.arange(SEQ) % 3 != 0, -100)  # a masked LM scores labelled positions
    features = model.probe_features(input_ids)
    torch.testing.assert_close(model.joint_logits(features), model(input_ids).logits, rtol=0, atol=0)
    torch.testing.assert_close(
        model.probe_logprobs(input_ids, labels=labels, features=features),
        model.probe_logprobs(input_ids, labels=labels),
        rtol=0,
        atol=0,
    )
    with pytest.raises(ValueError, match=r"`features` has shape \(2, 3, 8, 16\), expected \(2, 3, 9, 16\)"):
        model.probe_logprobs(input_ids, labels=labels, features=features[:, :, 1:])


def test_options_that_do_not_fit_a_variant_fail_clearly():
    with pytest.raises(TypeError, match="masked LM and cannot generate"):
        build(TwoTowerForMaskedLM).generate(random_ids())
    with pytest.raises(ValueError, match="`output_attentions=True` does not apply to LSTM towers"):
        build(TwoTowerForCausalLM, **lstm_fields())(random_ids(), output_attentions=True)
    with pytest.raises(ValueError, match="`use_cache=True` does not apply to LSTM towers"):
        build(TwoTowerForCausalLM, **lstm_fields())(random_ids(), use_cache=True)
    with pytest.raises(ValueError, match=r"`lstm_hidden_size` \(8\) is smaller than `hidden_size` \(16\)"):
        tiny_config(tower_type="lstm", lstm_hidden_size=8)
    with pytest.raises(ValueError, match="`lstm_hidden_size`=20 only applies to tower_type='lstm'"):
        tiny_config(lstm_hidden_size=20)
    with pytest.raises(ValueError, match="Unknown `tower_type` 'gru'"):
        tiny_config(tower_type="gru")
    with pytest.raises(ValueError, match="TwoTowerForCausalLM needs bidirectional=False towers"):
        TwoTowerForCausalLM(tiny_config(bidirectional=True))
    with pytest.raises(ValueError, match="pass `labels`"):
        build(TwoTowerForMaskedLM).probe_logprobs(random_ids())
    with pytest.raises(ValueError, match="TwoTowerForCausalLM cannot have layout='elmo'.* use TwoTowerForMaskedLM"):
        build(TwoTowerForCausalLM, **elmo_fields())
    with pytest.raises(ValueError, match="layout='elmo' has lstm towers, not tower_type='transformer'"):
        tiny_config(layout="elmo", tower_type="transformer")


def test_every_control_round_trips_through_save_and_remote_code(tmp_path):
    # the independent-towers controls (every tower kind in each layout: tests/modeling/test_kind_conformance.py)
    variants = {
        "control": (TwoTowerForCausalLM, dict(cooperative=False)),
        "gpt_control": (TwoTowerForCausalLM, dict(layout="gpt", cooperative=False)),
        "masked_control": (TwoTowerForMaskedLM, dict(cooperative=False, initialization="reference")),
    }
    input_ids = random_ids()
    expected = {}
    for name, (model_class, fields) in variants.items():
        model = build(model_class, **fields)
        model.save_pretrained(tmp_path / name)
        expected[name] = model(input_ids).logits
        loaded = model_class.from_pretrained(tmp_path / name)
        assert torch.equal(loaded(input_ids).logits, expected[name])
    assert type(AutoModelForMaskedLM.from_pretrained(tmp_path / "masked_control")) is TwoTowerForMaskedLM
    torch.save({"input_ids": input_ids, **expected}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        """
        import sys
        sys.modules["modeling_twotower"] = None  # the package must not be importable here
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
        expected = torch.load("expected.pt")
        auto = {"control": AutoModelForCausalLM, "gpt_control": AutoModelForCausalLM,
                "masked_control": AutoModelForMaskedLM}
        for name, auto_class in auto.items():
            model = auto_class.from_pretrained(name, trust_remote_code=True)
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            assert torch.equal(model(expected["input_ids"]).logits, expected[name]), name
        print("remote code OK")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code OK" in result.stdout
