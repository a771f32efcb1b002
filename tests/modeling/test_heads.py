"""The LM heads as modules: the fusion head and the control's independent heads (checkpoints saved before they were
modules: tests/modeling/test_convert_checkpoint.py)."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers.conversion_mapping import get_model_conversion_mapping

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM, TwoTowerModel
from modeling_twotower.heads import TwoTowerFusionHead, TwoTowerIndependentHeads

BATCH, SEQ, VOCAB = 3, 7, 61


def tiny_model(model_class=TwoTowerForCausalLM, **kwargs):
    return tiny_two_tower(model_class, vocab_size=VOCAB, **kwargs)


def test_the_config_chooses_the_head_once():
    cooperative, control = tiny_model(), tiny_model(cooperative=False)
    assert isinstance(cooperative.lm_head, TwoTowerFusionHead) and isinstance(control.lm_head, TwoTowerIndependentHeads)
    assert cooperative.get_output_embeddings() is cooperative.lm_head.decoder
    assert cooperative.lm_head.decoder.weight is cooperative.model.embed_tokens.weight
    assert control.get_output_embeddings() is None
    assert control.lm_head.decoder.weight.shape == (2, 12, VOCAB)  # [towers, hidden, vocab], untied


@pytest.mark.parametrize("cooperative", [True, False], ids=["fusion", "independent"])
def test_head_loss_is_the_token_mean_cross_entropy_or_the_sum_over_num_items(cooperative):
    model = tiny_model(TwoTowerForMaskedLM, cooperative=cooperative)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = input_ids.masked_fill(torch.arange(SEQ) % 3 != 0, -100)
    output = model(input_ids, labels=labels)
    if cooperative:
        expected = F.cross_entropy(output.logits.reshape(-1, VOCAB), labels.reshape(-1))
    else:  # each tower's own loss, summed
        tower_logprobs = model.lm_head.tower_logprobs(model.probe_features(input_ids))
        expected = sum(F.nll_loss(logprobs.reshape(-1, VOCAB), labels.reshape(-1)) for logprobs in tower_logprobs)
    torch.testing.assert_close(output.loss, expected, rtol=1e-6, atol=1e-6)
    num_items = int((labels != -100).sum())
    summed = model(input_ids, labels=labels, num_items_in_batch=2 * num_items).loss
    torch.testing.assert_close(summed, output.loss / 2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cooperative", [True, False], ids=["fusion", "independent"])
def test_sparse_prediction_gives_the_dense_loss_gradients_and_labelled_logits(cooperative):
    dense = tiny_model(TwoTowerForMaskedLM, cooperative=cooperative, hidden_dropout=0.0, attention_dropout=0.0)
    sparse = tiny_model(TwoTowerForMaskedLM, cooperative=cooperative, hidden_dropout=0.0, attention_dropout=0.0,
                        sparse_prediction=True)
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = input_ids.masked_fill(torch.rand(BATCH, SEQ, generator=generator) > 0.3, -100)
    labelled = labels != -100
    dense_output, sparse_output = dense.train()(input_ids, labels=labels), sparse.train()(input_ids, labels=labels)

    assert sparse_output.logits.shape == (int(labelled.sum()), VOCAB)
    torch.testing.assert_close(sparse_output.logits, dense_output.logits[labelled], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse_output.loss, dense_output.loss, rtol=1e-6, atol=1e-6)
    dense_output.loss.backward()
    sparse_output.loss.backward()
    for (name, dense_parameter), sparse_parameter in zip(dense.named_parameters(), sparse.parameters()):
        torch.testing.assert_close(sparse_parameter.grad, dense_parameter.grad, rtol=1e-5, atol=1e-6, msg=name)

    # without labels (inference, validation) the logits cover every position
    with torch.no_grad():
        torch.testing.assert_close(sparse.eval()(input_ids).logits, dense.eval()(input_ids).logits)


@pytest.mark.parametrize("model_class", [TwoTowerModel, TwoTowerForCausalLM, TwoTowerForMaskedLM])
def test_no_conversion_is_registered_and_a_callers_key_mapping_applies(model_class, tmp_path):
    # transformers' common test_reverse_loading_mapping takes every conversion the model type registers, reverses it
    # on save and asks that each pattern match a saved key: the model registers none (earlier names are converted
    # once by scripts/convert_checkpoint.py), and a save and load round trip is exact
    model = tiny_model(model_class)
    assert get_model_conversion_mapping(model, add_legacy=False) == []
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved.keys() == model.state_dict().keys() - model.all_tied_weights_keys.keys()
    reloaded = model_class.from_pretrained(tmp_path)
    assert all(torch.equal(tensor, reloaded.state_dict()[name]) for name, tensor in model.state_dict().items())
    # a caller's own key_mapping applies
    renamed = {f"renamed.{name}": tensor for name, tensor in saved.items()}
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    remapped = model_class.from_pretrained(tmp_path, key_mapping={"^renamed.": ""})
    assert all(torch.equal(tensor, remapped.state_dict()[name]) for name, tensor in model.state_dict().items())
