"""The probe phase on cached features: replicas, their data orders, early stopping, linear probes, resuming.

The frozen model is a tiny untrained two-tower model (its features still tell tokens apart, so probes learn) with a
BPE of 320 tokens trained on a slice of WikiText-2; every run takes seconds.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.training.arguments import TwoTowerTrainingConfig, load_config
from twotower.training.data.blocks import load_raw_datasets, tokenize_and_group
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.data.objectives import make_collators, predicting_positions, prediction_targets
from twotower.training.phases.replica_sampling import replica_orders, step_positions
from twotower.training.feature_cache.probe_cache import FeatureCache, build_feature_cache
from twotower.training.data.tokenizer import load_tokenizer, train_bpe_tokenizer
from twotower.training.train import training_function
from twotower.training.phases.validation import evaluate_cached
from conftest import HANG_LIMIT_S
from test_training import assert_resumed_run_ends_bitwise_equal, wikitext_slice

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 320  # ln(320) = 5.77 nats for a uniform guess
BLOCK_SIZE = 32
TRAIN_BLOCKS, EVAL_BLOCKS = 64, 16  # 64 x 31 next-token positions: 8 steps of 8 blocks' positions per epoch
TINY_MODEL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                  max_position_embeddings=BLOCK_SIZE)  # fmt: skip


def sliced_corpus_with_tokenizer(folder: Path, shared_data: Path, train_chars: int, validation_chars: int) -> dict:
    """`wikitext_slice` and a BPE of VOCAB_SIZE tokens (with <mask>) trained on its train text (`tokenizer`)."""
    corpus = wikitext_slice(folder, shared_data, train_chars, validation_chars)
    lines = Path(corpus["train_file"]).read_text(encoding="utf-8").splitlines()
    train_bpe_tokenizer(iter([lines]), VOCAB_SIZE, masked=True).save_pretrained(folder / "tokenizer")
    return {**corpus, "tokenizer": str(folder / "tokenizer")}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, shared_data) -> dict:
    """100 kB of WikiText-2 train and 20 kB of validation, and a BPE (with <mask>) trained on the slice."""
    return sliced_corpus_with_tokenizer(tmp_path_factory.mktemp("wikitext-2-probes"), shared_data, 100_000, 20_000)


def saved_model(corpus, folder: Path, model_class, **overrides) -> str:
    """A new tiny model (TINY_MODEL, then `overrides`) saved with the corpus' tokenizer, as a pretrain run would
    leave it."""
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, **{**TINY_MODEL, **overrides})
    model_class(config).save_pretrained(folder)
    load_tokenizer(corpus["tokenizer"]).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def causal_model(corpus, tmp_path_factory) -> str:
    return saved_model(corpus, tmp_path_factory.mktemp("causal"), TwoTowerForCausalLM)


def probe_config(model_dir: str, corpus: dict, output_dir: Path, **overrides) -> TwoTowerTrainingConfig:
    options = dict(
        phase="probe", pretrained_model=model_dir, output_dir=str(output_dir), train_file=corpus["train_file"],
        validation_file=corpus["validation_file"], block_size=BLOCK_SIZE, max_train_blocks=TRAIN_BLOCKS,
        max_eval_blocks=EVAL_BLOCKS, per_device_train_batch_size=8, per_device_eval_batch_size=16,
        learning_rate=1e-2, num_warmup_steps=2, probe_replicas=2, cpu=True, report_to="none", disable_tqdm=True,
        peak_tflops=1.0, logging_steps=100,
    )  # fmt: skip
    return TwoTowerTrainingConfig(**{**options, **overrides})


@pytest.fixture(scope="session")
def replica_run(causal_model, corpus, tmp_path_factory) -> dict:
    # 3 epochs of 8 steps; checkpoints every 4 steps, so step 12 is mid-epoch (epoch 1, 4 steps in)
    config = probe_config(causal_model, corpus, tmp_path_factory.mktemp("replicas"), num_train_epochs=3,
                          eval_steps=8, checkpointing_steps=4, checkpoints_total_limit=10)  # fmt: skip
    return {"config": config, **training_function(config)}


def blocks(model_dir: str, text_file: str, num_blocks: int) -> torch.Tensor:
    """The first `num_blocks` blocks of a text file, as the training command cuts them: [blocks, BLOCK_SIZE]."""
    lm_dataset = tokenize_and_group(load_raw_datasets("unused", None, text_file), load_tokenizer(model_dir), BLOCK_SIZE)
    return torch.tensor(lm_dataset["train"]["input_ids"][:num_blocks])


def replica_losses(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Each probe's mean next-token NLL over `input_ids`, computed directly: [towers, replicas]."""
    with torch.no_grad():
        return -model.probe_logprobs(input_ids, all_replicas=True).mean(dim=(-2, -1))


def test_replicas_differ_and_each_learns(replica_run):
    assert replica_run["completed_steps"] == len(replica_run["train_losses"]) == 24
    # The loss sums the 4 probes' means; each starts near a uniform guess.
    assert replica_run["train_losses"][0] == pytest.approx(4 * math.log(VOCAB_SIZE), abs=0.4)
    metrics = replica_run["eval_metrics"]
    for tower in (0, 1):
        replicas = [metrics[f"probe_{tower}_replica_{replica}_loss"] for replica in (0, 1)]
        assert all(loss < math.log(VOCAB_SIZE) - 0.8 for loss in replicas)  # each learned
        assert replicas[0] != replicas[1]  # own initial weights, own data order: own results
        assert metrics[f"probe_{tower}_loss"] == pytest.approx(sum(replicas) / 2)
    decoder = load_file(Path(replica_run["model_dir"]) / "model.safetensors")["probes.decoder.weight"]
    assert decoder.shape == (4, TINY_MODEL["hidden_size"], VOCAB_SIZE)
    assert not torch.allclose(decoder[0], decoder[1], atol=1e-3)  # tower 0's replicas
    # The run records which probes trained together (replica r of each tower), and still reruns as a recipe.
    saved_config = Path(replica_run["model_dir"]) / "training_config.yaml"
    records = yaml.safe_load(saved_config.read_text())
    runs = records["probe_runs"]
    assert runs["runs"] == [[0, 2], [1, 3]] and runs["probe_index"] == "tower * probe_replicas + replica"
    assert records["optimizer"] == ("AdamW, learning rate 0.01, betas (0.9, 0.98), eps 1e-08, weight decay 0.01 (not "
                                    "on norms and biases), gradient clipping 1")  # for the model card
    assert load_config(str(saved_config)) == dataclasses.replace(replica_run["config"], recipe=str(saved_config))


def test_saved_model_reloads_every_replica_with_its_evaluated_loss(replica_run, corpus):
    model = AutoModelForCausalLM.from_pretrained(replica_run["model_dir"]).eval()
    assert model.config.probe_replicas == 2 and model.config.num_probes == 4
    losses = replica_losses(model, blocks(replica_run["model_dir"], corpus["validation_file"], EVAL_BLOCKS))
    for tower in (0, 1):
        for replica in (0, 1):
            reported = replica_run["eval_metrics"][f"probe_{tower}_replica_{replica}_loss"]
            assert losses[tower, replica].item() == pytest.approx(reported, rel=1e-5)


@pytest.mark.parametrize("storage", ["memory", "disk"])
@pytest.mark.parametrize(
    "family", ["causal", "masked", "elmo"], ids=["causal-every-next-token", "masked-positions", "elmo-every-token"]
)
def test_cached_features_equal_the_backbone_recomputed(family, storage, corpus, tmp_path):
    model_class, objective, overrides = {
        "causal": (TwoTowerForCausalLM, "causal", {}),
        "masked": (TwoTowerForMaskedLM, "masked", {}),
        "elmo": (TwoTowerForMaskedLM, "masked", dict(tower_type="lstm", lstm_hidden_size=48)),
    }[family]
    model_dir = saved_model(corpus, tmp_path / "model", model_class, **overrides)
    model = model_class.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    train_collator, _ = make_collators(objective, model.model.towers, tokenizer, 0.15, seed=5)
    dataset = tokenize_and_group(load_raw_datasets("unused", None, corpus["train_file"]), tokenizer, BLOCK_SIZE)
    disk_file = tmp_path / "features.bin" if storage == "disk" else None
    cache = build_feature_cache(Accelerator(cpu=True), model, dataset["train"].select(range(12)), train_collator,
                                objective, batch_size=5, disk_file=disk_file)  # fmt: skip
    input_ids = blocks(model_dir, corpus["train_file"], 12)

    # Directly: the towers over all 12 blocks at once, the collator's epoch-0 masks, the predicted positions.
    batch = train_collator([{"input_ids": block} for block in input_ids])
    targets = prediction_targets(batch["labels"], objective)
    predicted = targets != -100
    with torch.no_grad():
        features = predicting_positions(model.probe_features(batch["input_ids"]), objective, seq_dim=2)
    expected_share = {"causal": 1.0, "masked": 0.15, "elmo": 1.0}[family]
    assert predicted.float().mean().item() == pytest.approx(expected_share, abs=0.05)
    assert cache.num_blocks == 12 and torch.equal(cache.targets, targets[predicted])
    torch.testing.assert_close(cache.features.transpose(0, 1), features[:, predicted], rtol=1e-5, atol=1e-5)
    if storage == "disk":  # float32 [positions, towers, hidden] in the file, read back as a memmap
        assert disk_file.stat().st_size == cache.features.numel() * 4


def test_each_replica_reads_its_own_order_shared_by_the_towers():
    orders = replica_orders(seed=3, epoch=0, num_replicas=3, num_blocks=50)  # [replicas, blocks]
    assert all(torch.equal(row.sort().values, torch.arange(50)) for row in orders)  # permutations
    assert all(not torch.equal(orders[a], orders[b]) for a, b in ((0, 1), (0, 2), (1, 2)))
    assert torch.equal(replica_orders(3, 0, 3, 50), orders)  # a function of (seed, epoch, replica) ...
    assert torch.equal(replica_orders(3, 0, 2, 50), orders[:2])  # ... not of how many replicas train
    assert not torch.equal(replica_orders(3, 1, 3, 50)[0], orders[0])  # a new order every epoch

    # 50 blocks of one position each, 2 towers; 4 steps of 12 positions, the last takes the 14 left.
    cache = FeatureCache(torch.randn(50, 2, 4), torch.arange(50) + 100, num_blocks=5)
    batch = cache.replica_batch(step_positions(orders, 1, steps_per_epoch=4, positions_per_step=12))
    assert batch["features"].shape == (6, 12, 4) and batch["targets"].shape == (6, 12)
    for tower in (0, 1):
        for replica in range(3):
            positions = orders[replica, 12:24]
            probe = tower * 3 + replica
            assert torch.equal(batch["targets"][probe], positions + 100)  # replica r's order, in every tower
            assert torch.equal(batch["features"][probe], cache.features[positions, tower])
    assert step_positions(orders, 3, steps_per_epoch=4, positions_per_step=12).shape == (3, 14)


def test_a_step_reads_the_positions_of_each_replicas_next_blocks():
    # 5 blocks of 3, 0, 4, 2 and 3 predicted positions (a masked LM's vary): rows 0-2, none, 3-6, 7-8, 9-11.
    block_starts = torch.tensor([0, 3, 3, 7, 9, 12])
    orders = torch.tensor([[2, 0, 4, 1, 3], [3, 1, 4, 2, 0]])  # [replicas, blocks]
    steps = [step_positions(orders, step, 3, 5, block_starts) for step in range(3)]  # 5, 5, then the 2 left
    assert torch.equal(torch.cat(steps, dim=1), torch.tensor([
        [3, 4, 5, 6, 0, 1, 2, 9, 10, 11, 7, 8],  # blocks 2, 0, 4, (1,) 3 in turn
        [7, 8, 9, 10, 11, 3, 4, 5, 6, 0, 1, 2],  # blocks 3, (1,) 4, 2, 0
    ]))  # fmt: skip
    assert [step.shape[1] for step in steps] == [5, 5, 2]


def test_disjoint_replicas_each_order_their_own_slice():
    orders = replica_orders(seed=3, epoch=0, num_replicas=3, num_blocks=50, disjoint=True)  # 16 blocks each
    assert orders.shape == (3, 16)
    for replica in range(3):  # a permutation of the replica's contiguous slice, blocks 16r to 16r + 15
        assert torch.equal(orders[replica].sort().values, torch.arange(16) + 16 * replica)
    assert not torch.equal(replica_orders(3, 1, 3, 50, disjoint=True), orders)  # a new order every epoch
    # 2 blocks for 3 replicas: one message naming the numbers and the fix
    with pytest.raises(TwoTowerUserError, match="2 training blocks .* into 3 slices"):
        replica_orders(3, 0, 3, 2, disjoint=True)


def test_a_disjoint_step_takes_as_many_positions_of_every_replica():
    # masked-LM-like blocks of 3, 0, 4, 2 predicted positions; replica 0 orders blocks 0-1 (3 rows), replica 1
    # blocks 2-3 (6 rows): the epoch's last step stops at the shorter stream
    block_starts = torch.tensor([0, 3, 3, 7, 9])
    orders = torch.tensor([[1, 0], [3, 2]])
    steps = [step_positions(orders, step, 2, 2, block_starts) for step in range(2)]
    assert torch.equal(torch.cat(steps, dim=1), torch.tensor([[0, 1, 2], [7, 8, 3]]))


def test_disjoint_replicas_train_on_their_own_blocks_only(causal_model, corpus, tmp_path, monkeypatch):
    read = []  # every step's positions, [replicas, n]
    original = FeatureCache.replica_batch
    monkeypatch.setattr(FeatureCache, "replica_batch", lambda cache, positions: read.append(positions) or original(
        cache, positions))
    config = probe_config(causal_model, corpus, tmp_path, probe_replicas=2, probe_replica_data="disjoint",
                          num_train_epochs=2)  # fmt: skip
    result = training_function(config)
    positions = torch.cat(read, dim=1)  # both epochs
    per_block = BLOCK_SIZE - 1  # a causal block predicts all but its first token
    slice_positions = TRAIN_BLOCKS // 2 * per_block
    for replica in (0, 1):
        seen = positions[replica].unique()
        # its slice, all of it: every position of blocks [32r, 32r + 32) read once an epoch
        assert torch.equal(seen, torch.arange(slice_positions) + replica * slice_positions)
    assert positions.shape[1] == 2 * slice_positions
    assert result["completed_steps"] == 2 * math.ceil(slice_positions / (8 * per_block))
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["probe_replicas"] == 2


def test_linear_probes_refuse_disjoint_slices(causal_model, corpus, tmp_path):
    with pytest.raises(TwoTowerUserError, match="--probe_type linear solves every probe over the whole cache"):
        probe_config(causal_model, corpus, tmp_path, probe_type="linear", probe_replica_data="disjoint",
                     max_train_steps=5)


def test_early_stopping_over_epochs_keeps_the_best(causal_model, corpus, tmp_path, monkeypatch, capsys):
    # 16 training blocks (2 steps an epoch) at a high learning rate: the probes overfit within a few epochs.
    evaluations = []
    monkeypatch.setattr("twotower.training.phases.probe.evaluate_cached",
                        lambda *args, **kwargs: evaluations.append(evaluate_cached(*args, **kwargs)) or evaluations[-1])
    result = training_function(probe_config(
        causal_model, corpus, tmp_path, max_train_blocks=16, num_train_epochs=40, learning_rate=3e-2, eval_steps=2,
        early_stopping_patience=3, checkpointing_steps=100,
    ))  # fmt: skip
    monitored = [(metrics["probe_0_loss"] + metrics["probe_1_loss"]) / 2 for metrics in evaluations]
    best = min(range(len(monitored)), key=monitored.__getitem__)
    assert result["stopped_early"] and len(monitored) == best + 4  # 3 evaluations without improvement
    assert result["best_step"] == 2 * (best + 1) < result["completed_steps"] and monitored[-1] > monitored[best]
    assert result["eval_metrics"] == evaluations[best]
    assert f"keeping the weights of step {result['best_step']}" in capsys.readouterr().out
    # The saved probes are the best evaluation's: recomputed here, their validation losses are the ones it reported.
    model = AutoModelForCausalLM.from_pretrained(result["model_dir"]).eval()
    losses = replica_losses(model, blocks(result["model_dir"], corpus["validation_file"], EVAL_BLOCKS))
    assert losses.mean().item() == pytest.approx(monitored[best], rel=1e-5)


@pytest.fixture(scope="session")
def linear_run(causal_model, corpus, tmp_path_factory) -> dict:
    config = probe_config(causal_model, corpus, tmp_path_factory.mktemp("linear"), probe_type="linear",
                          max_train_steps=300, checkpointing_steps=1000)  # fmt: skip
    return {"config": config, **training_function(config)}


def full_batch_objective(model_dir: str, config: TwoTowerTrainingConfig) -> tuple[float, float]:
    """
    The linear probes' objective at the saved weights, recomputed here on every training position: the sum over
    probes of the mean next-token NLL plus l2/2 * (||W||^2 + ||b||^2). Returns (objective, largest gradient entry).
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    input_ids = blocks(model_dir, config.train_file, TRAIN_BLOCKS)
    with torch.no_grad():
        features = model.probe_features(input_ids)[:, :, :-1]  # [towers, blocks, seq - 1, hidden]
    logits = model.probes.logits(features)  # [probes, blocks, seq - 1, vocab]
    targets = input_ids[:, 1:].flatten().repeat(model.config.num_probes)
    nll = F.cross_entropy(logits.flatten(0, 2), targets, reduction="sum") / input_ids[:, 1:].numel()
    objective = nll + config.probe_l2 / 2 * sum(param.square().sum() for param in model.probes.parameters())
    gradients = torch.autograd.grad(objective, list(model.probes.parameters()))
    return objective.item(), max(gradient.abs().max().item() for gradient in gradients)


def test_linear_probe_replicas_reach_one_optimum(linear_run, corpus):
    config = linear_run["config"]
    assert linear_run["completed_steps"] < config.max_train_steps  # stopped at the tolerance
    model = AutoModelForCausalLM.from_pretrained(linear_run["model_dir"]).eval()
    assert model.config.probe_type == "linear" and not hasattr(model.probes, "dense")
    objective, largest_gradient = full_batch_objective(linear_run["model_dir"], config)
    assert largest_gradient <= 1.5 * config.probe_tolerance  # at the optimum, up to the tolerance (float32 sums)
    assert objective == pytest.approx(linear_run["train_losses"][-1], rel=1e-5)
    # The run records its optimizer for the model card: L-BFGS, not the AdamW of the MLP probes.
    records = yaml.safe_load((Path(linear_run["model_dir"]) / "training_config.yaml").read_text())
    assert records["optimizer"].startswith("L-BFGS (strong-Wolfe line search, history 10, lr 1, no schedule)")
    assert "L2 penalty 0.001" in records["optimizer"] and "exceeds 0.0001" in records["optimizer"]

    # Two replicas from different initial weights end at the same probe: per position and per token type.
    input_ids = blocks(linear_run["model_dir"], corpus["validation_file"], EVAL_BLOCKS)
    with torch.no_grad():
        logprobs = model.probe_logprobs(input_ids, all_replicas=True)  # [towers, replicas, blocks, seq - 1]
    targets = input_ids[:, 1:]
    for tower in (0, 1):
        assert (logprobs[tower, 0] - logprobs[tower, 1]).abs().max().item() < 1e-2
        for token in targets.unique():
            per_type = logprobs[tower, :, targets == token].mean(dim=-1)  # [replicas]
            # two orders of magnitude below the MLP probes' replica spread per type (~0.3 nats)
            assert (per_type[0] - per_type[1]).abs().item() < 5e-3


def test_resumed_replica_run_ends_bitwise_equal(replica_run, tmp_path):
    checkpoint = Path(replica_run["config"].output_dir) / "checkpoints" / "step_12"
    assert json.loads((checkpoint / "progress.json").read_text()) == {
        "completed_steps": 12, "epoch": 1, "batches_into_epoch": 4, "steps_per_epoch": 8
    }
    resumed = training_function(dataclasses.replace(
        replica_run["config"], output_dir=str(tmp_path), resume_from_checkpoint=str(checkpoint)
    ))
    assert_resumed_run_ends_bitwise_equal(resumed, replica_run, from_step=12)


@pytest.mark.slow
def test_two_processes_train_the_same_linear_probes(linear_run, tmp_path):
    # Each process caches half the blocks; L-BFGS sums loss and gradient over both, so the optimum is the same.
    config = dataclasses.replace(linear_run["config"], output_dir=str(tmp_path))
    cli_args = [f"--{name}={value}" for name, value in dataclasses.asdict(config).items() if value is not None]
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "twotower.training.train",
         *cli_args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_LIMIT_S,
    )
    assert launched.returncode == 0, launched.stderr[-4000:]
    # The probes of the 2-process run are at the optimum of the objective over ALL training positions, not over
    # one process's half; its value is the 1-process run's up to the tolerance.
    objective, largest_gradient = full_batch_objective(str(tmp_path / "model"), config)
    assert largest_gradient <= 1.5 * config.probe_tolerance
    assert objective == pytest.approx(full_batch_objective(linear_run["model_dir"], config)[0], rel=2e-4)
