"""Attention a tower at a time (CPU training with dropout) against the one SDPA call over all towers' heads that it
replaces: the same outputs, gradients and dropout masks to the bit, alone and in a whole model's training step, and
taken exactly where that holds."""

import itertools

import pytest
import torch
from torch.nn import functional as F

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.decoder_layers import TwoTowerAttention, tower_at_a_time_attention

TOWERS, BATCH, HEADS, HEAD_DIM = 2, 3, 3, 4
SCALING = HEAD_DIM**-0.5


def fold(states):
    # [towers, batch, heads, seq, head_dim] -> [batch, towers * heads, seq, head_dim], tower-major as the model folds
    num_towers, batch, heads, seq, head_dim = states.shape
    return states.transpose(0, 1).reshape(batch, num_towers * heads, seq, head_dim)


def one_call(query, key, value, scaling, dropout, is_causal):
    num_towers, batch, heads, seq, head_dim = query.shape
    output = F.scaled_dot_product_attention(
        fold(query), fold(key), fold(value), dropout_p=dropout, is_causal=is_causal, scale=scaling
    )  # [batch, towers * heads, seq, head_dim] -> [towers, batch, seq, heads * head_dim]
    return output.view(batch, num_towers, heads, seq, head_dim).permute(1, 0, 3, 2, 4).reshape(
        num_towers, batch, seq, heads * head_dim
    )


def run(attention, inputs, output_grad, dropout, is_causal, seed=0):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]  # clone keeps the layout
    torch.manual_seed(seed)
    output = attention(*leaves, SCALING, dropout, is_causal)
    output.backward(output_grad)
    return [output.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("num_towers, seq", [(2, 7), (3, 9), (2, 1)])
@pytest.mark.parametrize("dropout", [0.1, 0.5])
@pytest.mark.parametrize("layout", ["contiguous", "projections"])
def test_outputs_gradients_and_masks_are_the_single_calls_to_the_bit(dtype, is_causal, num_towers, seq, dropout, layout):
    generator = torch.Generator().manual_seed(1)
    shape = (num_towers, BATCH, HEADS, seq, HEAD_DIM)
    if layout == "contiguous":
        inputs = [torch.randn(shape, generator=generator, dtype=dtype) for _ in "qkv"]
    else:  # as the model passes them: views of the projections' [towers, batch, seq, heads, head_dim]
        inputs = [
            torch.randn(num_towers, BATCH, seq, HEADS, HEAD_DIM, generator=generator, dtype=dtype).transpose(2, 3)
            for _ in "qkv"
        ]
    output_grad = torch.randn(num_towers, BATCH, seq, HEADS * HEAD_DIM, generator=generator, dtype=dtype)
    expected = run(one_call, inputs, output_grad, dropout, is_causal)
    actual = run(tower_at_a_time_attention, inputs, output_grad, dropout, is_causal)
    for name, want, got in zip(["output", "query grad", "key grad", "value grad"], expected, actual):
        assert torch.equal(got, want), name
    # the masks are drawn, not skipped: another seed draws others, and the single call agrees on those too
    other_seed = run(one_call, inputs, output_grad, dropout, is_causal, seed=1)
    assert not torch.equal(other_seed[0], expected[0])
    assert torch.equal(run(tower_at_a_time_attention, inputs, output_grad, dropout, is_causal, seed=1)[0], other_seed[0])


def training_step(model, input_ids, tower_at_a_time, monkeypatch):
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return tower_at_a_time_attention(*args)

    monkeypatch.setattr("modeling_twotower.decoder_layers.tower_at_a_time_attention", counted)
    if not tower_at_a_time:
        monkeypatch.setattr(TwoTowerAttention, "_runs_a_tower_at_a_time", lambda *args: False)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    monkeypatch.undo()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, calls


@pytest.mark.parametrize(
    "model_class, layout", [(TwoTowerForCausalLM, "gpt"), (TwoTowerForCausalLM, "bert"), (TwoTowerForMaskedLM, "bert")]
)
def test_a_training_step_is_the_single_calls_to_the_bit(model_class, layout, monkeypatch):
    model = tiny_two_tower(model_class, layout=layout, attention_dropout=0.3, hidden_dropout=0.1).train()
    assert model.config._attn_implementation == "sdpa"
    input_ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    loss, grads, calls = training_step(model, input_ids, True, monkeypatch)
    expected_loss, expected_grads, no_calls = training_step(model, input_ids, False, monkeypatch)
    assert len(calls) == model.config.num_hidden_layers and not no_calls
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():  # None: the probes, which the joint loss does not reach
        assert (grad is None and expected_grads[name] is None) or torch.equal(grad, expected_grads[name]), name


TAKEN = dict(implementation="sdpa", training=True, attention_dropout=0.1, dtype=torch.float32, mask=None, cache=None)
NOT_TAKEN = {  # each alone keeps the single call: another kernel, no dropout, another rounding, a mask or a cache
    "eager attention": dict(implementation="eager"),
    "eval mode": dict(training=False),
    "no attention dropout": dict(attention_dropout=0.0),
    "bfloat16": dict(dtype=torch.bfloat16),
    "float16": dict(dtype=torch.float16),
    "a mask": dict(mask=torch.ones(1, 1, 5, 5, dtype=torch.bool)),
    "a cache": dict(cache=object()),
}


@pytest.mark.parametrize("change", [{}, *NOT_TAKEN.values()], ids=["taken", *NOT_TAKEN])
def test_runs_a_tower_at_a_time_exactly_where_it_is_the_single_calls_bits(change):
    case = {**TAKEN, **change}
    model = tiny_two_tower(attention_dropout=case["attention_dropout"]).train(case["training"])
    attention = model.model.towers.layers[0].self_attn
    query = torch.zeros(TOWERS, BATCH, 5, model.config.hidden_size, dtype=case["dtype"])
    taken = attention._runs_a_tower_at_a_time(query, case["mask"], case["cache"], case["implementation"])
    assert taken == (change == {})


def compiled_training_step(model, input_ids, backend):
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()  # a fresh trace: a graph cached by another test would skip the capture
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    compiled = torch.compile(model, backend=capture if backend == "capture" else backend, fullgraph=True)
    loss = compiled(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, graphs


def test_compiled_training_traces_it_in_one_graph():
    # compiled, the path is traced like any code: one graph, a softmax per tower and layer, no SDPA call
    model = tiny_two_tower(attention_dropout=0.1, num_hidden_layers=2).train()
    input_ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    _, _, graphs = compiled_training_step(model, input_ids, "capture")
    targets = [str(node.target) for node in graphs[0].graph.nodes]
    assert len(graphs) == 1 and not any("scaled_dot_product_attention" in target for target in targets)
    assert sum("softmax" in target for target in targets) == model.config.num_towers * 2


def test_a_compiled_training_step_is_the_eager_ones(monkeypatch):
    # AOT autograd traces forward and backward as inductor gets them; run op by op, they are the eager step's
    model = tiny_two_tower(attention_dropout=0.3, hidden_dropout=0.1).train()
    input_ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    loss, grads, _ = compiled_training_step(model, input_ids, "aot_eager")
    expected_loss, expected_grads, calls = training_step(model, input_ids, True, monkeypatch)
    assert len(calls) == model.config.num_hidden_layers
    assert torch.equal(loss, expected_loss)
    for name, grad in grads.items():  # the same masks and the same ops: the same bits
        assert (grad is None and expected_grads[name] is None) or torch.equal(grad, expected_grads[name]), name


def test_every_layer_and_tower_count_runs_it(monkeypatch):
    for num_towers, layers in itertools.product([2, 3], [1, 2]):
        model = tiny_two_tower(num_towers=num_towers, num_hidden_layers=layers, attention_dropout=0.2).train()
        _, _, calls = training_step(model, torch.zeros(2, 6, dtype=torch.long), True, monkeypatch)
        assert [shape[0] for shape in calls] == [num_towers] * layers
