"""
The tower-kind contract, checked for every registered kind the way transformers' ModelTesterMixin and fla's shared
model tests run one suite over every model: each kind (modeling_twotower/towers.py, TOWER_KINDS) x layout it builds
x objective (causal, masked) it builds x initialisation (normal, reference), at tiny odd sizes, builds; trains;
reads the tokens it declares; saves and reloads bit for bit and as Hub custom code without the package; generates;
takes a probe-phase step; scores; describes itself on the model card in its own words only; and counts its FLOPs as
torch does. The paper-sized presets of each (kind, layout, objective) build and initialise on the meta device.
The parameters come from the registry, so a kind is tested by registering it (`test_the_suite_covers_every_kind`).
"""

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import PreTrainedTokenizerFast

from conftest import HANG_LIMIT_S, tiny_two_tower, tiny_two_tower_config
from modeling_twotower import PRESETS, TwoTowerCheckpointError, TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.configuration_twotower import INITIALIZATIONS, LAYOUTS
from modeling_twotower.dropout import Dropout
from modeling_twotower.tower_stack import TowerStack
from modeling_twotower.towers import TOWER_KINDS, tower_stack_class
from twotower.evaluation.publishing.model_card import card_tower_name, render_model_card
from twotower.evaluation.scoring.engine import score_blocks, scoring_passes
from twotower.training.arguments import TwoTowerTrainingConfig, save_config
from twotower.training.data.objectives import needs_masking
from twotower.training.phases import make_phase
from twotower.training.launch.throughput import flops_per_token

REPOSITORY = Path(__file__).resolve().parents[2]
MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}
BIDIRECTIONAL = {"causal": False, "masked": True}
VOCAB, BATCH, SEQ = 99, 3, 10  # the tiny model's other sizes: conftest.TINY_SIZES
MASK_TOKEN_ID, MASK_PASSES = 3, 4
CHANGED = 5  # the position whose token the reading test changes
FLOPS_SEQ = 30  # long enough that a stack's extra FLOPs (attention: 12 * layers * width * context) stand out

# (tower_type, layout, objective) of every stack the registry builds: each kind in each of its layouts, in each
# direction that layout's stack has (the ELMo layout: masked only)
COMBINATIONS = [
    (tower_type, layout, objective)
    for tower_type, kind in TOWER_KINDS.items()
    for layout in kind.layouts
    for objective, bidirectional in BIDIRECTIONAL.items()
    if bidirectional in kind.stack_class(layout).directions
]
CASES = [
    pytest.param(tower_type, layout, objective, initialization, id=f"{tower_type}-{layout}-{objective}-{initialization}")
    for tower_type, layout, objective in COMBINATIONS
    for initialization in INITIALIZATIONS
]  # fmt: skip
CAUSAL_CASES = [case for case in CASES if case.values[2] == "causal"]
# the paper-sized presets of each layout: base and large (gpt-*, elmo-* in those layouts)
LAYOUT_PRESETS = {
    layout: [name for name, preset in PRESETS.items() if name != "tiny" and preset.get("layout", "bert") == layout]
    for layout in LAYOUTS
}
PRESET_CASES = [
    pytest.param(tower_type, layout, objective, preset, id=f"{tower_type}-{layout}-{objective}-{preset}")
    for tower_type, layout, objective in COMBINATIONS
    for preset in LAYOUT_PRESETS[layout]
]


def case_id(tower_type, layout, objective, initialization) -> str:
    return f"{tower_type}-{layout}-{objective}-{initialization}"


def build(tower_type, layout, objective, initialization, seed=0):
    """The case's tiny model in eval mode (conftest's odd sizes), dropout off so that training steps compare."""
    return tiny_two_tower(
        MODEL_CLASSES[objective], seed, tower_type=tower_type, layout=layout, initialization=initialization,
        hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip


def random_ids(seed=1):
    # ids from 4 up: none is the mask token
    return torch.randint(4, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def changed_at(input_ids, position):
    changed = input_ids.clone()
    changed[:, position] = 4 + (changed[:, position] - 3) % (VOCAB - 4)
    return changed


def kind_stacks(tower_type) -> list[type[TowerStack]]:
    kind = TOWER_KINDS[tower_type]
    return [kind.stack_class(layout) for layout in kind.layouts]


# The registry and the suite


def test_the_suite_covers_every_kind():
    # every TowerStack a towers_*.py module defines is a registered kind's stack in some layout, every layout has a
    # kind, and the suite runs every (stack, direction) the registry builds
    for path in sorted((REPOSITORY / "modeling_twotower").glob("towers_*.py")):
        importlib.import_module(f"modeling_twotower.{path.stem}")
    defined = {stack for stack in TowerStack.__subclasses__() if stack.__module__.startswith("modeling_twotower.")}
    registered = {stack for tower_type in TOWER_KINDS for stack in kind_stacks(tower_type)}
    assert defined == registered and len(defined) >= 4
    tested = {(TOWER_KINDS[t].stack_class(layout), BIDIRECTIONAL[objective]) for t, layout, objective in COMBINATIONS}
    assert tested == {(stack, direction) for stack in registered for direction in stack.directions}
    assert {layout for kind in TOWER_KINDS.values() for layout in kind.layouts} == set(LAYOUTS)
    assert {case.values[3] for case in CASES} == {"normal", "reference"}
    assert TwoTowerConfig.from_preset("tiny", tower_type="ssm").tower_type == "ssm"
    with pytest.raises(ValueError, match=rf"Unknown `tower_type` 'gru'; use one of \{list(TOWER_KINDS)}"):
        TwoTowerConfig(tower_type="gru")


def test_only_the_registry_and_the_config_test_the_tower_type():
    # a kind's facts are read from its stack; nothing else compares `tower_type` to a kind's name, templates included
    name = r"['\"][a-z]+['\"]"
    comparison = re.compile(rf"tower_type\W{{0,3}}\s*(==|!=|(not )?in)\s*[(\[{{]?\s*{name}|{name}\s*(==|!=)\s*\S*tower_type")
    allowed = {"modeling_twotower/towers.py", "modeling_twotower/configuration_twotower.py"}
    files = [REPOSITORY / "model_card.md"]
    for folder in ("modeling_twotower", "training", "evaluation", "scripts", "benchmarks"):
        files += [path for path in (REPOSITORY / folder).rglob("*") if path.suffix in (".py", ".j2", ".md", ".html")]
    offending = [
        f"{path.relative_to(REPOSITORY)}:{number}"
        for path in files if str(path.relative_to(REPOSITORY)) not in allowed
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if comparison.search(line)
    ]  # fmt: skip
    assert offending == []


# Every kind x layout x objective x initialisation


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_builds_the_declared_stack(tower_type, layout, objective, initialization):
    config = tiny_two_tower_config(tower_type=tower_type, layout=layout, initialization=initialization)
    before = config.to_dict()
    model = MODEL_CLASSES[objective](config)
    assert config.to_dict() == before  # the constructor leaves the config as it was
    towers, stack = model.model.towers, tower_stack_class(config)
    assert type(towers) is stack and towers.tower_type == tower_type and model.model.bidirectional is (
        objective == "masked"
    )
    assert set(model._no_split_modules) == {stack.no_split_module}  # a class the model holds
    assert stack.no_split_module in {type(module).__name__ for module in model.modules()}
    assert config.use_cache is stack.has_cache
    assert all(param.isfinite().all() for param in model.parameters())
    # dropout that torch.compile draws on the CPU as eager code does (tests/modeling/test_dropout.py), none plain
    assert all(type(module) is Dropout for module in model.modules() if isinstance(module, torch.nn.Dropout))


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_forward_loss_and_backward_train_every_weight(tower_type, layout, objective, initialization):
    model, input_ids = build(tower_type, layout, objective, initialization).train(), random_ids()
    output = model(input_ids, labels=input_ids, output_tower_hidden_states=True)
    assert output.logits.shape == (BATCH, SEQ, VOCAB)
    assert output.tower_hidden_states.shape == (2, BATCH, SEQ, 12)
    predicted = SEQ - model.target_shift
    with torch.no_grad():
        assert model.probe_logprobs(input_ids, labels=input_ids).shape == (2, BATCH, predicted)
        assert model.joint_logprobs(input_ids, labels=input_ids).shape == (BATCH, predicted)
    output.loss.backward()
    untrained = {name for name, param in model.named_parameters() if param.grad is None}
    assert untrained and all(name.startswith("probes.") for name in untrained)  # the probes train in their phase
    # and the loss falls over a few steps (an untrained model starts near the uniform log(vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert abs(losses[0] - torch.log(torch.tensor(VOCAB)).item()) < 0.5
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_the_towers_read_the_tokens_they_declare(tower_type, layout, objective, initialization):
    # causal: position t reads tokens <= t only; bidirectional: every token, and token t itself only where the stack
    # declares that it sees the token it predicts (then the masked objective must hide it: needs_masking)
    model, input_ids = build(tower_type, layout, objective, initialization), random_ids()
    towers = model.model.towers
    with torch.no_grad():
        before, after = model(input_ids).logits, model(changed_at(input_ids, CHANGED)).logits
    differs = [not torch.equal(before[:, position], after[:, position]) for position in range(SEQ)]
    if objective == "causal":
        assert differs == [position >= CHANGED for position in range(SEQ)]
    else:
        assert differs == [position != CHANGED or towers.sees_predicted_token for position in range(SEQ)]
        assert needs_masking(objective, towers) is towers.sees_predicted_token


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_save_and_load_round_trip_bit_for_bit(tower_type, layout, objective, initialization, tmp_path):
    model, input_ids = build(tower_type, layout, objective, initialization), random_ids()
    model.save_pretrained(tmp_path)
    loaded = MODEL_CLASSES[objective].from_pretrained(tmp_path)
    assert not loaded.training and loaded.config.to_diff_dict() == model.config.to_diff_dict()
    saved, reloaded = model.state_dict(), loaded.state_dict()
    assert saved.keys() == reloaded.keys() and all(torch.equal(saved[name], reloaded[name]) for name in saved)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids).logits, model(input_ids).logits)
        assert torch.equal(loaded.probe_logprobs(input_ids, labels=input_ids),
                           model.probe_logprobs(input_ids, labels=input_ids))  # fmt: skip


@pytest.mark.parametrize("tower_type, layout, objective", COMBINATIONS, ids=["-".join(case) for case in COMBINATIONS])
def test_an_edited_size_field_is_named_when_the_model_loads(tower_type, layout, objective, tmp_path):
    # each size field the kind declares, doubled in config.json: loading refuses the weights and names the field
    # with the value they were saved with (the initialisation draws no size: normal only)
    model = build(tower_type, layout, objective, "normal")
    model.save_pretrained(tmp_path)
    saved_config = json.loads((tmp_path / "config.json").read_text())
    for field in tower_stack_class(model.config).size_fields:
        edited = {**saved_config, field: 2 * saved_config[field]}
        (tmp_path / "config.json").write_text(json.dumps(edited))
        message = rf"sets `{field}` to {edited[field]}, but its weights were saved with {saved_config[field]}:"
        with pytest.raises(TwoTowerCheckpointError, match=message):
            MODEL_CLASSES[objective].from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def remote_code_results(tmp_path_factory):
    """Every case saved, then loaded in one process where the package cannot be imported, by the Auto classes with
    trust_remote_code=True: {case id: "ok" or what differed}."""
    folder = tmp_path_factory.mktemp("remote_code")
    input_ids, expected = random_ids(), {}
    for case in CASES:
        model, name = build(*case.values), case_id(*case.values)
        model.save_pretrained(folder / name)
        assert (folder / name / "towers.py").is_file() and (folder / name / "tower_stack.py").is_file()
        with torch.no_grad():
            expected[name] = {"objective": case.values[2], "logits": model(input_ids).logits,
                              "probes": model.probe_logprobs(input_ids, labels=input_ids)}  # fmt: skip
    torch.save({"input_ids": input_ids, "models": expected}, folder / "expected.pt")
    script = textwrap.dedent(
        """
        import json
        import sys
        sys.modules["modeling_twotower"] = None  # the package must not be importable here
        sys.modules["twotower"] = None
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
        expected = torch.load("expected.pt")
        input_ids, results = expected["input_ids"], {}
        for name, outputs in expected["models"].items():
            auto_class = AutoModelForCausalLM if outputs["objective"] == "causal" else AutoModelForMaskedLM
            model = auto_class.from_pretrained(name, trust_remote_code=True)
            with torch.no_grad():
                checks = {
                    "remote code": type(model.model.towers).__module__.startswith("transformers_modules"),
                    "logits": torch.equal(model(input_ids).logits, outputs["logits"]),
                    "probes": torch.equal(model.probe_logprobs(input_ids, labels=input_ids), outputs["probes"]),
                }
            results[name] = "ok" if all(checks.values()) else f"differs: {checks}"
        print(json.dumps(results))
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(folder / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_loads_as_hub_custom_code_without_the_package(tower_type, layout, objective, initialization,
                                                      remote_code_results):  # fmt: skip
    assert remote_code_results[case_id(tower_type, layout, objective, initialization)] == "ok"


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CAUSAL_CASES)
def test_generation_equals_greedy_decoding_with_the_declared_cache(tower_type, layout, objective, initialization):
    model, prompt = build(tower_type, layout, objective, initialization), random_ids()[:1, :4]
    expected = prompt
    with torch.no_grad():
        for _ in range(5):  # independently: the argmax of the last position, the whole prefix each time
            expected = torch.cat([expected, model(expected).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(model.generate(prompt, max_new_tokens=5, do_sample=False), expected)
    towers = model.model.towers
    if towers.has_cache:  # the default generation above used the cache; without it, the same tokens
        assert torch.equal(model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False), expected)
    else:
        with pytest.raises(ValueError, match=f"does not apply to {towers.kind_name} towers"):
            model(prompt, use_cache=True)


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_one_probe_phase_step_trains_the_probes_only(tower_type, layout, objective, initialization, tmp_path):
    model, input_ids = build(tower_type, layout, objective, initialization), random_ids()
    frozen = {name: tensor.clone() for name, tensor in model.state_dict().items() if not name.startswith("probes.")}
    phase = make_phase(TwoTowerTrainingConfig(phase="probe", pretrained_model="unused", output_dir=str(tmp_path),
                                              learning_rate=1e-2))  # fmt: skip
    trained = phase.trained_module(model, torch.device("cpu"))
    optimizer = phase.make_optimizer(trained)
    inputs, labels = next(scoring_passes(input_ids, objective, model.model.towers, MASK_PASSES, MASK_TOKEN_ID))
    with torch.no_grad():
        features, targets = model.scored_features(model.probe_features(inputs), labels)  # [towers, n, hidden], [n]
        gold_logprobs = model.probe_logprobs(inputs, labels=labels)  # [towers, batch, seq]: 0 where unlabelled
    batch, num_items = {"features": features, "targets": targets}, targets.numel()
    loss = phase.loss_function(trained)(batch, num_items)
    # the phase's loss: each probe's mean NLL of the scored targets, summed over the probes
    torch.testing.assert_close(loss, -gold_logprobs.sum() / num_items, rtol=1e-5, atol=1e-5)
    loss.backward()
    optimizer.step()
    assert phase.loss_function(trained)(batch, num_items) < loss
    assert all(torch.equal(tensor, frozen[name]) for name, tensor in model.state_dict().items() if name in frozen)


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_one_scoring_pass_is_the_models_own_loss(tower_type, layout, objective, initialization):
    model, input_ids = build(tower_type, layout, objective, initialization), random_ids()
    scores = score_blocks(model, [{"input_ids": input_ids}], mask_passes=MASK_PASSES, mask_token_id=MASK_TOKEN_ID,
                          disable_tqdm=True)  # fmt: skip
    nll_sum, num_targets, probe_nll_sums = 0.0, 0, 0.0
    with torch.no_grad():
        for inputs, labels in scoring_passes(input_ids, objective, model.model.towers, MASK_PASSES, MASK_TOKEN_ID):
            count = int((labels[:, model.target_shift :] != -100).sum())
            nll_sum += model(input_ids=inputs, labels=labels).loss.item() * count
            num_targets += count
            probe_nll_sums -= model.probe_logprobs(inputs, labels=labels).sum((1, 2))
    assert scores.num_targets == num_targets == BATCH * (SEQ - model.target_shift)  # every token scored once
    assert scores.joint_mean_nll == pytest.approx(nll_sum / num_targets, rel=1e-5)
    torch.testing.assert_close(torch.as_tensor(scores.probe_nll_sums[0]), probe_nll_sums.double(), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """A word-level tokenizer of the tiny vocabulary, with the special tokens either objective needs."""
    words = ["[UNK]", "[PAD]", "[EOS]", "[MASK]"] + [f"w{index}" for index in range(4, VOCAB)]
    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, "[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token="[EOS]", mask_token="[MASK]")  # fmt: skip
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


def card_words(stack: type[TowerStack], config) -> list[str]:
    """What names a stack on the card: its kind, its towers in either direction, its own size rows."""
    return [
        rf"\b{re.escape(stack.kind_name)}\b",
        *(re.escape(name) for name in stack.card_names.values()),
        *(re.escape(stack.card_architecture(config, direction)) for direction in stack.directions),
        *(re.escape(f"| {label} |") for label, _ in stack.card_size_rows),
    ]


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_the_model_card_names_the_kind_in_its_own_words_only(tower_type, layout, objective, initialization,
                                                             tokenizer_folder, tmp_path):  # fmt: skip
    model = build(tower_type, layout, objective, initialization)
    model.save_pretrained(tmp_path)
    for path in tokenizer_folder.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    run = TwoTowerTrainingConfig(output_dir=str(tmp_path), train_file="corpus/train.txt", objective=objective,
                                 tower_type=tower_type, layout=layout, max_train_steps=1)  # fmt: skip
    save_config(run, tmp_path)
    text = render_model_card(tmp_path, "lab/tiny").text
    stack, config, bidirectional = tower_stack_class(model.config), model.config, BIDIRECTIONAL[objective]
    assert f"2 {card_tower_name(stack.card_names[bidirectional], layout)} towers of identical" in text
    assert f"; each tower is {stack.card_architecture(config, bidirectional)}.\n" in text
    for label, field in stack.card_size_rows:
        assert f"| {label} | {getattr(config, field)} |" in text
    limitation = stack.card_limitations.get(bidirectional)
    assert limitation is None or f"\n- {limitation}\n" in text
    masked_loss = "the masked-LM loss (15% of the tokens selected"
    assert (masked_loss in text) is needs_masking(objective, model.model.towers)
    others = [stack for other in TOWER_KINDS if other != tower_type for stack in kind_stacks(other)]
    found = [word for other in others for word in card_words(other, config) if re.search(word, text)]
    assert found == []


@pytest.mark.parametrize("tower_type, layout, objective, initialization", CASES)
def test_flops_per_token_equal_the_flops_torch_counts(tower_type, layout, objective, initialization):
    # Every matmul torch's counter sees in forward and backward, per token, against the count from the built model
    # plus the stack's declared extra (attention scores, a scan's readout). SDPA's math kernel and LSTMs without
    # oneDNN run ops the counter sees; a convolution counts by its weights, as flops_per_token counts it (the counter
    # charges the padded positions and a depthwise backward as if it were not grouped). Only a recurrence's first
    # step differs: its gradient into the zero initial state is never computed (about 1 / FLOPS_SEQ of its share).
    model = build(tower_type, layout, objective, initialization).train()
    input_ids = torch.randint(4, VOCAB, (1, FLOPS_SEQ), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        with torch.backends.mkldnn.flags(enabled=False):
            model(input_ids, labels=input_ids).loss.backward()
    counted = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    convolutions = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Conv1d))
    measured = sum(flops for op, flops in counted.items() if "convolution" not in op) / FLOPS_SEQ
    declared = flops_per_token(model, FLOPS_SEQ, "pretrain")
    assert declared > 0
    assert declared == pytest.approx(measured + 6 * convolutions, rel=0.01)


# The paper-sized presets, on the meta device


@pytest.mark.parametrize("tower_type, layout, objective, preset", PRESET_CASES)
def test_presets_build_and_initialise_on_the_meta_device(tower_type, layout, objective, preset):
    # the presets' own initialisation, the reference one (the tiny cases run both on the same layers)
    config = TwoTowerConfig.from_preset(preset, tower_type=tower_type, bidirectional=BIDIRECTIONAL[objective])
    with torch.device("meta"):  # the shapes without allocating a weight
        model = MODEL_CLASSES[objective](config)
    model.initialize_weights()  # every draw of the initialisation runs on the meta tensors (post_init skips it)
    assert (config.layout, config.initialization) == (layout, "reference")
    assert type(model.model.towers) is tower_stack_class(config)
    assert sum(param.numel() for param in model.parameters()) > 10_000_000
    assert flops_per_token(model, config.max_position_embeddings, "pretrain") > 0
