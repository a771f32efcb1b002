"""
What a user sees when a saved model, an input or an option is wrong (docs/RELIABILITY.md): one clear error (on the
command line, one `error:` line with exit status 2) or a warning, never a raw traceback or a silent NaN.
"""

import builtins
import json
import logging
import os
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")  # before evaluate reads its config

import evaluate  # noqa: E402
from transformers import AutoModelForCausalLM, BertLMHeadModel  # noqa: E402

from modeling_twotower import TwoTowerCheckpointError, TwoTowerConfig, TwoTowerForCausalLM  # noqa: E402
from twotower.evaluation import compute_preference  # noqa: E402
from twotower.evaluation.scoring import report, score  # noqa: E402
from twotower.training import train  # noqa: E402
from twotower.training.utils import cli  # noqa: E402
from twotower.training.utils.errors import TwoTowerUserError  # noqa: E402
from twotower.training.loading import load_two_tower_config  # noqa: E402

VOCAB_SIZE = 96
SEQ = 7
METRIC_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "evaluation", "tower_preference")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny causal model with trained-probe records, saved as training saves it (weights, config, code)."""
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, max_position_embeddings=16, probe_training_steps=1)
    folder = tmp_path_factory.mktemp("model")
    TwoTowerForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, shared_data):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    lines = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:60]), encoding="utf-8")
    return path


@pytest.fixture
def command(monkeypatch, capsys):
    """Run a command's main as `python -m` does (cli.run); returns (exit status, stderr)."""
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)

    def run(main, argv):
        with pytest.raises(SystemExit) as exited:
            cli.run(main, [str(arg) for arg in argv])
        return exited.value.code, capsys.readouterr().err

    return run


def assert_one_error_line(status, stderr, *parts):
    assert status == cli.USER_ERROR_STATUS == 2
    assert stderr.startswith("error: ") and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    for part in parts:
        assert part in stderr, (part, stderr)


def edited_copy(model_dir, folder, **fields):
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


# field edited in config.json: (edited value, a tensor it sizes, that tensor's saved shape, its shape per the config)
EDITS = {
    "num_towers": (3, "lm_head.dense.weight", [128, 128], [128, 192]),
    "vocab_size": (128, "lm_head.decoder.bias", [VOCAB_SIZE], [128]),
}


@pytest.mark.parametrize("field", EDITS)
def test_a_config_that_disagrees_with_its_weights_is_one_error_naming_the_field(
    field, model_dir, text_file, tmp_path, command
):
    edited, tensor, saved_shape, config_shape = EDITS[field]
    saved = json.loads((model_dir / "config.json").read_text())[field]
    folder = edited_copy(model_dir, tmp_path / "edited", **{field: edited})
    parts = (
        f"The config of {folder} sets `{field}` to {edited}, but its weights were saved with {saved}",
        f"`{tensor}` is {saved_shape} in model.safetensors, the config gives {config_shape}",
        f'Set `"{field}": {saved}` in {folder / "config.json"} again',
    )
    with pytest.raises(TwoTowerCheckpointError) as raised:  # a ValueError, before any weight is read
        TwoTowerForCausalLM.from_pretrained(folder)
    assert isinstance(raised.value, ValueError) and all(part in str(raised.value) for part in parts)

    status, stderr = command(score.main, ["--model_dir", folder, "--output_dir", tmp_path / "report",
                                          "--validation_file", text_file, "--block_size", 16])
    assert_one_error_line(status, stderr, *parts)
    probe_phase = ["--recipe", "tiny_probe", "--pretrained_model", folder, "--train_file", text_file,
                   "--validation_file", text_file, "--block_size", 16, "--output_dir", tmp_path / "probe"]
    assert_one_error_line(*command(train.main, probe_phase), *parts)
    assert not (tmp_path / "report").exists() and not (tmp_path / "probe").exists()  # refused before any work


def test_truncated_weights_name_the_file(model_dir, text_file, tmp_path, command):
    folder = tmp_path / "truncated"
    shutil.copytree(model_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # an interrupted copy
    named = f"{weights} is not a readable safetensors file"
    with pytest.raises(TwoTowerCheckpointError, match=f"{named} .*: it is damaged or cut short"):
        TwoTowerForCausalLM.from_pretrained(folder)
    probe_phase = ["--recipe", "tiny_probe", "--pretrained_model", folder, "--train_file", text_file,
                   "--validation_file", text_file, "--block_size", 16, "--output_dir", tmp_path / "probe"]
    assert_one_error_line(*command(train.main, probe_phase), named, "copy or download it again")
    assert not (tmp_path / "probe").exists()


@pytest.fixture
def tower_preference(tmp_path):
    return evaluate.load(METRIC_DIR, cache_dir=str(tmp_path))


@pytest.mark.parametrize(
    "gold_logprobs, message",
    [
        ([-1.0, -2.0, -3.0], r"one row per prediction, each with one log-probability per tower \(shape "
                             r"\[num_predictions, num_towers\].*got shape \(3,\)"),
        ([[-1.0, -2.0, -3.0], [-1.5, -2.5, -0.5]], r"2 rows of 3 value\(s\) for 3 token_ids, one row per tower; the "
                                                   r"metric takes one row per prediction.*transpose it"),
        ([[-1.0], [-2.0], [-3.0]], r"rows of 1 value\(s\); each row is one prediction, holding one log-probability "
                                   r"per tower .* at least 2 towers"),
    ],
    ids=["one-flat-row", "one-row-per-tower", "one-tower"],
)
def test_the_metric_names_the_shape_it_takes(tower_preference, gold_logprobs, message):
    with pytest.raises(ValueError, match=message) as raised:
        tower_preference.compute(token_ids=[1, 2, 3], gold_logprobs=gold_logprobs)
    # the core's wording (its input is [towers, predictions]) would send a metric user the wrong way
    assert "transpose it if you have one row per prediction" not in str(raised.value)


@pytest.mark.parametrize(
    "dtype, fix",
    [
        (torch.bool, "a boolean tensor is a mask: pass it as `attention_mask`"),
        (torch.float32, "or pass embeddings as `inputs_embeds`"),
        (torch.int16, "convert them with `input_ids.long()`"),
    ],
)
def test_input_ids_that_are_not_integer_token_ids_name_the_dtype(dtype, fix):
    model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE)).eval()
    input_ids = torch.randint(0, VOCAB_SIZE, (2, SEQ))
    message = f"`input_ids` has dtype {dtype}, but input_ids must be integer token ids"
    with pytest.raises(ValueError, match=f"{re.escape(message)}.*{re.escape(fix)}"):
        model((input_ids > 40).to(dtype))
    with pytest.raises(ValueError, match=re.escape(message)):
        model.probe_logprobs(input_ids.to(dtype))
    assert model(input_ids.int()).logits.shape == (2, SEQ, VOCAB_SIZE)  # int32 ids are token ids too


def test_a_tokenizer_that_is_neither_a_folder_nor_on_the_hub_is_named_before_the_data_is_read(
    text_file, tmp_path, monkeypatch, command
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "prepare_run", lambda *args: pytest.fail("the data was read"))
    argv = ["--recipe", "tiny", "--tokenizer_name_or_path", "tokenizers/mine", "--train_file", text_file,
            "--validation_file", text_file, "--output_dir", tmp_path / "run"]
    status, stderr = command(train.main, argv)
    assert_one_error_line(
        status, stderr, f"Tokenizer 'tokenizers/mine' is neither a local folder (there is no "
        f"{tmp_path / 'tokenizers' / 'mine'}) nor a tokenizer reachable on the Hub (",
    )
    assert not (tmp_path / "run").exists()


def test_probe_logprobs_check_labels_as_forward_does():
    model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE)).eval()
    input_ids = torch.randint(0, VOCAB_SIZE, (2, SEQ))
    labels = input_ids.clone()
    labels[1, 3] = VOCAB_SIZE + 4
    message = rf"`labels` holds {VOCAB_SIZE + 4}, neither a token id in \[0, {VOCAB_SIZE}\) nor -100"
    with pytest.raises(ValueError, match=message):
        model(input_ids, labels=labels)
    with pytest.raises(ValueError, match=message):
        model.probe_logprobs(input_ids, labels=labels)


def test_labels_without_a_target_warn_that_the_loss_is_nan(caplog):
    model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE)).eval()
    input_ids = torch.randint(0, VOCAB_SIZE, (2, SEQ))
    no_target = torch.full_like(input_ids, -100)
    no_target[:, 0] = input_ids[:, 0]  # position 0 is never a causal LM's target
    with caplog.at_level(logging.WARNING):
        assert model(input_ids, labels=no_target).loss.isnan()  # as transformers' LMs: a mean over no tokens
    assert "No position of the batch has a target (every label is -100" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert model(input_ids, labels=no_target, num_items_in_batch=torch.tensor(0)).loss.isnan()
    assert "`num_items_in_batch` is 0" in caplog.text and "would make every weight NaN" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a batch without targets inside an accumulated batch: loss 0, no word
        assert model(input_ids, labels=no_target, num_items_in_batch=torch.tensor(5)).loss == 0.0
        model(input_ids, labels=input_ids)
    assert "target" not in caplog.text


def test_a_training_step_without_a_target_is_refused(text_file, tmp_path, command):
    # a masked LM whose masking selects (almost) nothing: every label of the step is -100
    argv = ["--recipe", "tiny_masked", "--mlm_probability", "1e-9", "--block_size", 16, "--max_train_blocks", 8,
            "--per_device_train_batch_size", 2, "--max_train_steps", 1, "--tokenizer_vocab_size", 300,
            "--train_file", text_file, "--validation_file", text_file, "--output_dir", tmp_path / "run",
            "--disable_tqdm", "true"]
    status, stderr = command(train.main, argv)
    assert status == 2 and "Traceback" not in stderr
    assert stderr.endswith(  # the last line, after the data's progress bars
        "\nerror: An optimizer step's 1 batch(es) have no target token on any process (every label is -100), so its "
        "loss and gradients would be NaN; give longer blocks (--block_size) or, for a masked LM, a higher "
        "--mlm_probability.\n"
    )
    assert not list((tmp_path / "run").glob("checkpoints/*")) and not (tmp_path / "run" / "model").exists()


def test_non_finite_weights_are_named_in_a_warning_when_loaded(model_dir, tmp_path, caplog):
    folder = tmp_path / "diverged"
    shutil.copytree(model_dir, folder)
    weights = load_file(folder / "model.safetensors")
    diverged = ["model.towers.layers.1.mlp.down_proj.weight", "probes.decoder.bias"]
    weights[diverged[0]][0, 0, 0] = float("nan")
    weights[diverged[1]][1, 5] = float("inf")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        model = TwoTowerForCausalLM.from_pretrained(folder)
    expected = f"The weights loaded from {folder} hold values that are not finite (NaN or infinity) in "
    assert expected + ", ".join(f"`{name}`" for name in diverged) + ", so the model's outputs" in caplog.text
    assert model(torch.randint(0, VOCAB_SIZE, (1, SEQ))).logits.isnan().any()  # loaded as saved
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        TwoTowerForCausalLM.from_pretrained(model_dir)
    assert "not finite" not in caplog.text


def test_an_auto_class_loads_a_folder_of_another_model_type_as_that_model(model_dir, tmp_path):
    # transformers' behaviour, documented (docs/model.md): the config's model_type picks the class, and none of the
    # two-tower weights fit a BERT, so it comes back freshly initialized. The package's loaders refuse the folder.
    folder = edited_copy(model_dir, tmp_path / "bert-typed", model_type="bert")
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model) is BertLMHeadModel and model.config.model_type == "bert"
    saved = load_file(folder / "model.safetensors")
    assert not set(saved) & set(model.state_dict())  # no weight of the folder was loaded
    with pytest.raises(TwoTowerUserError, match=f"'{folder}' holds a 'bert' model, not a two-tower model"):
        load_two_tower_config(folder)


def test_score_never_asks_whether_to_run_a_folders_code(model_dir, text_file, tmp_path, monkeypatch, command):
    # a folder with custom code (`auto_map`) whose model_type this package does not register: transformers would
    # ask [y/N] on a terminal
    folder = edited_copy(model_dir, tmp_path / "other-type", model_type="twotower")
    prompts = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": prompts.append(prompt) or "n")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    status, stderr = command(score.main, ["--model_dir", folder, "--output_dir", tmp_path / "report",
                                          "--validation_file", text_file, "--block_size", 16])
    assert_one_error_line(status, stderr, f"--model_dir '{folder}' holds no model transformers knows")
    assert prompts == []


def replica_result(tower_effect_nats=0.0, seed=1):
    """
    2 probe replicas per tower over 60 token types, each probe with its own per-type error, and towers that differ
    by +-`tower_effect_nats` per type: without a difference the reliability is about 0, here below it by chance.
    """
    rng = np.random.default_rng(seed)
    token_ids = np.repeat(np.arange(60), 12)
    tower_effect = rng.choice([-tower_effect_nats, tower_effect_nats], 60)
    per_type = rng.normal(0.0, 0.3, (4, 60)) + np.repeat([tower_effect, -tower_effect], 2, axis=0)  # [probes, types]
    gold_logprobs = -rng.uniform(3.0, 6.0, 60)[token_ids] + per_type[:, token_ids] - 0.5
    return compute_preference(token_ids, np.minimum(gold_logprobs, 0.0), min_count=5, probe_towers=[0, 0, 1, 1])


def test_a_negative_reliability_says_what_it_means():
    result = replica_result()
    summary = result.summary
    assert summary["reliability"] < 0
    metadata = {
        "model": {"path": "planted"}, "data": {"description": "planted", "num_blocks": 3, "block_size": 32},
        "perplexity": {"joint": 10.0, "probes": [11.0, 12.0]}, "summary": summary,
    }
    note = "negative: probes agree less than chance, so there is no reproducible preference at this size"
    tokens = [str(token_id) for token_id in result.token_ids]
    markdown = report.render_markdown(metadata, report.per_token_table(result, tokens))
    assert f"{summary['reliability']:.3f} ({note}), 95% CI" in markdown
    low, high = summary["reliability_ci"]
    line = score.summary_line(metadata)
    assert f"reliability {summary['reliability']:.3f} (95% CI {low:.3f} to {high:.3f}; {note}); " in line

    positive = replica_result(tower_effect_nats=0.5)
    metadata["summary"] = positive.summary
    assert positive.summary["reliability"] > 0.5
    assert note not in score.summary_line(metadata)
    tokens = [str(token_id) for token_id in positive.token_ids]
    assert note not in report.render_markdown(metadata, report.per_token_table(positive, tokens))
