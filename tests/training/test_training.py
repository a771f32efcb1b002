"""The training command end to end on a slice of WikiText-2: pretrain, probe, resume, 2 processes, bad input."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hub

import dataclasses
import glob
import inspect
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
import yaml
from accelerate import Accelerator
from datasets import Dataset
from huggingface_hub import CommitInfo, HfApi, RepoUrl
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.nn import functional as F
from transformers import AutoModelForCausalLM, set_seed

import modeling_twotower
from twotower.training.arguments import TwoTowerTrainingConfig, load_config
from twotower.training.checkpoints.checkpointing import list_checkpoints, read_progress, resolve_resume_checkpoint
from twotower.training.data.blocks import collate_blocks, load_raw_datasets, split_blocks, tokenize_and_group
from twotower.training.run.early_stopping import EarlyStopping
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.optim.optimization import weight_decay_groups
from twotower.training.phases import LinearProbePhase, PretrainPhase, TrainingPhase, make_phase
from twotower.training.run.run_setup import TrainingRun
from twotower.training.feature_cache.probe_cache import build_feature_cache
from twotower.training.run.run_folder import read_eval_history
from twotower.training.launch.throughput import flops_per_token
from twotower.training.data.tokenizer import load_tokenizer
from twotower.training.train import train_loop, training_function
from twotower.training.phases.validation import evaluate_cached
from conftest import HANG_LIMIT_S

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 512  # the trained BPE: a fast decoder, and ln(512) = 6.24 nats at the start
EVAL_BLOCKS = 32
BLOCK_SIZE = 32  # the recipes use the paper's 128; a quarter of it keeps the suite fast


def wikitext_slice(folder: Path, shared_data: Path, train_chars: int, validation_chars: int) -> dict:
    """The first characters of WikiText-2's train and validation text, cut after their last whole line, in `folder`:
    the `train_file` and `validation_file` options."""
    for split, size in (("train", train_chars), ("valid", validation_chars)):
        text = (shared_data / "wikitext-2" / f"{split}.txt").read_text(encoding="utf-8")[:size]
        (folder / f"{split}.txt").write_text(text.rsplit("\n", 1)[0] + "\n", encoding="utf-8")
    return {"train_file": str(folder / "train.txt"), "validation_file": str(folder / "valid.txt")}


def assert_resumed_run_ends_bitwise_equal(resumed: dict, uninterrupted: dict, from_step: int):
    """A run resumed at step `from_step` logs the uninterrupted run's later losses and saves its very weights."""
    assert resumed["train_losses"] == uninterrupted["train_losses"][from_step:]
    expected = load_file(Path(uninterrupted["model_dir"]) / "model.safetensors")
    after_resume = load_file(Path(resumed["model_dir"]) / "model.safetensors")
    assert expected.keys() == after_resume.keys()
    assert all(torch.equal(tensor, after_resume[name]) for name, tensor in expected.items())


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, shared_data) -> dict:
    """The first 400 kB of WikiText-2 train and 60 kB of validation (a slice, in a temporary folder)."""
    return wikitext_slice(tmp_path_factory.mktemp("wikitext-2-slice"), shared_data, 400_000, 60_000)


def tiny_config(recipe: str, corpus: dict, output_dir: Path, **overrides) -> TwoTowerTrainingConfig:
    """The shipped recipe, shrunk to seconds: 200 blocks of 32 tokens, batches of 8 x 2 accumulated, 30 steps."""
    options = dict(
        **corpus, output_dir=output_dir, tokenizer_vocab_size=VOCAB_SIZE, block_size=BLOCK_SIZE, max_train_blocks=200,
        max_eval_blocks=EVAL_BLOCKS, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        max_train_steps=30, num_warmup_steps=3, learning_rate=3e-3, checkpointing_steps=10,
        checkpoints_total_limit=3, logging_steps=1, peak_tflops=1.0, disable_tqdm=True,
    )
    options.update(overrides)
    return load_config(recipe, [f"--{name}={value}" for name, value in options.items()])


@pytest.fixture(scope="session")
def pretrain_run(corpus, tmp_path_factory) -> dict:
    # 200 blocks / 8 = 25 batches = 13 steps per epoch (the last with 1 batch); 30 steps end inside epoch 2.
    config = tiny_config("tiny", corpus, tmp_path_factory.mktemp("pretrain"))
    return {"config": config, **training_function(config)}


@pytest.fixture(scope="session")
def probe_run(corpus, pretrain_run, tmp_path_factory) -> dict:
    config = tiny_config(
        "tiny_probe", corpus, tmp_path_factory.mktemp("probe"), pretrained_model=pretrain_run["model_dir"],
        max_train_steps=20, checkpointing_steps=100, eval_steps=10,  # two evaluations: the second reuses the joint's
    )
    return {"config": config, **training_function(config)}


def tensorboard_scalars(output_dir: Path, phase: str, tag: str) -> list[float]:
    (events_file,) = glob.glob(str(output_dir / "runs" / phase / "events.out.tfevents.*"))
    events = EventAccumulator(events_file)
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


def validation_blocks(config: TwoTowerTrainingConfig, tokenizer) -> torch.Tensor:
    raw_datasets = load_raw_datasets("unused", None, config.train_file, config.validation_file)
    lm_datasets = split_blocks(tokenize_and_group(raw_datasets, tokenizer, config.block_size), config.block_size,
                               config.validation_split_percentage, max_eval_blocks=config.max_eval_blocks)
    return torch.tensor(lm_datasets["validation"]["input_ids"])  # [blocks, block_size]


def test_pretraining_learns(pretrain_run):
    losses = pretrain_run["train_losses"]
    assert len(losses) == 30
    assert losses[0] == pytest.approx(math.log(VOCAB_SIZE), abs=0.3)  # uniform guess over the vocabulary
    assert pretrain_run["eval_metrics"]["loss"] < losses[0] - 0.8  # a real drop, on held-out text
    logged = tensorboard_scalars(Path(pretrain_run["config"].output_dir), "pretrain", "train/loss")
    assert logged == pytest.approx(losses)  # the TensorBoard tracker got every step
    for tag in ("train/tokens_per_s", "train/mfu", "train/lr", "eval/perplexity"):
        assert tensorboard_scalars(Path(pretrain_run["config"].output_dir), "pretrain", tag)
    # runs/eval_history.jsonl holds every evaluation, whatever the trackers
    history = read_eval_history(pretrain_run["config"].output_dir)
    assert [entry["loss"] for entry in history] == pytest.approx(
        tensorboard_scalars(Path(pretrain_run["config"].output_dir), "pretrain", "eval/loss")
    )
    assert history[-1] == {"step": 30, **pretrain_run["eval_metrics"]}


def test_saved_model_reloads_with_the_evaluated_weights(pretrain_run):
    model_dir = Path(pretrain_run["model_dir"])
    saved = {path.name for path in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_twotower.py", "configuration_twotower.py",
            "tokenizer.json", "training_config.yaml"} <= saved
    assert not [path for path in model_dir.parent.iterdir() if path.name.endswith((".tmp", ".old"))]

    tokenizer = load_tokenizer(str(model_dir))
    input_ids = validation_blocks(pretrain_run["config"], tokenizer)
    assert len(input_ids) == EVAL_BLOCKS
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # the pip route: `import modeling_twotower`
    assert isinstance(model, modeling_twotower.TwoTowerForCausalLM)
    with torch.no_grad():
        logits = model(input_ids).logits
    # The reloaded weights' validation loss, computed here independently, is the one the run reported.
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
    assert loss.item() == pytest.approx(pretrain_run["eval_metrics"]["loss"], rel=1e-5)


def test_probe_phase_trains_only_the_probes(pretrain_run, probe_run):
    pretrained = load_file(Path(pretrain_run["model_dir"]) / "model.safetensors")
    probed = load_file(Path(probe_run["model_dir"]) / "model.safetensors")
    assert pretrained.keys() == probed.keys()
    for name, tensor in pretrained.items():
        if name.startswith("probes."):
            assert not torch.equal(tensor, probed[name]), name
        else:
            assert torch.equal(tensor, probed[name]), name  # the frozen model, bitwise
    metrics = probe_run["eval_metrics"]
    # The joint model is frozen and sees the same validation blocks: the same perplexity as after pretraining.
    assert metrics["perplexity"] == pytest.approx(pretrain_run["eval_metrics"]["perplexity"], rel=1e-6)
    # The train loss sums the probes (the recipe's replicas of both towers); each started near a uniform guess.
    num_probes = 2 * probe_run["config"].probe_replicas
    assert probe_run["train_losses"][0] == pytest.approx(num_probes * math.log(VOCAB_SIZE), abs=0.3 * num_probes)
    for probe in (0, 1):
        # each tower's probes learned
        assert metrics[f"probe_{probe}_loss"] < math.log(VOCAB_SIZE) - 0.5
        assert metrics[f"probe_{probe}_perplexity"] == pytest.approx(math.exp(metrics[f"probe_{probe}_loss"]))
        assert metrics[f"probe_{probe}_loss"] > metrics["loss"]  # one tower alone knows less than the two


def test_probe_evaluations_reuse_the_frozen_joint_models_metrics(pretrain_run, probe_run):
    model = AutoModelForCausalLM.from_pretrained(probe_run["model_dir"]).eval()
    input_ids = validation_blocks(probe_run["config"], load_tokenizer(probe_run["model_dir"]))
    # Recomputed here from the saved probes: each tower's loss is the mean over its replicas' mean NLLs.
    with torch.no_grad():
        replica_losses = -model.probe_logprobs(input_ids, all_replicas=True).mean(dim=(-2, -1))  # [towers, replicas]
    for probe in (0, 1):
        assert replica_losses[probe].mean().item() == pytest.approx(
            probe_run["eval_metrics"][f"probe_{probe}_loss"], rel=1e-6
        )
    # The cached evaluation: the joint model as after pretraining, unless its metrics are given; then only probes.
    accelerator = Accelerator(cpu=True)
    blocks = Dataset.from_dict({"input_ids": input_ids.tolist()})
    cache = build_feature_cache(accelerator, model, blocks, collate_blocks, "causal", batch_size=8)
    full = evaluate_cached(accelerator, model, cache, chunk_positions=100)
    assert full["perplexity"] == pytest.approx(pretrain_run["eval_metrics"]["perplexity"], rel=1e-6)
    assert full == pytest.approx({name: probe_run["eval_metrics"][name] for name in full}, rel=1e-6)
    given = {"loss": 9.0, "perplexity": math.exp(9.0)}
    assert evaluate_cached(accelerator, model, cache, chunk_positions=100, joint_metrics=given) == {**full, **given}


@pytest.mark.parametrize("control", [False, True], ids=["cooperative", "independent-towers-control"])
def test_probe_phase_draws_new_probes_from_its_seed(pretrain_run, probe_run, control, tmp_path):
    config, tokenizer = probe_run["config"], load_tokenizer(pretrain_run["model_dir"])
    if control:  # its per-tower LM heads are TwoTowerProbes too, but trained ones: they must stay as saved
        control_config = modeling_twotower.TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, cooperative=False)
        modeling_twotower.TwoTowerForCausalLM(control_config).save_pretrained(tmp_path)
        config = dataclasses.replace(config, pretrained_model=str(tmp_path))
    saved = load_file(Path(config.pretrained_model) / "model.safetensors")

    def built(seed: int) -> dict:
        set_seed(seed)  # as train.py does before build_model
        phase = make_phase(config)
        return phase.build_model(phase.resolve_model_config(), tokenizer, "causal").state_dict()

    first, again, other = built(1), built(1), built(2)
    for name, tensor in saved.items():
        if name.startswith("probes."):
            assert torch.equal(first[name], again[name]), name  # equal seeds, equal probes
        else:
            assert torch.equal(first[name], tensor) and torch.equal(other[name], tensor), name  # as saved, bitwise
    for name in ("probes.dense.weight", "probes.decoder.weight"):  # the random tensors (biases 0, norms 1)
        assert not torch.equal(first[name], other[name]) and not torch.equal(first[name], saved[name]), name
        assert first[name].std().item() == pytest.approx(0.02, rel=0.05)  # _init_weights' initializer_range


def test_the_training_loop_reads_no_phase_flag():
    # make_phase is the one place that tells the phases apart; the loop only calls the phase it was given
    source = inspect.getsource(train_loop)
    flags = re.findall(r"\b(phase|probe_type|objective|linear)\b\s*(==|!=|\bin\b)|isinstance\([^)]*Phase", source)
    assert flags == [] and "run.phase.optimizer_step" in source and len(source.splitlines()) < 60


def test_probe_loss_builds_no_graph_through_the_backbone(pretrain_run, probe_run):
    model = AutoModelForCausalLM.from_pretrained(pretrain_run["model_dir"])
    phase = make_phase(probe_run["config"])
    trained = phase.trained_module(model, torch.device("cpu"))
    input_ids = torch.randint(0, 500, (2, 16))
    blocks = Dataset.from_dict({"input_ids": input_ids.tolist()})
    cache = build_feature_cache(Accelerator(cpu=True), model, blocks, collate_blocks, "causal", batch_size=2)
    batch = cache.replica_batch(torch.arange(len(cache)).expand(model.probes.num_replicas, -1))  # all positions
    loss = phase.loss_function(trained)(batch, 30)
    loss.backward()
    assert all(param.grad is not None for param in model.probes.parameters())
    assert all(param.grad is None for name, param in model.named_parameters() if not name.startswith("probes."))
    # The loss is the sum over probes of each probe's mean next-token NLL, here over 2 x 15 = 30 targets.
    expected = -model.probe_logprobs(input_ids, all_replicas=True).sum() / 30
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_interrupted_and_resumed_run_ends_bitwise_equal(pretrain_run, corpus, tmp_path):
    output_dir = Path(pretrain_run["config"].output_dir)
    # Checkpoints every 10 steps and at each epoch's end (13, 26); the last 3 are kept.
    assert [path.name for path in list_checkpoints(output_dir)] == ["step_20", "epoch_1", "step_30"]
    assert resolve_resume_checkpoint("latest", output_dir).name == "step_30"
    assert read_progress(output_dir / "checkpoints" / "step_20") == {
        "completed_steps": 20, "epoch": 1, "batches_into_epoch": 14, "steps_per_epoch": 13
    }

    # A run stopped after step 20 (mid-epoch, dropout on) and resumed from there, in a new folder.
    resumed = training_function(
        tiny_config("tiny", corpus, tmp_path, resume_from_checkpoint=output_dir / "checkpoints" / "step_20")
    )
    assert_resumed_run_ends_bitwise_equal(resumed, pretrain_run, from_step=20)


@pytest.mark.slow
def test_two_processes_match_one_process(corpus, tmp_path):
    # Same global batch (2 x 4 = 1 x 8), no dropout: the per-step losses agree to float tolerance.
    common = dict(max_train_steps=4, max_train_blocks=64, gradient_accumulation_steps=1, hidden_dropout=0.0,
                  attention_dropout=0.0, cpu=True, checkpointing_steps=100)
    one = training_function(tiny_config("tiny", corpus, tmp_path / "one", per_device_train_batch_size=8, **common))
    config = tiny_config("tiny", corpus, tmp_path / "two", per_device_train_batch_size=4, **common)
    cli_args = [f"--{name}={value}" for name, value in dataclasses.asdict(config).items() if value is not None]
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "twotower.training.train",
         *cli_args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_LIMIT_S,
    )
    assert launched.returncode == 0, launched.stderr[-4000:]
    two_losses = tensorboard_scalars(tmp_path / "two", "pretrain", "train/loss")
    assert two_losses == pytest.approx(one["train_losses"], rel=1e-5)
    two_eval = tensorboard_scalars(tmp_path / "two", "pretrain", "eval/loss")
    assert two_eval == pytest.approx([one["eval_metrics"]["loss"]], rel=1e-5)


def script_evaluations(monkeypatch, *evaluations: tuple[float, ...]):
    """Replace the validation pass by scripted metrics: (joint loss, probe losses...) per evaluation, in order."""
    scripted = []
    for loss, *probe_losses in evaluations:
        metrics = {"loss": loss, "perplexity": math.exp(loss)}
        for index, probe_loss in enumerate(probe_losses):
            metrics |= {f"probe_{index}_loss": probe_loss, f"probe_{index}_perplexity": math.exp(probe_loss)}
        scripted.append(metrics)
    for module, name in (("pretrain", "evaluate_blocks"), ("probe", "evaluate_cached")):
        monkeypatch.setattr(f"twotower.training.phases.{module}.{name}", lambda *args, **kwargs: scripted.pop(0))


def test_early_stopping_saves_the_best_evaluation(corpus, tmp_path, monkeypatch, capsys):
    script_evaluations(monkeypatch, (3.0,), (2.0,), (2.5,), (2.6,), (2.7,))
    result = training_function(tiny_config(
        "tiny", corpus, tmp_path, max_train_steps=20, eval_steps=2, early_stopping_patience=2, checkpointing_steps=2,
        checkpoints_total_limit=20, report_to="none",
    ))
    assert result["completed_steps"] == len(result["train_losses"]) == 8
    assert result["stopped_early"] and result["best_step"] == 4 and result["eval_metrics"]["loss"] == 2.0
    assert ("Stopped early at step 8: validation loss has not improved for 2 evaluations; keeping the weights of "
            "step 4 (loss 2.0000)") in capsys.readouterr().out
    # The saved model holds the weights of step 4, as accelerate's checkpoint of that step recorded them.
    saved = load_file(tmp_path / "model" / "model.safetensors")
    at_step = {step: load_file(tmp_path / "checkpoints" / f"step_{step}" / "model.safetensors") for step in (4, 8)}
    assert saved.keys() == at_step[4].keys()
    assert all(torch.equal(tensor, at_step[4][name]) for name, tensor in saved.items())
    assert not all(torch.equal(tensor, at_step[8][name]) for name, tensor in saved.items())


@pytest.mark.parametrize("last_loss, best_step", [(1.0, 7), (2.5, 6)], ids=["still-improving", "last-step-worse"])
def test_early_stopping_without_a_stop_saves_the_best_of_all_evaluations(
    last_loss, best_step, corpus, tmp_path, monkeypatch
):
    # Evaluations at steps 2, 4, 6 and, because step 7 ends the run, 7; the loss decreases at each but maybe the last.
    script_evaluations(monkeypatch, (4.0,), (3.0,), (2.0,), (last_loss,))
    result = training_function(tiny_config(
        "tiny", corpus, tmp_path, max_train_steps=7, eval_steps=2, early_stopping_patience=1, checkpointing_steps=1,
        checkpoints_total_limit=20, report_to="none",
    ))
    assert result["completed_steps"] == 7 and not result["stopped_early"] and result["best_step"] == best_step
    assert result["eval_metrics"]["loss"] == min(2.0, last_loss)
    saved = load_file(tmp_path / "model" / "model.safetensors")
    at_best_step = load_file(tmp_path / "checkpoints" / f"step_{best_step}" / "model.safetensors")
    assert all(torch.equal(tensor, at_best_step[name]) for name, tensor in saved.items())


def test_early_stopping_of_probes_watches_their_mean_loss(pretrain_run, corpus, tmp_path, monkeypatch):
    # (joint, probe 0, probe 1): the probes' mean improves at step 2 (3.5 < 4.0) and not at step 3 (3.95). Watching
    # the joint loss would stop at step 2 (6.0 > 5.0), watching probe 0 alone would not stop at step 3 (2.9 < 3.0).
    script_evaluations(monkeypatch, (5.0, 4.0, 4.0), (6.0, 3.0, 4.0), (4.0, 2.9, 5.0), (4.0, 2.0, 2.0))
    result = training_function(tiny_config(
        "tiny_probe", corpus, tmp_path, pretrained_model=pretrain_run["model_dir"], max_train_steps=5, eval_steps=1,
        early_stopping_patience=1, checkpointing_steps=100, report_to="none",
    ))
    assert result["completed_steps"] == 3 and result["stopped_early"] and result["best_step"] == 2
    assert result["eval_metrics"]["probe_0_loss"] == 3.0


def test_early_stopping_counts_only_decreases_beyond_the_threshold():
    stopping = EarlyStopping(patience=2, threshold=0.1)
    weight = torch.nn.Parameter(torch.zeros(3))
    for step, loss in enumerate((3.0, 2.95, 2.85, 2.80, 2.78), start=1):  # only 2.85 beats the best by over 0.1
        weight.data.fill_(step)
        stopping.update(loss, step, {"loss": loss}, lambda: {"weight": weight.detach(), "tied": weight.detach()})
        assert stopping.should_stop == (step == 5)
    assert stopping.best_step == 3 and stopping.best_loss == 2.85 and stopping.best_metrics == {"loss": 2.85}
    # A copy of the weights of step 3, not a view of the live ones; tied weights still share one tensor.
    assert torch.equal(stopping.best_state["weight"], torch.full((3,), 3.0))
    assert stopping.best_state["tied"] is stopping.best_state["weight"]


def test_recipe_and_command_line_override_defaults(pretrain_run, corpus):
    defaults = TwoTowerTrainingConfig()
    recipe = yaml.safe_load((REPO_ROOT / "training" / "recipes" / "tiny.yaml").read_text())
    config = load_config("tiny", ["--learning_rate", "0.5", "--max_train_steps", "7"])
    assert defaults.max_train_steps is None and recipe["max_train_steps"] != 7
    assert config.max_train_steps == 7 and config.learning_rate == 0.5  # command line over recipe
    assert config.num_warmup_steps == recipe["num_warmup_steps"] != defaults.num_warmup_steps  # recipe over default
    assert config.adam_beta2 == defaults.adam_beta2 == 0.98  # default where neither sets it
    # The resolved config is saved with the model, and reruns as a recipe.
    saved_path = Path(pretrain_run["model_dir"]) / "training_config.yaml"
    saved = yaml.safe_load(saved_path.read_text())
    assert saved.pop("optimizer") == ("AdamW, learning rate 0.003, betas (0.9, 0.98), eps 1e-08, weight decay 0.01 "
                                      "(not on norms and biases), gradient clipping 1")  # the run's record
    assert saved.pop("precision") == "no"  # Accelerate's, on the CPU with no mixed precision asked for
    assert saved == dataclasses.asdict(pretrain_run["config"])
    assert load_config(str(saved_path)) == dataclasses.replace(pretrain_run["config"], recipe=str(saved_path))


def test_optimizer_decays_weights_but_not_norms_or_biases(pretrain_run):
    model = AutoModelForCausalLM.from_pretrained(pretrain_run["model_dir"])
    model.probes.requires_grad_(False)
    decay, no_decay = weight_decay_groups(model, 0.01)
    names = {id(param): name for name, param in model.named_parameters()}
    assert all("norm" not in names[id(p)] and not names[id(p)].endswith("bias") for p in decay["params"])
    assert all("norm" in names[id(p)] or names[id(p)].endswith("bias") for p in no_decay["params"])
    trainable = [param for param in model.parameters() if param.requires_grad]  # the tied embedding once
    assert len(decay["params"]) + len(no_decay["params"]) == len(trainable)


@pytest.mark.parametrize(
    "architecture",
    [
        dict(),
        dict(embedding_size=64),
        dict(cooperative=False),
    ],
    ids=["transformer", "tower-wide-embedding", "independent-towers-control"],
)  # every tower kind: tests/modeling/test_kind_conformance.py
def test_flops_per_token_counts_every_matmul_weight(architecture):
    config = modeling_twotower.TwoTowerConfig.from_preset("tiny", vocab_size=320, **architecture)
    model = modeling_twotower.TwoTowerForCausalLM(config)
    block_size = 128

    # Independently: the weights of every matmul a token goes through; embedding lookups are free, biases and
    # norms negligible, and the tied decoder counts once, as lm_head.
    def matmul_weights(prefixes):
        return sum(
            param.numel() for name, param in model.named_parameters()
            if name.startswith(prefixes) and "weight" in name and "embed_" not in name and "norm" not in name
        )

    tied_decoder = model.lm_head.decoder.weight.numel() if config.cooperative else 0
    trained = matmul_weights(("model.", "lm_head.")) + tied_decoder
    attention = 2 * 2 * 64 * block_size  # layers * towers * width * context
    assert flops_per_token(model, block_size, "pretrain") == 6 * trained + 12 * attention
    # The probe phase caches the frozen towers' features once: a step trains only the probes, every replica.
    assert flops_per_token(model, block_size, "probe") == 6 * matmul_weights(("probes.",))
    for replicas, probe_type in ((3, "mlp"), (2, "linear")):
        model.reset_probes(replicas, probe_type)
        assert flops_per_token(model, block_size, "probe") == 6 * matmul_weights(("probes.",))


def test_a_compiled_model_is_saved_under_its_own_parameter_names():
    model = modeling_twotower.TwoTowerForCausalLM(modeling_twotower.TwoTowerConfig.from_preset("tiny", vocab_size=64))
    compiled = torch.compile(model)  # wrapping only: nothing is compiled until it runs
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    phase = make_phase(load_config("tiny"))
    saved_model, state_dict = phase.final_model_and_state_dict(Accelerator(cpu=True), model, compiled)
    assert saved_model is model
    # every parameter under its own name; the tied decoder once, as its source model.embed_tokens.weight
    assert state_dict.keys() == model.state_dict().keys() - {"lm_head.decoder.weight"}


def test_push_to_hub_uploads_the_final_folder(corpus, tmp_path, monkeypatch, capsys, caplog):
    secret = "hf_not_a_real_token_4c1d"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # offline, an upload is refused
    writer = {"name": "someone", "auth": {"accessToken": {"role": "write"}}}  # the Hub accepts the token
    monkeypatch.setattr(HfApi, "whoami", lambda self, token: writer)
    calls = {}
    commit = CommitInfo(
        commit_url="https://huggingface.co/someone/tiny-twotower/commit/0123abc", commit_message="Upload",
        commit_description="", oid="0123abc",
    )
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: calls.setdefault(
        "create_repo", (repo_id, kwargs)) and RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kwargs: calls.setdefault("upload_folder", kwargs) and commit)
    result = training_function(tiny_config(
        "tiny", corpus, tmp_path, max_train_steps=2, max_train_blocks=16, report_to="none", push_to_hub=True,
        hub_model_id="someone/tiny-twotower", hub_private_repo=True,
    ))
    repo_id, create_kwargs = calls["create_repo"]
    assert repo_id == "someone/tiny-twotower"
    assert create_kwargs["private"] is True and create_kwargs["exist_ok"] is True
    assert calls["upload_folder"]["repo_id"] == "someone/tiny-twotower"
    assert calls["upload_folder"]["folder_path"] == result["model_dir"]
    captured = capsys.readouterr()
    assert "https://huggingface.co/someone/tiny-twotower" in captured.out
    assert secret not in captured.out + captured.err + caplog.text


def test_push_to_hub_without_a_token_fails_before_training(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    config = tiny_config("tiny", corpus, tmp_path / "run", push_to_hub=True, hub_model_id="someone/tiny-twotower")
    with pytest.raises(RuntimeError, match="needs a Hugging Face token"):
        training_function(config)
    assert not (tmp_path / "run").exists()  # nothing was trained


@pytest.fixture
def not_a_two_tower_model(tmp_path) -> str:
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return str(tmp_path / "gpt2")


BAD_INPUTS = {
    "missing train file": (dict(train_file="/nonexistent/train.txt"), FileNotFoundError, "does not exist"),
    "empty train file": (dict(train_file="{tmp}/empty.txt"), ValueError, "Empty data file"),
    "no block after tokenization": (dict(train_file="{tmp}/short.txt"), ValueError, "no block of block_size=32"),
    "block larger than positions": (dict(block_size=129), ValueError, "exceeds the model's max_position_embeddings"),
    "probe of a folder without a model": (dict(phase="probe", pretrained_model="{tmp}"), FileNotFoundError,
                                          "has no config.json"),
    "missing checkpoint (latest)": (dict(resume_from_checkpoint="latest"), TwoTowerUserError, "no checkpoint in"),
    "missing checkpoint (path)": (dict(resume_from_checkpoint="{tmp}/step_5"), TwoTowerUserError,
                                  "is not a checkpoint folder"),
    "hub push without a repository": (dict(push_to_hub=True), ValueError, "hub_model_id"),
    "unknown phase": (dict(phase="finetune"), ValueError, "`phase` is 'finetune'"),
    "early stopping patience 0": (dict(early_stopping_patience=0), ValueError,
                                  "`early_stopping_patience` must be >= 1"),
    "early stopping without evaluations": (dict(early_stopping_patience=3, eval_steps=0), ValueError,
                                           "needs `--eval_steps N`"),
    "no probe replica": (dict(phase="probe", pretrained_model="{tmp}", probe_replicas=0), ValueError,
                         "`probe_replicas` must be >= 1"),
    "unknown probe type": (dict(phase="probe", pretrained_model="{tmp}", probe_type="cubic"), ValueError,
                           "`probe_type` is 'cubic'"),
    "probe options when pretraining": (dict(probe_replicas=4, probe_type="linear"), ValueError,
                                       "--probe_replicas 4, --probe_type linear only apply to the probe phase"),
    "linear probes without an iteration budget": (
        dict(phase="probe", pretrained_model="{tmp}", probe_type="linear", max_train_steps=0), ValueError,
        "set --max_train_steps N",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_fails_fast_with_a_clear_message(case, corpus, tmp_path):
    overrides, error, message = BAD_INPUTS[case]
    (tmp_path / "empty.txt").touch()
    (tmp_path / "short.txt").write_text("Far too short for one block.\n")
    overrides = {name: str(value).format(tmp=tmp_path) for name, value in overrides.items()}
    with pytest.raises(error, match=message):
        training_function(tiny_config("tiny", corpus, tmp_path / "run", report_to="none", **overrides))
    assert not (tmp_path / "run" / "model").exists()


def test_probe_phase_rejects_other_models_and_larger_tokenizers(
    pretrain_run, corpus, not_a_two_tower_model, gpt2_tokenizer_dir, tmp_path
):
    with pytest.raises(ValueError, match="not a two-tower model"):
        training_function(tiny_config("tiny_probe", corpus, tmp_path, pretrained_model=not_a_two_tower_model))
    with pytest.raises(ValueError, match="50257 tokens but the model's vocabulary has 512"):
        training_function(tiny_config(
            "tiny_probe", corpus, tmp_path, pretrained_model=pretrain_run["model_dir"],
            tokenizer_name_or_path=gpt2_tokenizer_dir,
        ))


def test_the_run_holds_only_what_every_phase_has():
    # a phase builds and holds its own data, optimizer and loss; the run the loop reads carries none of them
    fields = {field.name for field in dataclasses.fields(TrainingRun)}
    phase_state = {"caches", "positions_per_step", "train_dataloader", "eval_dataloader", "optimizer", "loss_function",
                   "tokens_per_batch", "eval_chunk"}
    assert not fields & phase_state
    # the phases share the paper's AdamW; one that trains with another optimizer says its state and description
    optimizer = {"make_optimizer", "optimizer_state_copies", "optimizer_description"}
    assert optimizer <= set(vars(TrainingPhase)) and optimizer <= set(vars(LinearProbePhase))
    assert not optimizer & set(vars(PretrainPhase))
