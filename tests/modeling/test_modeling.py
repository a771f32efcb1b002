"""TwoTowerConfig and TwoTowerForCausalLM: architecture, equivalences, generation, saving and loading."""

import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GPT2TokenizerFast, PretrainedConfig, pipeline

import modeling_twotower
from conftest import HANG_LIMIT_S, TINY_SIZES, tiny_two_tower
from conftest import tiny_two_tower_config as tiny_config
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerModel
from modeling_twotower.towers import TOWER_KINDS
from test_version_ranges import version_range_script

# The tiny model's odd sizes (conftest.TINY_SIZES): a mis-reshaped tensor fails loudly.
BATCH, SEQ = 3, 7
VOCAB, HIDDEN, LAYERS, HEADS, FFN = (
    TINY_SIZES[name]
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
)


def tiny_model(seed=0, **kwargs):
    return tiny_two_tower(seed=seed, **kwargs)


def random_ids(batch=BATCH, seq=SEQ, seed=1, vocab=VOCAB):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- config


def test_presets_match_the_paper():
    base = TwoTowerConfig.from_preset("base")
    assert (base.num_hidden_layers, base.num_attention_heads, base.hidden_size, base.intermediate_size) == (
        12,
        12,
        384,
        1536,
    )
    assert (base.max_position_embeddings, base.vocab_size, base.num_towers, base.fused_hidden_size) == (
        128,
        30528,
        2,
        768,
    )
    large = TwoTowerConfig.from_preset("large", num_towers=3)
    assert (large.num_hidden_layers, large.num_attention_heads, large.hidden_size, large.intermediate_size) == (
        24,
        16,
        512,
        2048,
    )
    assert large.num_towers == 3 and large.fused_hidden_size == 1536
    for name, (layers, heads, hidden) in {"gpt-base": (12, 12, 384), "gpt-large": (24, 16, 512)}.items():
        gpt = TwoTowerConfig.from_preset(name)  # the reference's get_model_config("base_2tower" / "large_2tower")
        assert (gpt.num_hidden_layers, gpt.num_attention_heads, gpt.hidden_size) == (layers, heads, hidden)
        assert (gpt.intermediate_size, gpt.embedding_size, gpt.max_position_embeddings) == (4 * hidden, hidden, 128)
        assert (gpt.layout, gpt.hidden_act, gpt.layer_norm_eps) == ("gpt", "gelu_new", 1e-5)  # GPT-2's config
    paper_sized = [name for name in modeling_twotower.PRESETS if name != "tiny"]
    assert {TwoTowerConfig.from_preset(name).initialization for name in paper_sized} == {"reference"}
    assert base.layout == large.layout == "bert" and TwoTowerConfig.from_preset("tiny").initialization == "normal"
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TwoTowerConfig.from_preset("huge")


def test_model_type_is_namespaced_and_config_round_trips(tmp_path):
    assert TwoTowerConfig.model_type not in {"twotower", "two_tower"}
    config = tiny_config(num_towers=3)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, TwoTowerConfig)
    assert {k: v for k, v in loaded.to_diff_dict().items() if k != "_name_or_path"} == config.to_diff_dict()
    assert loaded.num_towers == 3 and loaded.use_cache is True


# every preset with each kind that builds its layout, in each direction the kind's stack has there
PRESET_KINDS = [
    pytest.param(preset, tower_type, bidirectional, id=f"{preset}-{tower_type}-{['causal', 'masked'][bidirectional]}")
    for preset, fields in modeling_twotower.PRESETS.items()
    for tower_type, kind in TOWER_KINDS.items()
    if fields.get("layout", "bert") in kind.layouts
    for bidirectional in kind.stack_class(fields.get("layout", "bert")).directions
]  # fmt: skip


@pytest.mark.parametrize("preset, tower_type, bidirectional", PRESET_KINDS)
def test_every_preset_and_kind_saves_its_declared_fields_and_loads_them_back(preset, tower_type, bidirectional):
    config = TwoTowerConfig.from_preset(preset, tower_type=tower_type, bidirectional=bidirectional)
    saved = config.to_dict()
    # what is saved is the declared fields, the defaults that read other fields resolved, and the base class's keys
    declared = {field.name for field in dataclasses.fields(TwoTowerConfig)}
    assert set(saved) == declared | set(PretrainedConfig().to_dict())
    assert None not in (saved["tower_type"], saved["embedding_size"])
    for written in (saved, json.loads(config.to_json_string())):  # and config.json, which omits the base defaults
        assert TwoTowerConfig.from_dict(written).to_dict() == saved


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(hidden_size=13), "hidden_size.*divisible by `num_attention_heads`"),
        (dict(num_towers=1), "num_towers.*>= 2"),
        (dict(num_hidden_layers=0), "num_hidden_layers.*positive"),
        (dict(intermediate_size=-4), "intermediate_size.*positive"),
        (dict(vocab_size=0), "vocab_size.*positive"),
        (dict(hidden_act="swishy"), "Unknown `hidden_act` 'swishy'"),
        (dict(hidden_dropout=1.5), "hidden_dropout.*\\[0, 1\\)"),
        (dict(embedding_size=0), "`embedding_size` must be a positive integer .*num_towers \\* hidden_size = 24"),
        (dict(layout="t5"), r"Unknown `layout` 't5'; use one of \['bert', 'gpt', 'elmo'\]"),
        (dict(layout="gpt", tower_type="lstm"), "layout='gpt' has transformer towers, not tower_type='lstm'"),
        (dict(layout="gpt", embedding_size=24), r"layout='gpt' .* `embedding_size` must equal hidden_size \(12\)"),
        (dict(layout="elmo", hidden_size=15, num_attention_heads=5), "use an even hidden_size, e.g. 16"),
        (dict(layout="elmo", bidirectional=False), "layout='elmo' has .* towers only, not bidirectional=False: use "
         r"TwoTowerForMaskedLM, or for causal lstm towers a layout of \['bert'\]"),
        (dict(initialization="xavier"), r"Unknown `initialization` 'xavier'; use one of \['normal', 'reference'\]"),
    ],
)
def test_invalid_config_raises_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**fields)


# ---------------------------------------------------------------- architecture


def test_parameters_follow_the_paper_architecture():
    model = tiny_model(num_towers=3)
    fused = 3 * HIDDEN
    assert model.model.embed_tokens.weight.shape == (VOCAB, fused)
    assert model.model.embeddings.embed_positions.weight.shape == (32, fused)
    assert model.model.embeddings.tower_proj.weight.shape == (3, fused, HIDDEN)  # [towers, in, out]
    assert model.model.towers.layers[0].mlp.up_proj.weight.shape == (3, HIDDEN, FFN)
    assert model.lm_head.dense.weight.shape == (fused, fused)
    # decoder tied to the shared embedding (one tensor), plus an output bias initialised to zero
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight
    assert model.lm_head.decoder.bias.shape == (VOCAB,) and torch.count_nonzero(model.lm_head.decoder.bias) == 0
    # one untied probe per tower reading one tower's slice
    assert model.probes.dense.weight.shape == (3, HIDDEN, HIDDEN)
    assert model.probes.decoder.weight.shape == (3, HIDDEN, VOCAB)
    std = model.model.towers.layers[1].self_attn.q_proj.weight.std().item()
    assert abs(std - model.config.initializer_range) < 0.005


def test_embedding_size_narrows_the_embedding_and_the_tied_decoder(tmp_path):
    # The bert layout with an h-wide embedding (the reference's GPT variant is layout="gpt"): Linear(towers * h -> h)
    # before the decoder, and the embedding norm and per-tower projections kept.
    model = tiny_model(embedding_size=HIDDEN)
    assert model.config.fused_hidden_size == 2 * HIDDEN and tiny_config().embedding_size == 2 * HIDDEN
    assert model.model.embed_tokens.weight.shape == (VOCAB, HIDDEN)
    assert model.model.embeddings.embed_positions.weight.shape == (32, HIDDEN)
    assert model.model.embeddings.tower_proj.weight.shape == (2, HIDDEN, HIDDEN)
    assert model.lm_head.dense.weight.shape == (HIDDEN, 2 * HIDDEN)  # nn.Linear: [out, in]
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight

    # The head, independently: LayerNorm(concat) -> Linear + GELU -> LayerNorm -> embedding^T + output bias.
    input_ids = random_ids()
    output = model(input_ids, output_tower_hidden_states=True)
    concat = torch.cat(list(output.tower_hidden_states), dim=-1)
    eps = model.config.layer_norm_eps
    fused = F.layer_norm(concat, (2 * HIDDEN,), model.model.fusion.norm.weight, model.model.fusion.norm.bias, eps)
    fused = F.gelu(fused @ model.lm_head.dense.weight.T + model.lm_head.dense.bias)
    fused = F.layer_norm(fused, (HIDDEN,), model.lm_head.norm.weight, model.lm_head.norm.bias, eps)
    expected = fused @ model.model.embed_tokens.weight.T + model.lm_head.decoder.bias
    torch.testing.assert_close(output.logits, expected, rtol=1e-5, atol=1e-5)

    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.embedding_size == HIDDEN
    assert torch.equal(loaded(input_ids).logits, output.logits)
    assert loaded.lm_head.decoder.weight is loaded.model.embed_tokens.weight


def _reference_tower(model, tower_idx, input_ids, params):
    """One tower computed alone from its sliced weights, with plain torch ops (independent of the model code)."""
    config = model.config
    batch, seq = input_ids.shape
    embedding = model.model.embeddings
    embeddings = model.model.embed_tokens(input_ids) + embedding.embed_positions(torch.arange(seq))
    embeddings = embedding.embed_norm(embeddings)

    def linear(name, x):
        return x @ params[name + ".weight"] + params[name + ".bias"]

    def layer_norm(name, x):
        return F.layer_norm(x, (x.shape[-1],), params[name + ".weight"], params[name + ".bias"], config.layer_norm_eps)

    hidden = linear("model.embeddings.tower_proj", embeddings)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for i in range(config.num_hidden_layers):
        prefix = f"model.towers.layers.{i}."
        x = layer_norm(prefix + "input_layernorm", hidden)
        q, k, v = (
            linear(prefix + f"self_attn.{p}_proj", x).view(batch, seq, config.num_attention_heads, -1).transpose(1, 2)
            for p in "qkv"
        )
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(config.head_dim)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        hidden = hidden + linear(prefix + "self_attn.o_proj", attn.transpose(1, 2).reshape(batch, seq, -1))
        x = layer_norm(prefix + "post_attention_layernorm", hidden)
        hidden = hidden + linear(prefix + "mlp.down_proj", F.gelu(linear(prefix + "mlp.up_proj", x)))
    return hidden


@pytest.mark.parametrize("num_towers, embedding_size", [(2, None), (3, None), (2, HIDDEN)])
def test_batched_towers_equal_each_tower_run_alone_forward_and_backward(num_towers, embedding_size):
    model = tiny_model(num_towers=num_towers, embedding_size=embedding_size)
    input_ids = random_ids()
    stack = ("model.embeddings.tower_proj", "model.towers.layers")
    tower_names = [n for n, _ in model.named_parameters() if n.startswith(stack)]
    weights = torch.randn(num_towers, BATCH, SEQ, HIDDEN, generator=torch.Generator().manual_seed(3))

    towers = model(input_ids, output_tower_hidden_states=True).tower_hidden_states
    assert towers.shape == (num_towers, BATCH, SEQ, HIDDEN)
    (towers * weights).sum().backward()
    model_grads = {n: p.grad for n, p in model.named_parameters() if n in tower_names}

    for tower_idx in range(num_towers):
        params = {
            n: p.detach()[tower_idx].clone().requires_grad_() for n, p in model.named_parameters() if n in tower_names
        }
        reference = _reference_tower(model, tower_idx, input_ids, params)
        torch.testing.assert_close(towers[tower_idx], reference, rtol=1e-5, atol=1e-5)
        (reference * weights[tower_idx]).sum().backward()
        for name in tower_names:
            torch.testing.assert_close(model_grads[name][tower_idx], params[name].grad, rtol=1e-4, atol=1e-6)


def test_perturbing_one_tower_leaves_the_others_unchanged():
    model = tiny_model()
    input_ids = random_ids()
    before = model(input_ids, output_tower_hidden_states=True).tower_hidden_states
    with torch.no_grad():
        for layer in model.model.towers.layers:
            layer.mlp.up_proj.weight[0] += torch.randn(layer.mlp.up_proj.weight[0].shape)
    after = model(input_ids, output_tower_hidden_states=True).tower_hidden_states
    assert not torch.allclose(before[0], after[0])
    torch.testing.assert_close(before[1], after[1], rtol=0, atol=0)


# ---------------------------------------------------------------- forward outputs


def test_loss_is_shifted_next_token_cross_entropy_with_ignored_labels():
    model = tiny_model()
    input_ids = random_ids()
    labels = input_ids.clone()
    labels[0, 3] = -100
    output = model(input_ids, labels=labels)
    logits = output.logits[:, :-1].reshape(-1, VOCAB)
    targets = labels[:, 1:].reshape(-1)
    expected = F.cross_entropy(logits, targets, ignore_index=-100)
    torch.testing.assert_close(output.loss, expected)
    summed = model(input_ids, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    torch.testing.assert_close(summed, F.cross_entropy(logits, targets, reduction="sum") / 40)


def test_hidden_states_attentions_and_tuple_outputs():
    model = tiny_model()
    input_ids = random_ids()
    output = model(input_ids, output_hidden_states=True, output_attentions=True)
    assert len(output.hidden_states) == LAYERS + 1
    assert all(h.shape == (BATCH, SEQ, 2 * HIDDEN) for h in output.hidden_states)
    assert len(output.attentions) == LAYERS
    attention = output.attentions[0]
    assert attention.shape == (BATCH, 2 * HEADS, SEQ, SEQ)  # towers folded into heads, tower-major
    torch.testing.assert_close(attention.sum(-1), torch.ones(BATCH, 2 * HEADS, SEQ))
    assert torch.count_nonzero(attention.triu(1)) == 0  # causal
    as_tuple = model(input_ids, return_dict=False, use_cache=False)
    torch.testing.assert_close(as_tuple[0], output.logits)
    base = TwoTowerModel(model.config)
    assert base(input_ids).last_hidden_state.shape == (BATCH, SEQ, 2 * HIDDEN)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_inputs_embeds_equal_input_ids_and_batch_equals_single_examples(layout):
    model = tiny_model(layout=layout)
    input_ids = random_ids()
    logits = model(input_ids).logits
    embeds = model.get_input_embeddings()(input_ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, logits)
    for b in range(BATCH):
        torch.testing.assert_close(model(input_ids[b : b + 1]).logits[0], logits[b], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_sdpa_and_eager_agree(layout):
    sdpa = tiny_model(layout=layout)
    eager = tiny_model(layout=layout)
    eager.set_attn_implementation("eager")
    assert sdpa.config._attn_implementation == "sdpa"
    input_ids = random_ids()
    torch.testing.assert_close(sdpa(input_ids).logits, eager(input_ids).logits, rtol=1e-5, atol=1e-5)


def test_eager_attention_in_float64_with_left_padding_equals_sdpa():
    # a left-padded row's first positions see no key; in float64 the mask's minimum once overflowed float32's softmax
    sdpa = tiny_model().double()
    eager = tiny_model().double()
    eager.set_attn_implementation("eager")
    input_ids = random_ids()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    kept = attention_mask.bool()
    eager_logits = eager(input_ids, attention_mask=attention_mask).logits
    assert not eager_logits.isnan().any()
    torch.testing.assert_close(eager_logits[kept], sdpa(input_ids, attention_mask=attention_mask).logits[kept])


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_every_parameter_receives_a_gradient(layout):
    model = tiny_model(layout=layout).train()
    input_ids = random_ids()
    loss = model(input_ids, labels=input_ids).loss - model.probe_logprobs(input_ids).sum()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or torch.count_nonzero(p.grad) == 0]
    assert missing == []


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_gradient_checkpointing_gives_the_same_gradients(layout):
    input_ids = random_ids()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(layout=layout, hidden_dropout=0.0, attention_dropout=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.model.towers.layers[0].gradient_checkpointing
        model(input_ids, labels=input_ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- probes


def test_probe_logprobs_equal_full_log_softmax_and_are_chunked():
    model = tiny_model(num_towers=3)
    input_ids = random_ids()
    labels = input_ids.clone()
    labels[1, 4] = -100
    features = model.probe_features(input_ids)
    fused = model.model(input_ids).last_hidden_state
    torch.testing.assert_close(features[2], fused[..., 2 * HIDDEN :])
    full = model.probes.logits(features[:, :, :-1]).log_softmax(-1)  # [towers, batch, seq-1, vocab]
    expected = full.gather(-1, labels[:, 1:].clamp(min=0).expand(3, -1, -1).unsqueeze(-1)).squeeze(-1)
    expected[:, 1, 3] = 0.0

    seen_rows = []
    hook = model.probes.decoder.register_forward_hook(lambda m, i, o: seen_rows.append(i[0].shape[1]))
    logprobs = model.probe_logprobs(input_ids, labels=labels, chunk_size=4)
    hook.remove()
    assert logprobs.shape == (3, BATCH, SEQ - 1)
    torch.testing.assert_close(logprobs, expected, rtol=1e-5, atol=1e-5)
    # only scored positions reach the vocabulary projection: the ignored one does not
    assert max(seen_rows) == 4 and sum(seen_rows) == BATCH * (SEQ - 1) - 1
    torch.testing.assert_close(model.probe_logprobs(input_ids, labels=labels), logprobs, rtol=1e-5, atol=1e-5)
    # recomputed chunks (chunk_size 4) and one kept chunk (the default here) give the probes the same gradients
    grads = []
    for chunk_size in (4, None):
        model.probes.zero_grad()
        model.probe_logprobs(input_ids, labels=labels, chunk_size=chunk_size).sum().backward()
        grads.append([p.grad.clone() for p in model.probes.parameters()])
    for recomputed, kept in zip(*grads):
        torch.testing.assert_close(recomputed, kept, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_probe_logprobs_ignore_padding_and_train_only_the_probes(layout):
    model = tiny_model(layout=layout)
    input_ids = random_ids()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, -2:] = 0
    logprobs = model.probe_logprobs(input_ids, attention_mask=attention_mask)
    assert torch.count_nonzero(logprobs[:, 0, -2:]) == 0
    assert torch.all(logprobs[:, 1:] < 0)
    model.requires_grad_(False)
    model.probes.requires_grad_(True)
    (-logprobs.sum() - model.probe_logprobs(input_ids).sum()).backward()
    assert all(p.grad is not None for p in model.probes.parameters())
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("probes."))


@pytest.mark.parametrize("probe_type", ["mlp", "linear"])
def test_each_probe_replica_equals_a_model_with_that_probe_alone(probe_type):
    replicas = 3
    model = tiny_model(probe_replicas=replicas, probe_type=probe_type)
    input_ids = random_ids()
    every_replica = model.probe_logprobs(input_ids, all_replicas=True)
    assert every_replica.shape == (2, replicas, BATCH, SEQ - 1)
    torch.testing.assert_close(model.probe_logprobs(input_ids), every_replica.mean(dim=1))
    assert not torch.allclose(every_replica[:, 0], every_replica[:, 1])  # each replica drew its own weights
    for replica in range(replicas):
        single = tiny_model(probe_type=probe_type)
        state = model.state_dict()
        for name, value in state.items():
            if name.startswith("probes."):
                value = value[replica::replicas]  # tower-major: probe t * replicas + r
            single.state_dict()[name].copy_(value)
        torch.testing.assert_close(single.probe_logprobs(input_ids), every_replica[:, replica])
    if probe_type == "linear":  # softmax regression: the vocabulary projection alone
        assert {name for name, _ in model.probes.named_parameters()} == {"decoder.weight", "decoder.bias"}


def test_reset_probes_draws_new_replicas_and_the_config_follows(tmp_path):
    model = tiny_model()
    backbone = {name: value.clone() for name, value in model.state_dict().items() if not name.startswith("probes.")}
    torch.manual_seed(5)
    model.reset_probes(probe_replicas=2, probe_type="linear")
    assert (model.config.probe_replicas, model.config.probe_type, model.config.num_probes) == (2, "linear", 4)
    assert model.probes.decoder.weight.shape == (4, HIDDEN, VOCAB)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, model.state_dict()[name], rtol=0, atol=0)
        if not name.startswith("probes."):
            assert torch.equal(value, backbone[name]), name
    input_ids = random_ids()
    assert torch.equal(
        reloaded.probe_logprobs(input_ids, all_replicas=True), model.probe_logprobs(input_ids, all_replicas=True)
    )
    with pytest.raises(ValueError, match="`probe_replicas` must be a positive integer"):
        model.reset_probes(probe_replicas=0)
    with pytest.raises(ValueError, match="Unknown `probe_type` 'ridge'"):
        model.reset_probes(probe_type="ridge")
    assert model.config.probe_replicas == 2 and model.config.probe_type == "linear"  # a refused reset changes nothing


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_greedy_generation_with_cache_equals_without_cache(layout):
    model = tiny_model(layout=layout)
    input_ids = random_ids(seq=5)
    with_cache = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    without_cache = model.generate(input_ids, max_new_tokens=8, do_sample=False, use_cache=False)
    assert with_cache.shape == (BATCH, 13)
    assert torch.equal(with_cache, without_cache)
    # legacy keyword still reaches the cache until transformers 5.40, with transformers' deprecation warning
    cached = model(input_ids, use_cache=True)
    with pytest.warns(FutureWarning, match="`past_key_values` is deprecated"):
        step = model(with_cache[:, 5:6], past_key_values=cached.cache)
    torch.testing.assert_close(step.logits[:, -1], model(with_cache[:, :6]).logits[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_left_padded_batch_generates_like_each_prompt_alone(layout):
    model = tiny_model(layout=layout, pad_token_id=0)
    prompts = [random_ids(1, 6, seed=4)[0].clamp(min=1), random_ids(1, 3, seed=5)[0].clamp(min=1)]
    input_ids = torch.zeros(2, 6, dtype=torch.long)
    attention_mask = torch.zeros(2, 6, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, -len(prompt) :] = prompt
        attention_mask[row, -len(prompt) :] = 1
    batched = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, do_sample=False)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], max_new_tokens=6, do_sample=False)
        assert torch.equal(batched[row, -6:], alone[0, -6:])


def test_text_generation_pipeline(gpt2_tokenizer_dir):
    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir)
    assert len(tokenizer) == 50257
    model = tiny_model(vocab_size=50304, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = generator("The towers", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    expected = model.generate(tokenizer("The towers", return_tensors="pt").input_ids, max_new_tokens=5, do_sample=False)
    assert text == tokenizer.decode(expected[0])


# ---------------------------------------------------------------- bad input


def test_bad_inputs_raise_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="Token id 99 is outside \\[0, 99\\)"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="Token id -1 is outside"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="Sequence length 33 .* exceeds max_position_embeddings=32"):
        model(torch.ones(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="`labels` has shape \\(3, 6\\) but the inputs have shape \\(3, 7\\)"):
        model(random_ids(), labels=random_ids(seq=6))
    with pytest.raises(ValueError, match="exactly one of `input_ids` or `inputs_embeds`"):
        model.model()
    with pytest.raises(ValueError, match=r"`labels` holds 99, neither a token id in \[0, 99\) nor -100"):
        model(random_ids(), labels=random_ids().masked_fill(torch.eye(BATCH, SEQ, dtype=torch.bool), 99))
    with pytest.raises(ValueError, match="`labels` holds -1, neither"):
        model(random_ids(), labels=torch.full((BATCH, SEQ), -1))
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(1, 0\), no tokens; pass at least one sequence"):
        model(torch.ones(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(0, 4\), no tokens"):
        model(torch.ones(0, 4, dtype=torch.long), labels=torch.ones(0, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(2, 3, 4\); pass token ids of shape \[batch, seq\]"):
        model(torch.ones(2, 3, 4, dtype=torch.long), labels=torch.ones(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(4,\); .*\(one sequence: `input_ids\[None\]`"):
        model.model(torch.ones(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`inputs_embeds` has shape \(4, 24\); pass embeddings of shape"):
        model(inputs_embeds=torch.zeros(4, 2 * HIDDEN))


# ---------------------------------------------------------------- saving, loading, sharing


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_save_and_load_reproduce_logits_exactly_through_auto_classes(layout, tmp_path):
    model = tiny_model(layout=layout)
    input_ids = random_ids()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_twotower.TwoTowerForCausalLM"
    assert (tmp_path / "modeling_twotower.py").exists() and (tmp_path / "configuration_twotower.py").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is TwoTowerForCausalLM and not loaded.training
    assert torch.equal(loaded(input_ids).logits, model(input_ids).logits)
    assert torch.equal(loaded.probe_logprobs(input_ids), model.probe_logprobs(input_ids))
    assert loaded.lm_head.decoder.weight is loaded.model.embed_tokens.weight
    assert type(AutoModel.from_pretrained(tmp_path)) is TwoTowerModel


def test_registration_tolerates_a_second_import():
    importlib.reload(modeling_twotower)
    fields = {k: v for k, v in tiny_config().to_diff_dict().items() if k != "model_type"}
    config = AutoConfig.for_model(TwoTowerConfig.model_type, **fields)
    assert type(AutoModelForCausalLM.from_config(config)).__name__ == "TwoTowerForCausalLM"


def test_loads_as_hub_custom_code_where_the_package_is_not_importable(tmp_path):
    # scripts/version_range.py, as CI runs it at both ends of setup.py's ranges: a tiny model of every kind and
    # objective saved here, then loaded with trust_remote_code=True in a process where the package cannot be
    # imported, and its logits, generation, probe and joint log-probabilities and ablation increases compared
    version_range = version_range_script()
    version_range.save(tmp_path / "models")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, version_range.__file__, "load", "."], cwd=tmp_path / "models", env=env, capture_output=True,
        text=True, timeout=HANG_LIMIT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    variants = version_range.variants()
    assert {fields.get("tower_type") for _, fields in variants.values()} >= set(TOWER_KINDS)  # every kind saved
    assert f"remote code: {len(variants)} of {len(variants)} variants passed" in result.stdout


def test_loading_in_bfloat16(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = TwoTowerForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    logits = model(random_ids()).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert model.probe_logprobs(random_ids()).dtype == torch.float32


def test_device_map_auto_uses_no_split_modules(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = TwoTowerForCausalLM.from_pretrained(tmp_path, device_map="auto")
    assert set(model._no_split_modules) == {"TwoTowerDecoderLayer"}  # the stack it holds (FSDP refuses others)
    assert torch.equal(model(random_ids()).logits, tiny_model()(random_ids()).logits)


@pytest.mark.parametrize("layout", ["bert", "gpt"])
def test_resize_token_embeddings_resizes_everything_sized_by_the_vocabulary(layout):
    model = tiny_model(layout=layout)
    input_ids = random_ids()
    logits = model(input_ids).logits
    probe_logits = model.probes.logits(model.probe_features(input_ids))
    model.resize_token_embeddings(VOCAB + 29, pad_to_multiple_of=64)
    assert model.config.vocab_size == 128
    assert model.model.embed_tokens.weight.shape == (128, model.config.embedding_size)
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight and model.lm_head.decoder.bias.shape == (128,)
    assert model.probes.decoder.weight.shape == (2, HIDDEN, 128)
    torch.testing.assert_close(model(input_ids).logits[..., :VOCAB], logits)
    new_probe_logits = model.probes.logits(model.probe_features(input_ids))
    torch.testing.assert_close(new_probe_logits[..., :VOCAB], probe_logits)
    model(torch.tensor([[127, 100]]))  # new ids are now in range


@pytest.mark.parametrize("cooperative", [True, False])
def test_separate_embeddings_give_each_tower_its_own_slice(cooperative, tmp_path):
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=50, max_position_embeddings=16, cooperative=cooperative,
                                        separate_embeddings=True)  # fmt: skip
    model = TwoTowerForCausalLM(config).eval()
    ids = torch.randint(0, 50, (2, 10))

    def towers_before_fusion():  # [towers, batch, seq, hidden]: the cooperative fusion norm mixes the towers
        return model.model(ids, output_tower_hidden_states=True).tower_hidden_states

    towers = towers_before_fusion()
    width = config.embedding_size // 2  # tower 0 reads columns [0, 64), tower 1 [64, 128)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, :width] += torch.randn(50, width)
        model.model.embeddings.embed_positions.weight[:, :width] += torch.randn(16, width)
    changed = towers_before_fusion()
    assert torch.equal(changed[1], towers[1]) and not torch.allclose(changed[0], towers[0], atol=1e-3)

    if not cooperative:  # the control: tower 1's loss trains nothing of tower 0's, not even the embedding
        model.train()
        tower_logprobs = model.lm_head.tower_logprobs(model.probe_features(ids))
        (-tower_logprobs[1].gather(-1, ids.unsqueeze(-1)).mean()).backward()
        assert model.model.embed_tokens.weight.grad[:, :width].abs().max() == 0
        assert model.model.embed_tokens.weight.grad[:, width:].abs().max() > 0

    model.save_pretrained(tmp_path)
    reloaded = TwoTowerForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.separate_embeddings
    torch.testing.assert_close(reloaded.probe_features(ids), model.eval().probe_features(ids))


def test_separate_embeddings_need_the_bert_layout():
    with pytest.raises(ValueError, match="separate_embeddings.*layout='gpt'"):
        TwoTowerConfig.from_preset("gpt-base", separate_embeddings=True)
