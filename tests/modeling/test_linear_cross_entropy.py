"""The loss without logits (`linear_cross_entropy`, `skip_logits=True`): equal to the logits' loss and gradients."""

import importlib.util

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode
from transformers.loss.loss_utils import fixed_cross_entropy

import modeling_twotower.linear_cross_entropy as package_module
from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.linear_cross_entropy import linear_cross_entropy, piece_rows

TOKENS, HIDDEN, VOCAB = 600, 8, 64  # piece_rows(600, 8, 64) = 256 (the floor): three pieces, the last one short


def float32_problem():
    hidden, weight, bias, targets = decoder_problem()
    return hidden.detach().float(), weight.detach().float(), bias.detach().float(), targets


def decoder_problem(dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=dtype, requires_grad=True)
    bias = torch.randn(VOCAB, generator=generator, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    targets[::4] = -100
    return hidden, weight, bias, targets


def loss_and_grads(loss_fn, hidden, weight, bias):
    loss = loss_fn()
    return [loss.detach(), *torch.autograd.grad(loss, (hidden, weight, bias))]


@pytest.mark.parametrize("num_items_in_batch", [None, 100], ids=["token_mean", "sum_over_num_items"])
def test_loss_and_gradients_equal_the_logits_loss(num_items_in_batch):
    hidden, weight, bias, targets = decoder_problem()
    assert piece_rows(TOKENS, HIDDEN, VOCAB) == 256

    def from_logits():  # transformers' LM loss (it computes in float32, so the reference here is F.cross_entropy)
        return F.cross_entropy(F.linear(hidden, weight, bias), targets, reduction="sum") / (
            (targets != -100).sum() if num_items_in_batch is None else num_items_in_batch
        )

    expected = loss_and_grads(from_logits, hidden, weight, bias)
    actual = loss_and_grads(
        lambda: linear_cross_entropy(hidden, weight, bias, targets, num_items_in_batch), hidden, weight, bias
    )
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert actual[1][::4].abs().max() == 0  # ignored targets send no gradient to their hidden states
    with torch.no_grad():  # the loss alone, no gradient work
        torch.testing.assert_close(
            linear_cross_entropy(hidden, weight, bias, targets, num_items_in_batch), expected[0], rtol=1e-12, atol=0
        )


def test_pieces_follow_liger_kernels_rule_above_a_floor_by_the_decoders_size():
    assert piece_rows(8 * 1024, 768, 50257) == 512  # GPT-2's size, where the rule alone gives 128
    assert piece_rows(2048, 192, 30528) == 512  # a weight of 5.9M elements, out of cache: the larger floor
    assert piece_rows(16 * 128, 128, 8192) == 256  # the benchmark's size (1M elements), where the rule alone gives 32
    assert piece_rows(64 * 1024, 1024, 30528) == 4096  # a large GPU step: pieces as large as the hidden states
    assert piece_rows(10, 8, 64) == 10  # never more rows than tokens


def test_float32_equals_transformers_loss_to_float_tolerance_and_a_frozen_decoder_gets_no_gradient():
    hidden, weight, bias, targets = float32_problem()
    hidden.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, bias, targets)
    expected = fixed_cross_entropy(F.linear(hidden, weight, bias), targets)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    loss.backward()
    assert hidden.grad is not None and weight.grad is None and bias.grad is None


def test_autocast_computes_in_its_dtype_like_the_logits_loss():
    hidden, weight, bias, targets = (tensor.requires_grad_(tensor.is_floating_point()) for tensor in float32_problem())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = loss_and_grads(lambda: fixed_cross_entropy(F.linear(hidden, weight, bias), targets),
                                  hidden, weight, bias)  # fmt: skip
        actual = loss_and_grads(lambda: linear_cross_entropy(hidden, weight, bias, targets), hidden, weight, bias)
    assert actual[0].dtype == torch.float32
    assert [grad.dtype for grad in actual[1:]] == [torch.float32] * 3  # each input's dtype
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    with torch.no_grad():
        assert (actual[0] - fixed_cross_entropy(F.linear(hidden, weight, bias), targets)).abs() > 1e-5  # bf16 ran


@pytest.mark.parametrize(
    "model_class, config",
    [
        (TwoTowerForCausalLM, {}),
        (TwoTowerForCausalLM, {"cooperative": False}),
        (TwoTowerForMaskedLM, {}),
        (TwoTowerForMaskedLM, {"sparse_prediction": True}),
    ],
    ids=["causal", "causal_control", "masked", "masked_sparse"],
)
def test_skip_logits_gives_the_models_loss_and_gradients_without_logits(model_class, config):
    model = tiny_two_tower(model_class, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0, **config)
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, VOCAB, (3, 11), generator=generator)
    labels = input_ids.masked_fill(torch.rand(3, 11, generator=generator) > 0.6, -100)
    results = []
    for skip_logits in (False, True):
        model.zero_grad()
        output = model(input_ids, labels=labels, num_items_in_batch=torch.tensor(20), skip_logits=skip_logits)
        output.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((output, grads))
    (full, full_grads), (skipped, skipped_grads) = results
    assert full.logits is not None and skipped.logits is None
    torch.testing.assert_close(skipped.loss, full.loss, rtol=1e-6, atol=1e-6)
    assert skipped_grads.keys() == full_grads.keys()
    scale = max(grad.abs().max() for grad in full_grads.values())
    for name, grad in full_grads.items():
        torch.testing.assert_close(skipped_grads[name], grad, rtol=1e-5, atol=1e-6 * scale, msg=name)


def test_skip_logits_without_labels_is_refused():
    model = tiny_two_tower(TwoTowerForCausalLM, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="pass `labels` too"):
        model(torch.tensor([[1, 2, 3]]), skip_logits=True)


@pytest.mark.parametrize("probe_type", ["mlp", "linear"])
@pytest.mark.parametrize("per_probe_targets", [False, True], ids=["shared_targets", "per_probe_targets"])
def test_probe_loss_without_logits_equals_the_log_probability_loss(probe_type, per_probe_targets):
    model = tiny_two_tower(TwoTowerForCausalLM, vocab_size=VOCAB, probe_replicas=2, probe_type=probe_type)
    probes = model.probes
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(probes.num_towers, 40, model.config.hidden_size, generator=generator)
    shape = (probes.num_probes, 40) if per_probe_targets else (40,)
    targets = torch.randint(0, VOCAB, shape, generator=generator)
    results = []
    for loss_fn in (
        lambda: -probes.score_positions(features, targets).sum() / 37,
        lambda: probes.summed_loss(features, targets, 37),
    ):
        probes.zero_grad()
        loss = loss_fn()
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in probes.named_parameters()}))
    (expected, expected_grads), (loss, grads) = results
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_the_loss_is_one_opaque_operator_with_the_eager_loss_and_gradients():
    # Traced into, the piece loop was unrolled and ran slower than eager; as one operator the graph calls the eager
    # code. The captured graph holds the operator once and none of the pieces' matmuls.
    hidden, weight, bias, targets = decoder_problem()
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(linear_cross_entropy, backend=capture, fullgraph=True)
    ours = loss_and_grads(lambda: compiled(hidden, weight, bias, targets), hidden, weight, bias)
    eager = loss_and_grads(lambda: linear_cross_entropy(hidden, weight, bias, targets), hidden, weight, bias)
    targets_called = [  # the autograd.Function's forward and backward are subgraphs of the captured graph
        str(node.target)
        for module in graphs[0].modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function"
    ]
    assert sum("loss_and_grads" in target for target in targets_called) == 1
    assert not any(name in target for target in targets_called for name in ("addmm", "matmul", "exp"))
    for value, expected in zip(ours, eager):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_a_second_copy_of_the_module_registers_its_own_operator(tmp_path):
    # Hub custom code loads the modeling files again under another module name, in the same process as the package
    spec = importlib.util.spec_from_file_location("hub_copy.linear_cross_entropy", package_module.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy._OPERATOR != package_module._OPERATOR
    hidden, weight, bias, targets = decoder_problem()
    from_copy = loss_and_grads(lambda: copy.linear_cross_entropy(hidden, weight, bias, targets), hidden, weight, bias)
    ours = loss_and_grads(lambda: linear_cross_entropy(hidden, weight, bias, targets), hidden, weight, bias)
    for value, expected in zip(from_copy, ours):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "requires_grad, matmuls",
    [((True, True, True), 3), ((False, True, True), 2), ((True, False, False), 2), ((False, False, False), 1)],
    ids=["all", "decoder_only", "hidden_only", "no_grad"],
)
def test_torchs_flop_counter_counts_the_operators_matmuls(requires_grad, matmuls):
    # inside the operator the counter sees nothing: its formula counts the logits' matmul and one per gradient asked
    # for (the hidden states', the decoder weight's)
    hidden, weight, bias, targets = decoder_problem()
    for tensor, flag in zip((hidden, weight, bias), requires_grad):
        tensor.requires_grad_(flag)
    with FlopCounterMode(display=False) as counter:
        linear_cross_entropy(hidden, weight, bias, targets)
    assert counter.get_total_flops() == matmuls * 2 * TOKENS * HIDDEN * VOCAB
