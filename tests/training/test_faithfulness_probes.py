"""The probe phase against the reference code (hezq06/twotower_lm), which trained one probe per run.

With --probe_grad_clipping per_probe, probes trained together in one run equal probes trained each in a run of its
own: same initial weights, same data order, same optimizer, schedule, weight decay and clipping. One gradient norm
over all probes (joint, the tiny recipes') couples them.
"""

import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from transformers import get_scheduler

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerProbes
from twotower.training.arguments import TwoTowerTrainingConfig
from twotower.training.optim.optimization import train_step
from twotower.training.phases import ProbesOnPositions, make_phase
from twotower.training.data.blocks import collate_blocks
from twotower.training.phases.replica_sampling import replica_orders, step_positions
from twotower.training.feature_cache.probe_cache import FeatureCache, backbone_dropout, cache_both_splits

VOCAB_SIZE, HIDDEN_SIZE = 37, 16
NUM_REPLICAS = 2  # probes per tower; 2 towers -> 4 probes
NUM_POSITIONS, POSITIONS_PER_STEP, EPOCHS = 120, 20, 2  # 6 steps an epoch
MAX_GRAD_NORM = 2.0


def probe_phase_config(clipping: str) -> TwoTowerTrainingConfig:
    return TwoTowerTrainingConfig(
        phase="probe", pretrained_model="unused", learning_rate=3e-2, num_warmup_steps=2, weight_decay=0.1,
        weight_decay_exclude="tower_norms_and_biases", max_grad_norm=MAX_GRAD_NORM, probe_grad_clipping=clipping,
    )  # fmt: skip


def model_config() -> TwoTowerConfig:
    return TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, num_attention_heads=2)


def initial_probes() -> TwoTowerProbes:
    """4 probes (2 towers x 2 replicas) with the model's initialisation, tower 1's with 8x larger decoder weights."""
    torch.manual_seed(0)
    probes = TwoTowerForCausalLM(model_config()).reset_probes(NUM_REPLICAS)
    with torch.no_grad():
        probes.decoder.weight[NUM_REPLICAS:] *= 8.0  # larger gradients: tower 1's probes are clipped, tower 0's not
    return probes


def alone(probes: TwoTowerProbes, probe: int) -> TwoTowerProbes:
    """Probe `probe` of `probes` as the only probe of a run, as the reference trained it."""
    config = model_config()
    config.num_towers = 1  # one probe: the probes module reads only the count
    single = TwoTowerProbes(config, num_replicas=1)
    with torch.no_grad():
        for param, source in zip(single.parameters(), probes.parameters()):
            param.copy_(source[probe : probe + 1])  # every probe weight is batched along dim 0
    return single


def batches() -> list[dict]:
    """The run's steps: each replica's own order of the cached positions, for the probes of every tower."""
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(NUM_POSITIONS, 2, HIDDEN_SIZE, generator=generator)  # [positions, towers, hidden]
    cache = FeatureCache(features, torch.randint(VOCAB_SIZE, (NUM_POSITIONS,), generator=generator), num_blocks=6)
    steps_per_epoch = NUM_POSITIONS // POSITIONS_PER_STEP
    return [
        cache.replica_batch(step_positions(replica_orders(7, epoch, NUM_REPLICAS, NUM_POSITIONS), step,
                                           steps_per_epoch, POSITIONS_PER_STEP))  # fmt: skip
        for epoch in range(EPOCHS)
        for step in range(steps_per_epoch)
    ]


def train(probes: TwoTowerProbes, steps: list[dict], clipping: str = "per_probe") -> list[float]:
    """The probe phase's optimizer steps (optimization.train_step) over `steps`; returns each step's gradient norm."""
    config, accelerator = probe_phase_config(clipping), Accelerator(cpu=True)
    trained = ProbesOnPositions(probes, clip_per_probe=config.probe_grad_clipping == "per_probe")
    phase = make_phase(config)
    optimizer = phase.make_optimizer(trained)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=config.num_warmup_steps,
                              num_training_steps=len(steps))  # fmt: skip
    loss_function = phase.loss_function(trained)
    norms = []
    for batch in steps:
        _, grad_norm, _ = train_step(accelerator, trained, [batch], loss_function, optimizer, scheduler,
                                     config.max_grad_norm, "causal")  # fmt: skip
        norms.append(float(grad_norm))
    return norms


def run_apart(steps: list[dict]) -> tuple[list[TwoTowerProbes], list[list[float]]]:
    initial = initial_probes()
    singles = [alone(initial, probe) for probe in range(initial.num_probes)]
    norms = [train(single, [{name: value[probe : probe + 1] for name, value in batch.items()} for batch in steps])
             for probe, single in enumerate(singles)]  # fmt: skip
    return singles, norms


def assert_equal_to_runs_apart(together: TwoTowerProbes, apart: list[TwoTowerProbes]) -> None:
    for probe, single in enumerate(apart):
        for (name, param), (_, single_param) in zip(together.named_parameters(), single.named_parameters()):
            torch.testing.assert_close(param[probe : probe + 1], single_param, rtol=1e-5, atol=1e-6, msg=name)


def test_probes_trained_together_equal_probes_trained_in_runs_of_their_own():
    steps = batches()
    apart, norms_apart = run_apart(steps)
    first_norms = [norms[0] for norms in norms_apart]
    assert min(first_norms) < MAX_GRAD_NORM < max(first_norms)  # clipping scaled some probes' steps, not others
    together = initial_probes()
    norms_together = train(together, steps)
    assert_equal_to_runs_apart(together, apart)
    # the norm reported for the joint step is that of all probes' gradients before clipping
    assert norms_together[0] == pytest.approx(sum(norm**2 for norm in first_norms) ** 0.5, rel=1e-5)
    moved = [(param - initial).abs().max().item() for param, initial in zip(together.parameters(),
                                                                          initial_probes().parameters())]
    assert min(moved) > 1e-3  # every parameter trained (weight decay included)


def test_one_norm_over_all_probes_couples_them():
    # joint clipping: the norm of all probes' gradients together, so tower 1's large gradients shrink tower 0's steps
    steps = batches()
    together = initial_probes()
    train(together, steps, clipping="joint")
    apart, _ = run_apart(steps)
    with pytest.raises(AssertionError):
        assert_equal_to_runs_apart(together, apart)


def test_backbone_dropout_draws_once_per_block_from_the_seed_for_the_training_features_only(tmp_path):
    model = TwoTowerForCausalLM(model_config()).eval()  # hidden and attention dropout 0.1
    input_ids = torch.randint(VOCAB_SIZE, (6, 12), generator=torch.Generator().manual_seed(2))  # 6 blocks of 12
    blocks = Dataset.from_dict({"input_ids": input_ids.tolist()})
    lm_datasets = DatasetDict({"train": blocks, "validation": blocks})

    def cached(dropout: bool, seed: int = 42) -> dict:
        config = TwoTowerTrainingConfig(phase="probe", pretrained_model="unused", output_dir=str(tmp_path),
                                        per_device_eval_batch_size=4, seed=seed, probe_backbone_dropout=dropout)
        return cache_both_splits(Accelerator(cpu=True), model, lm_datasets, (collate_blocks, collate_blocks),
                                 "causal", config)  # fmt: skip

    without, with_dropout = cached(False), cached(True)
    assert not model.training  # back in eval mode
    torch.testing.assert_close(with_dropout["validation"].features, without["validation"].features, rtol=0, atol=0)
    assert torch.equal(with_dropout["train"].targets, without["train"].targets)
    difference = (with_dropout["train"].features - without["train"].features).abs()
    assert difference.max() > 0.1  # dropout on: features of a 0.1 dropout, not rounding
    assert torch.equal(cached(True)["train"].features, with_dropout["train"].features)  # a function of the seed
    assert not torch.equal(cached(True, seed=7)["train"].features, with_dropout["train"].features)
    rng_state = torch.get_rng_state()
    with backbone_dropout(model, seed=42, device=torch.device("cpu")):
        assert model.training
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), rng_state) and not model.training  # the run's RNG as before
