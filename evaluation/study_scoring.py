"""
Score one study run on one text: two probe sets of the same frozen model, every prediction once, and the tower
preference of each pair of probes (two-tower, its replica with the other probe seed, and the same-tower noise
floor of each tower).
"""

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader

from twotower.training.atomic import write_text_atomically
from twotower.training.data import collate_blocks
from twotower.training.objectives import objective_of
from twotower.training.tokenizer import load_tokenizer

from .report import write_report
from .score import DTYPES, ScoringArguments, load_blocks, load_model, masking_description, stream_gold_logprobs
from .tower_preference.preference_stats import PreferenceAccumulator, compare_preferences


SCORES_JSON = "scores.json"
SUMMARY_FIELDS = (
    "global_offset_nats",
    "type_share_preferring",
    "occurrence_share_preferring",
    "mean_abs_preference_nats",
    "num_eligible_types",
    "num_significant",
    "significant_share",
    "split_half_consistency",
    "bimodality_coefficient",
)


def probe_pairs(num_towers: int) -> dict[str, list[tuple[int, int]]]:
    """
    Name -> the (probe set, tower) of each compared probe; set 0 is probe set A, set 1 probe set B.

    Probes of one set share their training run (seed, data order, stopping step), and so part of their noise; the
    noise floor compares probes of two runs. `towers_across_runs` takes neighbouring towers from different sets,
    so that it differs from the floor only in comparing two towers instead of one.
    """
    pairs = {
        "towers": [(0, tower) for tower in range(num_towers)],
        "towers_replica": [(1, tower) for tower in range(num_towers)],
        "towers_across_runs": [(tower % 2, tower) for tower in range(num_towers)],
    }
    for tower in range(num_towers):
        pairs[f"same_tower_{tower}"] = [(0, tower), (1, tower)]
    return pairs


def evenly_spaced_blocks(blocks, max_blocks: int | None):
    """At most max_blocks blocks spread evenly over the text (the first N would all come from its first file)."""
    if max_blocks is None or len(blocks) <= max_blocks:
        return blocks
    return blocks.select(np.linspace(0, len(blocks) - 1, max_blocks).round().astype(int).tolist())


def check_same_backbone(models, probe_dirs):
    """Both probe sets must sit on the same frozen model, or the floor compares two different towers."""
    reference = models[0].state_dict()
    for model, probe_dir in zip(models[1:], probe_dirs[1:]):
        for name, value in model.state_dict().items():
            if not name.startswith("probes.") and not torch.equal(value, reference[name]):
                raise ValueError(
                    f"{probe_dir} and {probe_dirs[0]} differ in {name}: probe sets of one study run must be "
                    "trained on the same pretrained model."
                )


def _eligible_preferences(result):
    return result.token_ids[result.eligible], result.preference_nats[:, result.eligible]


def score_run(probe_dirs, output_dir, text_path, max_blocks=None, scoring_options=None) -> dict:
    """
    Score the probe sets of `probe_dirs` (model folders of two probe runs on one pretrained model) on a text;
    write one report folder per probe pair under output_dir and return the summary (also output_dir/scores.json).
    Reuses a finished output_dir.
    """
    output_dir = Path(output_dir)
    if (output_dir / SCORES_JSON).is_file():
        return json.loads((output_dir / SCORES_JSON).read_text())
    start = time.perf_counter()
    args = ScoringArguments(
        model_dir=str(probe_dirs[0]), output_dir=str(output_dir), validation_file=text_path, **(scoring_options or {})
    )
    training_config = yaml.safe_load((Path(probe_dirs[0]) / "training_config.yaml").read_text())
    args.block_size = training_config["block_size"]
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    models = [load_model(str(path), DTYPES[args.dtype]).to(device) for path in probe_dirs]
    check_same_backbone(models, probe_dirs)
    config = models[0].config
    tokenizer = load_tokenizer(str(probe_dirs[0]))
    blocks = evenly_spaced_blocks(load_blocks(args, tokenizer), max_blocks)
    dataloader = DataLoader(blocks.with_format("torch"), batch_size=args.batch_size, collate_fn=collate_blocks)

    pairs = probe_pairs(config.num_towers)
    accumulators = {name: PreferenceAccumulator(len(members), config.vocab_size) for name, members in pairs.items()}
    nll_sums, joint_nll_sum, num_predictions = np.zeros((len(models), config.num_towers)), 0.0, 0
    for targets, gold, joint_nll in stream_gold_logprobs(
        models, dataloader, args.probe_chunk_size, args.disable_tqdm, args.mask_passes, tokenizer.mask_token_id
    ):
        for name, members in pairs.items():
            accumulators[name].update(targets, np.stack([gold[probe_set, tower] for probe_set, tower in members]))
        nll_sums -= gold.astype(np.float64).sum(-1)
        joint_nll_sum += joint_nll
        num_predictions += targets.shape[0]

    objective = objective_of(config)
    probe_perplexity = np.exp(nll_sums / num_predictions)  # [sets, towers]
    joint_perplexity = math.exp(joint_nll_sum / num_predictions)
    report = {
        "model": {
            "path": str(Path(probe_dirs[0]).resolve()),
            "probe_dirs": [str(Path(p).resolve()) for p in probe_dirs],
            "num_towers": config.num_towers,
            "tower_type": config.tower_type,
            "cooperative": config.cooperative,
        },
        "data": {
            "description": f"local text {text_path}",
            "validation_file": text_path,
            "block_size": args.block_size,
            "num_blocks": len(blocks),
            "num_predictions": num_predictions,
        },
        "settings": {
            "objective": objective,
            "centered": True,
            "min_count": args.min_count,
            "alpha": args.alpha,
            "masking": masking_description(objective, config.tower_type, args.mask_passes),
        },
    }
    results = {
        name: {
            center: accumulator.compute(alpha=args.alpha, min_count=args.min_count, center=center)
            for center in (True, False)
        }
        for name, accumulator in accumulators.items()
    }
    for name, members in pairs.items():
        centered = results[name][True]
        perplexity = {
            "joint": joint_perplexity,
            "probes": [float(probe_perplexity[probe_set, tower]) for probe_set, tower in members],
        }
        tokens = tokenizer.convert_ids_to_tokens(centered.token_ids.tolist())
        write_report(output_dir / name, {**report, "perplexity": perplexity, "probes": members}, centered, tokens)
    replica = compare_preferences(
        *_eligible_preferences(results["towers"][True]), *_eligible_preferences(results["towers_replica"][True])
    )
    scores = {
        **report,
        "perplexity": {"joint": joint_perplexity, "probe_sets": probe_perplexity.tolist()},
        "pairs": {
            name: {
                kind: {key: results[name][center].summary[key] for key in SUMMARY_FIELDS}
                for kind, center in (("centered", True), ("raw", False))
            }
            for name in pairs
        },
        "replica_correlation": replica["correlation"],
        "replica_num_types": replica["num_shared_types"],
        "seconds": time.perf_counter() - start,
    }
    write_text_atomically(output_dir / SCORES_JSON, json.dumps(scores, indent=2, allow_nan=False) + "\n")
    return scores
