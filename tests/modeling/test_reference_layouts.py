"""
The reference code's three layouts (hezq06/twotower_lm, `ttlm/model.py` at commit 093087c): module by module,
parameter counts at the paper's sizes, initialisation, and configs saved before layouts existed.

Line numbers `model.py:N` are those of the reference's `ttlm/model.py`.
"""

import json
import logging
import math

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, GPT2Config, GPT2LMHeadModel, GPT2Model

from conftest import TINY_SIZES
from conftest import tiny_two_tower as build
from conftest import tiny_two_tower_config as tiny_config
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM

BATCH, SEQ, CELLS = 3, 7, 20
VOCAB, HIDDEN, LAYERS, HEADS, FFN = (
    TINY_SIZES[name]
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
)
REFERENCE_VOCAB = 30528  # output_size, model.py:109 / 551 / 778


def random_ids(seed=1):
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- gpt: module by module


def _gpt2_state(model, tower_idx):
    """One tower's weights under GPT2Model's names (Conv1D stores [in, out], as the batched linears do)."""
    towers = model.model
    state = {
        "wte.weight": towers.embed_tokens.weight,
        "wpe.weight": towers.embeddings.embed_positions.weight,
        "ln_f.weight": towers.towers.tower_norm.weight[tower_idx],
        "ln_f.bias": towers.towers.tower_norm.bias[tower_idx],
    }
    for i, layer in enumerate(towers.towers.layers):
        attn, mlp = layer.self_attn, layer.mlp
        pairs = {
            "ln_1": layer.input_layernorm,
            "attn.c_proj": attn.o_proj,
            "ln_2": layer.post_attention_layernorm,
            "mlp.c_fc": mlp.up_proj,
            "mlp.c_proj": mlp.down_proj,
        }
        for name, module in pairs.items():
            state[f"h.{i}.{name}.weight"] = module.weight[tower_idx]
            state[f"h.{i}.{name}.bias"] = module.bias[tower_idx]
        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        state[f"h.{i}.attn.c_attn.weight"] = torch.cat([p.weight[tower_idx] for p in qkv], dim=-1)
        state[f"h.{i}.attn.c_attn.bias"] = torch.cat([p.bias[tower_idx] for p in qkv], dim=-1)
    return state


def test_gpt_layout_is_two_gpt2_stacks_sharing_one_embedding_then_the_fusion_head():
    model = build(TwoTowerForCausalLM, layout="gpt", hidden_act="gelu_new", layer_norm_eps=1e-5)
    towers = model.model
    # model.py:746-747 shares model1's wte and wpe; no embedding norm, no per-tower projection
    assert towers.embed_tokens.weight.shape == (VOCAB, HIDDEN) and towers.embeddings.embed_positions.weight.shape == (32, HIDDEN)
    assert not hasattr(towers.embeddings, "embed_norm") and not hasattr(towers.embeddings, "tower_proj")
    assert model.lm_head.dense.weight.shape == (HIDDEN, 2 * HIDDEN)  # model.py:751, Linear(2h -> h)
    assert model.lm_head.decoder.weight is towers.embed_tokens.weight

    # The reference's modules: GPT2 stacks of GPT-2's config (model.py:784-792), wte and wpe shared.
    gpt2_config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    assert (gpt2_config.activation_function, gpt2_config.layer_norm_epsilon) == ("gelu_new", 1e-5)
    gpt2_towers = [GPT2Model(gpt2_config).eval() for _ in range(2)]
    gpt2_towers[1].wte, gpt2_towers[1].wpe = gpt2_towers[0].wte, gpt2_towers[0].wpe
    for tower_idx, gpt2 in enumerate(gpt2_towers):
        gpt2.load_state_dict({k: v.detach().clone() for k, v in _gpt2_state(model, tower_idx).items()})

    input_ids = random_ids()
    output = model(input_ids, output_tower_hidden_states=True)
    expected = torch.stack([gpt2(input_ids).last_hidden_state for gpt2 in gpt2_towers])  # after each ln_f
    torch.testing.assert_close(output.tower_hidden_states, expected, rtol=1e-5, atol=1e-5)

    # model.py:845-851: LayerNorm(2h) -> Linear(2h -> h) + GELU -> LayerNorm(h) -> wte^T + out_bias
    eps = model.config.layer_norm_eps
    concat = torch.cat(list(expected), dim=-1)
    fused = F.layer_norm(concat, (2 * HIDDEN,), towers.fusion.norm.weight, towers.fusion.norm.bias, eps)
    fused = F.gelu(F.linear(fused, model.lm_head.dense.weight, model.lm_head.dense.bias), approximate="tanh")
    fused = F.layer_norm(fused, (HIDDEN,), model.lm_head.norm.weight, model.lm_head.norm.bias, eps)
    logits = F.linear(fused, towers.embed_tokens.weight) + model.lm_head.decoder.bias
    torch.testing.assert_close(output.logits, logits, rtol=1e-5, atol=1e-5)


def test_gpt_towers_draw_their_own_embedding_dropout():
    # Each reference tower is a GPT2Model with its own dropout on the shared embedding (GPT2Model.forward: self.drop)
    model = build(TwoTowerForCausalLM, layout="gpt", hidden_dropout=0.5).train()
    tower_inputs = []
    model.model.towers.layers[0].register_forward_pre_hook(lambda module, args: tower_inputs.append(args[0]))
    input_ids = random_ids()
    model(input_ids)
    embeddings = model.model.embed_tokens(input_ids) + model.model.embeddings.embed_positions(torch.arange(SEQ))
    kept = tower_inputs[0] != 0  # [towers, batch, seq, hidden]
    for tower_idx in range(2):
        torch.testing.assert_close(tower_inputs[0][tower_idx], embeddings * 2 * kept[tower_idx])
    assert not torch.equal(kept[0], kept[1])


# ---------------------------------------------------------------- elmo: module by module


def _reference_elmo_features(model, input_ids, start_id):
    """TwoTowerELMo.forward_tt (model.py:591-633) in eval mode, on this model's weights."""
    towers, elmo = model.model, model.model.towers
    embedding = towers.embed_tokens.weight
    start = torch.full((input_ids.shape[0], 1), start_id)  # the reference pads with [PAD], id 0 (596-601)
    inputs_forward = torch.cat([start, input_ids[:, :-1]], dim=1)
    inputs_backward = torch.cat([start, input_ids.flip(1)[:, :-1]], dim=1)
    size, eps = (embedding.shape[1],), model.config.layer_norm_eps
    streams = (
        F.layer_norm(embedding[inputs_forward], size, elmo.forward_norm.weight, elmo.forward_norm.bias, eps),
        F.layer_norm(embedding[inputs_backward], size, elmo.backward_norm.weight, elmo.backward_norm.bias, eps),
    )
    outputs = []  # [output_f1, output_b1, output_f2, output_b2] (630)
    for tower_idx in range(2):
        emb = elmo.tower_proj[tower_idx]  # emb1 / emb2, shared by both directions (611-614)
        lstms = (elmo.forward_lstms[tower_idx], elmo.backward_lstms[tower_idx])
        h2o = (elmo.forward_out_proj[tower_idx], elmo.backward_out_proj[tower_idx])
        for direction in range(2):
            cells, _ = lstms[direction](F.linear(streams[direction], emb.weight, emb.bias))
            out = F.linear(cells, h2o[direction].weight, h2o[direction].bias)
            outputs.append(out.flip(1) if direction else out)  # flip_seq (586-589)
    concat = torch.cat(outputs, dim=-1)
    return F.layer_norm(concat, (concat.shape[-1],), towers.fusion.norm.weight, towers.fusion.norm.bias, eps)


@pytest.mark.parametrize("pad_token_id", [None, 5])
def test_elmo_layout_computes_the_reference_forward(pad_token_id):
    model = build(TwoTowerForMaskedLM, layout="elmo", lstm_hidden_size=CELLS, pad_token_id=pad_token_id)
    elmo = model.model.towers
    assert model.config.embedding_size == HIDDEN  # 2 * model_size wide (model.py:507) with model_size = HIDDEN // 2
    assert not hasattr(model.model.embeddings, "embed_positions")
    lstm = elmo.forward_lstms[0]  # model.py:515: LSTM(model_size, cells, num_layers), no projection
    assert (lstm.input_size, lstm.hidden_size, lstm.num_layers, lstm.proj_size) == (HIDDEN // 2, CELLS, LAYERS, 0)
    assert elmo.forward_out_proj[0].weight.shape == (HIDDEN // 2, CELLS)  # h2o_f1 (519)
    assert model.lm_head.dense.weight.shape == (HIDDEN, 2 * HIDDEN)  # dense_act, Linear(4 m -> 2 m) (531)
    # the probe reads its tower's 2 m = HIDDEN features and maps them to m (537-541)
    assert model.probes.dense.weight.shape == (2, HIDDEN, HIDDEN // 2)
    assert model.probes.decoder.weight.shape == (2, HIDDEN // 2, VOCAB)

    input_ids = random_ids()
    features = _reference_elmo_features(model, input_ids, 0 if pad_token_id is None else pad_token_id)
    torch.testing.assert_close(model.model(input_ids).last_hidden_state, features, rtol=1e-5, atol=1e-5)
    # model.py:650-654
    eps = model.config.layer_norm_eps
    fused = F.gelu(F.linear(features, model.lm_head.dense.weight, model.lm_head.dense.bias))
    fused = F.layer_norm(fused, (HIDDEN,), model.lm_head.norm.weight, model.lm_head.norm.bias, eps)
    logits = F.linear(fused, model.model.embed_tokens.weight) + model.lm_head.decoder.bias
    torch.testing.assert_close(model(input_ids).logits, logits, rtol=1e-5, atol=1e-5)


def test_elmo_towers_share_nothing_after_the_embedding():
    model = build(TwoTowerForMaskedLM, layout="elmo", lstm_hidden_size=CELLS, cooperative=False)
    input_ids = random_ids()

    def towers_and_probe_features():
        output = model.model(input_ids, output_tower_hidden_states=True)
        return output.tower_hidden_states, model.probe_features(input_ids)

    before = towers_and_probe_features()
    with torch.no_grad():
        model.model.towers.backward_lstms[1].bias_hh_l1 += 1.0
    for before_states, after_states in zip(before, towers_and_probe_features()):
        torch.testing.assert_close(after_states[0], before_states[0], rtol=0, atol=0)
        assert not torch.allclose(after_states[1], before_states[1])


# ---------------------------------------------------------------- parameter counts at the paper's sizes


def _deepspeed_layer(h, ffn):
    # DeepSpeedTransformerLayer.__init__ (deepspeed/ops/transformer/transformer.py): attn_qkvw/b, attn_ow/b,
    # attn_nw/nb (pre-LN), inter_w/b, output_w/b, norm_w/nb
    return (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (ffn * h + ffn) + (h * ffn + h) + 2 * h


def _reference_bert(h, layers, ffn, positions=512):
    """TwoTowerDsBert in phase1_mlm (tower_num 2), model.py:50-77; max_seq_length defaults to 512 (120)."""
    return (
        2 * layers * _deepspeed_layer(h, ffn)  # trf_layers1, trf_layers2 (50-58)
        + REFERENCE_VOCAB * 2 * h  # pt_emb (60)
        + 2 * (2 * h * h + h)  # emb1, emb2 (62-63)
        + REFERENCE_VOCAB  # out_bias (65)
        + positions * 2 * h  # position_embeddings (69)
        + 2 * (2 * h)  # layer_norm_emb (71)
        + 2 * (2 * h)  # layer_norm_final (74)
        + (2 * h * 2 * h + 2 * h)  # dense_act (75)
        + 2 * (2 * h)  # layer_norm_trans (77)
    )


def _gpt2_block(h):
    # GPT2Block: ln_1, attn.c_attn (qkv), attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj; n_inner None = 4 h
    return 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h)


def _reference_gpt(h, layers):
    """TwoTowerGPT in phase1_mlm, model.py:742-753, GPT-2 config with n_positions = window_size 128 (784-792)."""
    return (
        REFERENCE_VOCAB * h + 128 * h  # model1's wte and wpe, which model2 shares (746-747)
        + 2 * (layers * _gpt2_block(h) + 2 * h)  # model1 and model2: blocks and ln_f (743-744)
        + REFERENCE_VOCAB  # out_bias (748)
        + 2 * (2 * h)  # layer_norm_final (750)
        + (2 * h * h + h)  # dense_act (751)
        + 2 * h  # layer_norm_trans (753)
    )


def _lstm(input_size, cells, layers):
    # nn.LSTM: per layer weight_ih [4 cells, in], weight_hh [4 cells, cells], bias_ih, bias_hh
    return sum(4 * cells * (input_size if i == 0 else cells) + 4 * cells * cells + 8 * cells for i in range(layers))


def _reference_elmo(model_size, cells, layers=2):
    """TwoTowerELMo in phase1_mlm, model.py:507-533 (model_size 256, num_hidden_layers 2: 562-563)."""
    m = model_size
    return (
        REFERENCE_VOCAB * 2 * m  # pt_emb (507)
        + 2 * (2 * m * m + m)  # emb1, emb2 (509-510)
        + REFERENCE_VOCAB  # out_bias (511)
        + 2 * (2 * (2 * m))  # layer_norm_embf, layer_norm_embb (512-513)
        + 4 * _lstm(m, cells, layers)  # lstm_forward1/backward1/forward2/backward2 (515-525)
        + 4 * (cells * m + m)  # h2o_f1, h2o_b1, h2o_f2, h2o_b2 (519-527)
        + 2 * (4 * m)  # layer_norm_final (530)
        + (4 * m * 2 * m + 2 * m)  # dense_act (531)
        + 2 * (2 * m)  # layer_norm_trans (533)
    )


def _reference_probes(width, inner):
    """Phase-2/3 probes, one per tower: dense_act1 + layer_norm_trans1 + outnet1 (81-85, 537-541, 757-761)."""
    return 2 * ((width * inner + inner) + 2 * inner + (inner * REFERENCE_VOCAB + REFERENCE_VOCAB))


def _joint_and_probe_parameters(model_class, preset):
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = model_class(TwoTowerConfig.from_preset(preset))
    probes = sum(p.numel() for p in model.probes.parameters())
    return sum(p.numel() for p in model.parameters()) - probes, probes


@pytest.mark.parametrize(
    "preset, h, layers, ffn, joint, probes",
    [("base", 384, 12, 1536, 67_347_264, 23_803_776), ("large", 512, 24, 2048, 184_842_048, 31_849_088)],
)
def test_bert_parameters_equal_the_reference_but_its_unused_positions(preset, h, layers, ffn, joint, probes):
    # The reference's 512 position rows (model.py:120) serve 128-token windows: rows 128-511 are never read.
    unused_positions = (512 - 128) * 2 * h
    assert _joint_and_probe_parameters(TwoTowerForMaskedLM, preset) == (joint, probes)
    assert joint == _reference_bert(h, layers, ffn) - unused_positions
    assert probes == _reference_probes(h, h)


@pytest.mark.parametrize(
    "preset, h, layers, heads, joint, probes",
    [("gpt-base", 384, 12, 12, 54_688_704, 23_803_776), ("gpt-large", 512, 24, 16, 167_570_752, 31_849_088)],
)
def test_gpt_parameters_equal_the_reference(preset, h, layers, heads, joint, probes):
    assert _joint_and_probe_parameters(TwoTowerForCausalLM, preset) == (joint, probes)
    assert joint == _reference_gpt(h, layers)
    assert probes == _reference_probes(h, h)
    # The same count from transformers' GPT-2 modules, shared as model.py:746-747 shares them. model2's lm_head
    # keeps the wte it was tied to before the swap: a vocabulary-sized matrix that only the discarded loss_all2
    # reads (835-836), so it is no part of the model's output and has no counterpart here.
    gpt2_config = GPT2Config(vocab_size=REFERENCE_VOCAB, n_positions=128, n_embd=h, n_layer=layers, n_head=heads)
    with torch.device("meta"):
        model1, model2 = GPT2LMHeadModel(gpt2_config), GPT2LMHeadModel(gpt2_config)
    model2.transformer.wte, model2.transformer.wpe = model1.transformer.wte, model1.transformer.wpe
    unique = {id(p): p.numel() for p in [*model1.parameters(), *model2.parameters()]}
    fusion_head = REFERENCE_VOCAB + 2 * (2 * h) + (2 * h * h + h) + 2 * h
    orphaned_lm_head = REFERENCE_VOCAB * h
    assert sum(unique.values()) == joint - fusion_head + orphaned_lm_head


@pytest.mark.parametrize(
    "preset, cells, joint, probes",
    [("elmo-base", 2048, 228_397_888, 15_955_072), ("elmo-large", 4096, 842_994_496, 15_955_072)],
)
def test_elmo_parameters_equal_the_reference(preset, cells, joint, probes):
    assert _joint_and_probe_parameters(TwoTowerForMaskedLM, preset) == (joint, probes)
    assert joint == _reference_elmo(256, cells)
    assert probes == _reference_probes(512, 256)


# ---------------------------------------------------------------- initialisation

INIT_FIELDS = dict(
    vocab_size=2048, hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=512,
    max_position_embeddings=512,
)  # fmt: skip


def assert_normal(tensor, std):
    torch.testing.assert_close(tensor.float().std().item(), std, rtol=0.03, atol=0)
    assert tensor.abs().max() > 2.5 * std  # a normal's tail, which a uniform of that std (bound 1.73 std) lacks


def assert_uniform(tensor, bound):
    assert tensor.abs().max() <= bound and tensor.abs().max() > 0.9 * bound
    if tensor.numel() >= 10_000:
        torch.testing.assert_close(tensor.float().std().item(), bound / math.sqrt(3), rtol=0.03, atol=0)


def assert_ones_and_zeros(norm):
    assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)


def torch_linear_bound(in_features):
    return 1 / math.sqrt(in_features)


def assert_transformer_blocks(towers, std=0.02):
    residual_std = std / math.sqrt(2 * INIT_FIELDS["num_hidden_layers"])  # 1/sqrt(2 L)
    for layer in towers.towers.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for projection, expected in [
            (attn.q_proj, std), (attn.k_proj, std), (attn.v_proj, std), (attn.o_proj, residual_std),
            (mlp.up_proj, std), (mlp.down_proj, residual_std),
        ]:  # fmt: skip
            assert_normal(projection.weight, expected)
            assert torch.count_nonzero(projection.bias) == 0
        assert_ones_and_zeros(layer.input_layernorm)
        assert_ones_and_zeros(layer.post_attention_layernorm)


def assert_torch_default_head(model):
    """Fusion Linear and probes: nn.Linear's own U(+-1/sqrt(fan_in)); the tied decoder's output bias 0."""
    fusion = model.lm_head.dense
    assert_uniform(fusion.weight, torch_linear_bound(fusion.in_features))
    assert_uniform(fusion.bias, torch_linear_bound(fusion.in_features))
    assert torch.count_nonzero(model.lm_head.decoder.bias) == 0
    for linear in (model.probes.dense, model.probes.decoder):
        assert_uniform(linear.weight, torch_linear_bound(linear.weight.shape[1]))
        assert_uniform(linear.bias, torch_linear_bound(linear.weight.shape[1]))
    assert_ones_and_zeros(model.model.fusion.norm)
    assert_ones_and_zeros(model.lm_head.norm)


def test_bert_reference_initialisation_is_deepspeeds_kernel_and_the_reference_model():
    torch.manual_seed(0)
    model = TwoTowerForMaskedLM(TwoTowerConfig(initialization="reference", **INIT_FIELDS))
    towers = model.model
    assert_uniform(towers.embed_tokens.weight, 0.02)  # pt_emb.weight.data.uniform_(-0.02, 0.02), model.py:61
    assert_uniform(towers.embeddings.embed_positions.weight, 0.02)  # model.py:70
    assert_ones_and_zeros(towers.embeddings.embed_norm)
    assert_uniform(towers.embeddings.tower_proj.weight, torch_linear_bound(512))  # emb1/emb2 are plain nn.Linear (62-63)
    assert_uniform(towers.embeddings.tower_proj.bias, torch_linear_bound(512))
    assert_transformer_blocks(towers)  # DeepSpeedTransformerLayer.init_transformer_weights, adjust_init_range
    assert_torch_default_head(model)


def test_gpt_reference_initialisation_is_gpt2s_and_the_reference_model():
    torch.manual_seed(0)
    model = TwoTowerForCausalLM(TwoTowerConfig(layout="gpt", initialization="reference", **INIT_FIELDS))
    towers = model.model
    assert_normal(towers.embed_tokens.weight, 0.02)  # GPT2PreTrainedModel._init_weights
    assert_normal(towers.embeddings.embed_positions.weight, 0.02)
    assert_transformer_blocks(towers)  # c_proj of attention and MLP: 0.02 / sqrt(2 n_layer)
    assert_ones_and_zeros(towers.towers.tower_norm)
    assert_torch_default_head(model)


def test_elmo_reference_initialisation_is_the_reference_models():
    torch.manual_seed(0)
    config = TwoTowerConfig(layout="elmo", lstm_hidden_size=256, initialization="reference", **INIT_FIELDS)
    model = TwoTowerForMaskedLM(config)
    elmo = model.model.towers
    assert_uniform(model.model.embed_tokens.weight, 0.02)  # model.py:508
    assert_ones_and_zeros(elmo.forward_norm)
    assert_ones_and_zeros(elmo.backward_norm)
    for linear in (*elmo.tower_proj, *elmo.forward_out_proj, *elmo.backward_out_proj):
        assert_uniform(linear.weight, torch_linear_bound(linear.in_features))
        assert_uniform(linear.bias, torch_linear_bound(linear.in_features))
    for lstm in (*elmo.forward_lstms, *elmo.backward_lstms):  # nn.LSTM's own U(+-1/sqrt(cells))
        for param in lstm.parameters():
            assert_uniform(param, 1 / math.sqrt(256))
    assert_torch_default_head(model)


def test_normal_initialisation_is_n_0_002_for_every_weight_and_is_the_default():
    torch.manual_seed(0)
    model = TwoTowerForCausalLM(TwoTowerConfig(**INIT_FIELDS))
    assert model.config.initialization == "normal" and TwoTowerConfig.from_preset("tiny").initialization == "normal"
    towers = model.model
    for weight in (towers.embed_tokens.weight, towers.embeddings.embed_positions.weight, towers.embeddings.tower_proj.weight):
        assert_normal(weight, 0.02)
    for layer in towers.towers.layers:
        for projection in (layer.self_attn.o_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            assert_normal(projection.weight, 0.02)
            assert torch.count_nonzero(projection.bias) == 0
    for linear in (model.lm_head.dense, model.probes.dense, model.probes.decoder):
        assert_normal(linear.weight, 0.02)
        assert torch.count_nonzero(linear.bias) == 0


def test_reset_probes_draws_them_as_the_initialisation_says():
    model = build(TwoTowerForCausalLM, layout="gpt", initialization="reference", vocab_size=4096)
    torch.manual_seed(3)
    probes = model.reset_probes(probe_replicas=2)
    assert_uniform(probes.decoder.weight, torch_linear_bound(HIDDEN))


# ---------------------------------------------------------------- configs saved before layouts existed


@pytest.mark.parametrize(
    "model_class, auto_class, fields",
    [
        (TwoTowerForCausalLM, AutoModelForCausalLM, {}),
        (TwoTowerForMaskedLM, AutoModelForMaskedLM, dict(tower_type="lstm", lstm_hidden_size=CELLS)),
    ],
    ids=["causal", "masked-lstm"],
)
def test_configs_without_layout_load_as_the_bert_layout_with_identical_logits(
    model_class, auto_class, fields, tmp_path, caplog
):
    model = build(model_class, **fields)
    model.save_pretrained(tmp_path)
    config_path = tmp_path / "config.json"
    saved = json.loads(config_path.read_text())
    assert saved["layout"] == "bert"
    for new_field in ("layout", "initialization"):  # what a config written before layouts lacks
        del saved[new_field]
    config_path.write_text(json.dumps(saved))

    with caplog.at_level(logging.WARNING):
        loaded = auto_class.from_pretrained(tmp_path)
    assert "no `layout` field" in caplog.text and "loads as layout='bert'" in caplog.text
    assert loaded.config.layout == "bert" and loaded.config.tower_type == model.config.tower_type
    input_ids = random_ids()
    assert torch.equal(loaded(input_ids).logits, model(input_ids).logits)

    saved["layout"] = "mamba"
    config_path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"Unknown `layout` 'mamba'; use one of \['bert', 'gpt', 'elmo'\]"):
        auto_class.from_pretrained(tmp_path)
