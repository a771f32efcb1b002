"""
How probe training affects the replica-level preference: the same-tower floor, the two-tower difference and the
reliability after 1, 2, 4, ... epochs over the cached features, and how the convex (linear) reference probe's
per-type preference correlates with the MLP probes'.

Each setting is its own probe run on one pretrained model (its full learning-rate schedule, no early stopping),
scored on the validation text. Runs resume: a finished run or score folder is reused.

The main job's model (scripts/train_tiny.sh), 4 replicas per tower, then the linear probe:
    python benchmarks/probe_convergence.py --pretrained_model outputs/tiny/pretrain/model \
        --data_dir ../shared/data/wikitext-2 --output_dir outputs/probe-convergence --epochs 1 2 4 8 --linear
"""

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from twotower.evaluation.scoring.report import eligible_preferences, load_report
from twotower.evaluation.scoring.score import score_model
from twotower.evaluation.tower_preference.comparisons import compare_preferences
from twotower.evaluation.tower_preference.summary import summary_keys
from twotower.training.arguments import load_config
from twotower.training.checkpoints.checkpointing import FINAL_MODEL_DIR
from twotower.training.run.run_folder import continuation_options
from twotower.training.train import training_function

SUMMARY_KEYS = summary_keys(
    "same_tower_floor_nats",
    "two_tower_difference_nats",
    "reliability",
    "reliability_ci",
    "significant_share",
    "occurrence_significant_share",
)


def probe_run(output_dir: Path, options: dict) -> tuple[Path, float | None]:
    """Train one probe run with the tiny_probe recipe and `options` unless its model exists; (model dir, seconds)."""
    model_dir = output_dir / FINAL_MODEL_DIR
    if (model_dir / "config.json").is_file():
        return model_dir, None
    options = {**options, **continuation_options(output_dir)}
    config = dataclasses.replace(load_config("tiny_probe"), output_dir=str(output_dir), **options)
    start = time.perf_counter()
    training_function(config)
    return model_dir, time.perf_counter() - start


def scored(model_dir: Path, report_dir: Path, validation_file: str, max_blocks: int) -> dict:
    if (report_dir / "preference.json").is_file():
        return json.loads((report_dir / "preference.json").read_text())
    return score_model(
        model_dir, report_dir, validation_file=validation_file, max_blocks=max_blocks, center=True, disable_tqdm=True
    )


def row(name: str, report: dict, seconds: float | None) -> dict:
    summary = report["summary"]
    return {"run": name, "probe ppl": report["perplexity"]["probes"], "train s": seconds} | {
        key: summary.get(key) for key in SUMMARY_KEYS
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--pretrained_model", required=True)
    parser.add_argument("--data_dir", required=True, help="folder with train.txt and valid.txt")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--probe_replicas", type=int, default=4)
    parser.add_argument("--max_train_blocks", type=int, default=1024, help="cached blocks (the tiny_probe recipe's)")
    parser.add_argument("--max_score_blocks", type=int, default=512)
    parser.add_argument("--linear", action="store_true", help="also train a linear probe per tower and correlate")
    parser.add_argument("--linear_train_blocks", type=int, default=384, help="a full-batch L-BFGS pass reads all")
    parser.add_argument("--linear_steps", type=int, default=150, help="L-BFGS iterations at most")
    args = parser.parse_args(argv)
    data_dir, output_dir = Path(args.data_dir), Path(args.output_dir)
    data = {
        "pretrained_model": args.pretrained_model,
        "train_file": str(data_dir / "train.txt"),
        "validation_file": str(data_dir / "valid.txt"),
        "max_train_blocks": args.max_train_blocks,
        "probe_replicas": args.probe_replicas,
        "report_to": "none",
        "disable_tqdm": True,
        "checkpointing_steps": None,
    }
    rows, reports = [], {}
    for epochs in args.epochs:
        name = f"mlp-{epochs}-epochs"
        options = {**data, "num_train_epochs": epochs, "early_stopping_patience": None, "eval_steps": None}
        model_dir, seconds = probe_run(output_dir / name, options)
        reports[name] = scored(model_dir, output_dir / f"{name}-report", data["validation_file"], args.max_score_blocks)
        rows.append(row(name, reports[name], seconds))
        print(json.dumps(rows[-1]), flush=True)
    if args.linear:
        options = {
            **data, "probe_type": "linear", "probe_replicas": 1, "max_train_blocks": args.linear_train_blocks,
            "max_train_steps": args.linear_steps, "eval_steps": None, "early_stopping_patience": None,
        }
        model_dir, seconds = probe_run(output_dir / "linear", options)
        reports["linear"] = scored(model_dir, output_dir / "linear-report", data["validation_file"], args.max_score_blocks)
        rows.append(row("linear", reports["linear"], seconds))
        print(json.dumps(rows[-1]), flush=True)
        mlp = f"mlp-{max(args.epochs)}-epochs"
        ids_linear, preference_linear, _ = eligible_preferences(load_report(output_dir / "linear-report")[1])
        ids_mlp, preference_mlp, _ = eligible_preferences(load_report(output_dir / f"{mlp}-report")[1])
        comparison = compare_preferences(ids_linear, preference_linear, ids_mlp, preference_mlp)
        print(
            f"linear vs {mlp}: per-type preference correlation {comparison['correlation']:.3f} over "
            f"{comparison['num_shared_types']} token types",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
