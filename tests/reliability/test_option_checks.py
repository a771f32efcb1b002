"""Checks before the long work: every option's range at parse time (command line, recipe, Python), one conversion
for recipes and the command line, and data files refused by name before `datasets` reads them."""

import dataclasses

import pytest
import yaml

from twotower.evaluation.scoring.score import ScoringArguments
from twotower.training.arguments import TwoTowerTrainingConfig, load_config
from twotower.training.data.blocks import load_raw_datasets, resolve_text_files
from twotower.training.utils.errors import TwoTowerUserError

# option, bad value, what the message says: each was accepted before, and failed (or did the wrong thing) later
BAD_TRAINING_OPTIONS = {
    "zero steps (trained a full epoch)": ("max_train_steps", "0", "`max_train_steps` must be >= 1, got 0"),
    "negative steps (saved an untrained model)": ("max_train_steps", "-5", "`max_train_steps` must be >= 1, got -5"),
    "keep no checkpoint (kept all)": ("checkpoints_total_limit", "0", "`checkpoints_total_limit` must be >= 1"),
    "log every 0 steps (crashed after step 1)": ("logging_steps", "0", "`logging_steps` must be >= 1, got 0"),
    "evaluate every 0 steps": ("eval_steps", "-1", "`eval_steps` must be >= 1, got -1"),
    "checkpoint every 0 steps": ("checkpointing_steps", "0", "`checkpointing_steps` must be >= 1"),
    "zero epochs": ("num_train_epochs", "0", "`num_train_epochs` must be >= 1"),
    "zero learning rate": ("learning_rate", "0", "`learning_rate` must be > 0, got 0.0"),
    "NaN learning rate": ("learning_rate", "nan", "`learning_rate` is nan; it must be a finite number"),
    "infinite weight decay": ("weight_decay", "inf", "`weight_decay` is inf; it must be a finite number"),
    "beta of 1": ("adam_beta2", "1.0", r"`adam_beta2` must be in \[0, 1\), got 1.0"),
    "negative warm-up": ("num_warmup_steps", "-1", "`num_warmup_steps` must be >= 0"),
    "dropout of 1": ("hidden_dropout", "1.0", r"`hidden_dropout` must be in \[0, 1\)"),
    "masking probability 0": ("mlm_probability", "0", r"`mlm_probability` must be in \(0, 1\)"),
    "batch of 0": ("per_device_eval_batch_size", "0", "`per_device_eval_batch_size` must be >= 1"),
    "block of 1": ("block_size", "1", r"`block_size` must be >= 2 \(a block of one token has no target"),
    "zero training blocks": ("max_train_blocks", "0", "`max_train_blocks` must be >= 1"),
    "all of train held out": ("validation_split_percentage", "100", r"`validation_split_percentage` must be in \["),
    "negative seed": ("seed", "-1", r"`seed` must be in \[0, 4294967295\]"),
    "negative gradient clip": ("max_grad_norm", "-1", "`max_grad_norm` must be >= 0"),
    "zero peak": ("peak_tflops", "0", "`peak_tflops` must be > 0"),
    "schedule that needs a metric": ("lr_scheduler_type", "reduce_lr_on_plateau", "`lr_scheduler_type` is"),
    "unknown tracker": ("report_to", "tensorbord", r"\['tensorbord'\] are not trackers"),
    "heads that do not divide the width": ("hidden_size", "30", r"`hidden_size` \(30\) must be divisible"),
    "one tower": ("num_towers", "1", "`num_towers` must be an integer >= 2"),
    "tokenizer smaller than its bytes": ("tokenizer_vocab_size", "100", "`tokenizer_vocab_size` must be >= 257"),
    "repository id with a space": ("hub_model_id", "me/my model", "`hub_model_id` is 'me/my model'; pass `user/name`"),
    "text for a number": ("learning_rate", "fast", "invalid float value: 'fast'"),
    "sparse prediction of a causal LM": ("sparse_prediction", "true", "predicts masked positions only; the objective"),
}


@pytest.mark.parametrize("case", BAD_TRAINING_OPTIONS)
def test_training_options_out_of_range_fail_at_parse_time(case):
    name, value, message = BAD_TRAINING_OPTIONS[case]
    with pytest.raises(TwoTowerUserError, match=message):
        load_config("tiny", [f"--{name}", value])


@pytest.mark.parametrize("case", [case for case in BAD_TRAINING_OPTIONS if case != "text for a number"])
def test_a_recipe_is_held_to_the_same_ranges(case, tmp_path):
    name, value, message = BAD_TRAINING_OPTIONS[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({name: yaml.safe_load(value) if value not in ("nan", "inf") else value}))
    with pytest.raises(TwoTowerUserError, match=message):
        load_config(str(recipe))


def test_recipe_values_are_converted_as_the_command_line_converts_them(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    # YAML 1.1 reads 1e-3 (no dot) as a string; a quoted "5" stays a string; "yes" is a boolean in quotes too
    recipe.write_text('learning_rate: 1e-3\nmax_train_steps: "5"\ncpu: "yes"\nadam_epsilon: 1\n')
    assert yaml.safe_load(recipe.read_text()) == {"learning_rate": "1e-3", "max_train_steps": "5", "cpu": "yes",
                                                  "adam_epsilon": 1}
    from_recipe = load_config(str(recipe))
    from_command_line = load_config(None, ["--learning_rate", "1e-3", "--max_train_steps", "5", "--cpu", "yes",
                                           "--adam_epsilon", "1"])
    assert dataclasses.replace(from_recipe, recipe=None) == from_command_line
    assert (from_recipe.learning_rate, from_recipe.max_train_steps, from_recipe.cpu) == (0.001, 5, True)
    assert type(from_recipe.adam_epsilon) is float  # noqa: E721


@pytest.mark.parametrize(
    "text, message",
    [
        ("max_train_steps: 1.5\n", r"sets `max_train_steps: 1.5`, which is not an integer"),
        ("cpu: maybe\n", "sets `cpu: 'maybe'`, which is not true or false"),
        ("mixed_precision: no\n", 'YAML reads an unquoted yes/no.*`mixed_precision: "no"`'),
        ("max_train_stepz: 10\n", r"unknown options \['max_train_stepz'\] \(did you mean `max_train_steps`\?\)"),
        ("learning_rate: [1e-3\n", "is not valid YAML"),
        ("- a list\n", "holds a list; write one `option: value` per line"),
    ],
    ids=["float-for-int", "not-a-bool", "unquoted-no", "misspelt", "broken-yaml", "not-a-mapping"],
)
def test_bad_recipes_name_the_file_and_the_value(text, message, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(TwoTowerUserError, match=f"Recipe {recipe}.*{message}"):
        load_config(str(recipe))


def test_misspelt_command_line_option_is_named_with_the_closest_one():
    with pytest.raises(TwoTowerUserError, match=r"unknown options \['--max_trian_steps', '3'\].*`max_train_steps`"):
        load_config("tiny", ["--max_trian_steps", "3"])


def test_python_callers_get_the_command_lines_types():
    with pytest.raises(TwoTowerUserError, match=r"`learning_rate` is '1e-3' \(str\); it must be a number"):
        TwoTowerTrainingConfig(learning_rate="1e-3")
    with pytest.raises(TwoTowerUserError, match=r"`max_train_steps` is '5' \(str\); it must be an integer or unset"):
        TwoTowerTrainingConfig(max_train_steps="5")
    with pytest.raises(TwoTowerUserError, match=r"`max_train_steps` is True \(bool\)"):
        TwoTowerTrainingConfig(max_train_steps=True)
    assert TwoTowerTrainingConfig(learning_rate=1).learning_rate == 1  # an int is a number


def test_settings_that_used_to_pass_still_do():
    config = load_config("tiny", ["--max_train_steps", "7", "--checkpoints_total_limit", "1", "--logging_steps", "1"])
    assert (config.max_train_steps, config.checkpoints_total_limit, config.logging_steps) == (7, 1, 1)
    assert load_config("tiny", ["--report_to", "tensorboard,wandb"]).report_to == "tensorboard,wandb"


BAD_SCORING_OPTIONS = {
    "alpha of 2 (failed after a full scoring pass)": (dict(alpha=2.0), r"`alpha` must be in \(0, 1\)"),
    "alpha of 0": (dict(alpha=0.0), r"`alpha` must be in \(0, 1\)"),
    "min_count of 1": (dict(min_count=1), "`min_count` must be >= 2"),
    "negative top_k": (dict(top_k=-1), "`top_k` must be >= 0"),
    "zero batch": (dict(batch_size=0), "`batch_size` must be >= 1"),
    "zero blocks": (dict(max_blocks=0), "`max_blocks` must be >= 1, got 0, or leave it unset"),
    "zero chunk": (dict(probe_chunk_size=0), "`probe_chunk_size` must be >= 1"),
    "all held out": (dict(validation_split_percentage=100.0), r"`validation_split_percentage` must be in \[0, 100\)"),
    "text for a number": (dict(alpha="0.05"), r"`alpha` is '0.05' \(str\)"),
    "unknown split": (dict(split="test"), "`split` is 'test'; choose one of"),
}


@pytest.mark.parametrize("case", BAD_SCORING_OPTIONS)
def test_scoring_options_out_of_range_fail_before_the_model_is_loaded(case):
    options, message = BAD_SCORING_OPTIONS[case]
    with pytest.raises(TwoTowerUserError, match=message):
        ScoringArguments(model_dir="unused", output_dir="unused", **options)


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    "data, message",
    [
        ("caf\u00e9 au lait\n".encode("latin-1"), r"is not UTF-8: byte 0xe9 at byte offset 3 .*iconv"),
        ("ok\n".encode() * 5 + b"\xff\xfe", r"is not UTF-8: byte 0xff at byte offset 15"),
        ("\u00e9t\u00e9\n".encode("utf-16"), r"is not text: a NUL byte at byte offset 3 \(a binary file, or UTF-16"),
        (b"text\x00\x01\x02 and more text", r"is not text: a NUL byte at byte offset 4"),
        ("line\n".encode() + "\u4e2d".encode()[:2], "is not UTF-8: it ends inside a multi-byte character"),
        (b"  \n\t\n\n   \n", "holds only whitespace"),
    ],
    ids=["latin-1", "bad-bytes-at-the-end", "utf-16", "binary", "truncated", "whitespace"],
)
def test_data_files_that_are_not_text_are_named_with_the_offset(data, message, tmp_path):
    path = _write(tmp_path / "corpus.txt", data)
    with pytest.raises(TwoTowerUserError, match=f"{path} {message}"):
        resolve_text_files(path)
    with pytest.raises(TwoTowerUserError, match=message):  # what training and scoring call
        load_raw_datasets("unused", train_file=str(tmp_path))


def test_the_offset_of_a_character_split_across_read_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr("twotower.training.data.blocks.TEXT_CHECK_CHUNK", 7)
    text = "abcdef\u00e9x\n".encode()  # the 2-byte é straddles the first 7-byte chunk
    assert resolve_text_files(_write(tmp_path / "ok.txt", text * 3)) == [str(tmp_path / "ok.txt")]
    with pytest.raises(TwoTowerUserError, match="byte 0xff at byte offset 10"):
        resolve_text_files(_write(tmp_path / "bad.txt", text + b"\xff"))


def test_an_unreachable_hub_dataset_is_one_clear_error():
    with pytest.raises(TwoTowerUserError, match="Could not load the Hub dataset 'no-such-dataset-here'.*--train_file"):
        load_raw_datasets("no-such-dataset-here")
