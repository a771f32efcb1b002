"""Packed sequences (padding-free batches, as transformers' DataCollatorWithFlattening makes them): several
sequences in one row, told apart by position_ids that restart at 0, give each sequence's own logits."""

import pytest
import torch

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM

VOCAB, HIDDEN, MAX_POSITIONS = 61, 12, 8  # the other sizes: conftest.TINY_SIZES
LENGTHS = (3, 5, 2)  # one row of 10 tokens, longer than MAX_POSITIONS: only positions must fit


def tiny_model(model_class, **kwargs):
    return tiny_two_tower(model_class, vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS, **kwargs)


def packed_row(lengths=LENGTHS, seed=1):
    sequences = [torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed + n)) for n in lengths]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]  # [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
    return sequences, torch.cat(sequences, dim=1), position_ids


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", ["bert", "gpt"])
@pytest.mark.parametrize("model_class", [TwoTowerForCausalLM, TwoTowerForMaskedLM], ids=["causal", "masked"])
def test_packed_row_gives_each_sequences_own_logits(model_class, layout, attn_implementation):
    model = tiny_model(model_class, layout=layout, attn_implementation=attn_implementation)
    sequences, input_ids, position_ids = packed_row()
    assert input_ids.shape[1] > MAX_POSITIONS
    with torch.no_grad():
        packed = model(input_ids, position_ids=position_ids).logits  # [1, 10, vocab]
        one_by_one = torch.cat([model(sequence).logits for sequence in sequences], dim=1)
    torch.testing.assert_close(packed, one_by_one, rtol=0, atol=1e-5)


def test_packed_loss_equals_the_loss_over_the_sequences_one_by_one():
    model = tiny_model(TwoTowerForCausalLM)
    sequences, input_ids, position_ids = packed_row()
    # DataCollatorWithFlattening's labels: -100 at each sequence's first token, so no target crosses a boundary
    labels = input_ids.masked_fill(position_ids == 0, -100)
    with torch.no_grad():
        packed = model(input_ids, position_ids=position_ids, labels=labels).loss
        sums = [model(sequence, labels=sequence).loss * (sequence.shape[1] - 1) for sequence in sequences]
    torch.testing.assert_close(packed, sum(sums) / (input_ids.shape[1] - len(LENGTHS)), rtol=0, atol=1e-5)


def test_a_position_beyond_the_table_names_the_largest_position():
    model = tiny_model(TwoTowerForCausalLM)
    input_ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=f"reach {MAX_POSITIONS}, beyond max_position_embeddings={MAX_POSITIONS}"):
        model(input_ids, position_ids=torch.tensor([[0, 1, 0, MAX_POSITIONS]]))


def test_lstm_towers_refuse_packed_rows():
    model = tiny_model(TwoTowerForCausalLM, tower_type="lstm", lstm_hidden_size=HIDDEN)
    _, input_ids, position_ids = packed_row()
    with pytest.raises(ValueError, match="restart inside a row"):
        model(input_ids, position_ids=position_ids, use_cache=False)


@pytest.mark.parametrize("model_class", [TwoTowerForCausalLM, TwoTowerForMaskedLM], ids=["causal", "masked"])
def test_compiled_model_checks_for_packing_only_given_positions(model_class):
    # Under torch.compile the data-dependent check for packed rows cannot run, so a row that may be packed always
    # gets a materialized mask; positions the model numbers itself cannot restart, and leave attention to SDPA's
    # causal (or unmasked) kernel. The packing check's cumsum is in the captured graph only for given positions.
    model = tiny_model(model_class).train()
    _, input_ids, position_ids = packed_row(lengths=(4, 4))
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(model, backend=capture, fullgraph=True)
    compiled(input_ids, labels=input_ids)
    compiled(input_ids, labels=input_ids, position_ids=position_ids)

    def cumsums(graph_module):
        return sum("cumsum" in str(node.target) for node in graph_module.graph.nodes)

    assert len(graphs) == 2 and cumsums(graphs[0]) == 0 and cumsums(graphs[1]) > 0
