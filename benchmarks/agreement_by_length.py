"""
Why the two measures of preference disagree on the main job: the main job's recipe (tiny pretraining, tiny_probe
probes, the scoring command's defaults) trained for several lengths on several corpora, each model probed and
scored, printing how far the probe-free mean ablation agrees with the probes' per-type preference.

Each (corpus, steps, seed) is its own pretraining run with its full learning-rate schedule (warm-up a tenth of the
steps), as the main job is at 200 steps. Runs resume: a finished pretraining, probe or score folder is reused.

    python benchmarks/agreement_by_length.py --corpus data/tiny-shakespeare ../shared/data/wikitext-2 \
        --steps 200 1000 2000 --output_dir outputs/agreement-by-length --table docs/study/agreement_by_length.json

`--table` keeps the rows (updating those of the same corpus, steps and seed): docs/preference.md's table of them is
generated from that file by `python -m twotower.evaluation.study.summary`.
"""

import argparse
import dataclasses
import json
from pathlib import Path

from twotower.training.utils.atomic import write_text_atomically

from twotower.evaluation.scoring.score import score_model
from twotower.training.arguments import load_config
from twotower.training.checkpoints.checkpointing import FINAL_MODEL_DIR
from twotower.training.run.run_folder import continuation_options
from twotower.training.train import training_function


def trained(recipe: str, output_dir: Path, options: dict) -> Path:
    """Train `recipe` with `options` into `output_dir` unless its final model exists; the model folder."""
    model_dir = output_dir / FINAL_MODEL_DIR
    if not (model_dir / "config.json").is_file():
        options = {**options, **continuation_options(output_dir)}
        training_function(dataclasses.replace(load_config(recipe), output_dir=str(output_dir), **options))
    return model_dir


def scored(model_dir: Path, report_dir: Path, validation_file: str) -> dict:
    if (report_dir / "preference.json").is_file():
        return json.loads((report_dir / "preference.json").read_text())
    return score_model(model_dir, report_dir, validation_file=validation_file, disable_tqdm=True)


def row(corpus: str, steps: int, seed: int, report: dict) -> dict:
    """One run's figures as its report has them (unrounded: the tables that quote them round once)."""
    ablation, summary = report["ablation"], report["summary"]
    return {
        "corpus": corpus,
        "steps": steps,
        "seed": seed,
        "joint ppl": report["perplexity"]["joint"],
        "probe ppl": report["perplexity"]["probes"],
        "probe reliability": summary["reliability"],
        "ablation consistency": ablation["split_half_consistency"],
        "agreement r": ablation["correlation_with_probe_preference"],
        "agreement 95% CI": ablation["correlation_with_probe_preference_ci"],
        "types": ablation["num_eligible_types"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--corpus", nargs="+", required=True, help="folders with train.txt and valid.txt")
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000, 2000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="42 is the main job's seed")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--table", type=Path, help="a JSON file keeping every row measured (created or updated)")
    args = parser.parse_args(argv)
    rows = []
    for corpus in map(Path, args.corpus):
        files = {"train_file": str(corpus / "train.txt"), "validation_file": str(corpus / "valid.txt")}
        quiet = {"report_to": "none", "disable_tqdm": True}
        for steps in args.steps:
            for seed in args.seeds:
                run_dir = Path(args.output_dir) / f"{corpus.name}-{steps}-steps-seed-{seed}"
                pretraining = {
                    **files, **quiet, "seed": seed, "max_train_steps": steps,
                    "num_warmup_steps": steps // 10, "checkpointing_steps": max(100, steps // 4),
                }
                model = trained("tiny", run_dir / "pretrain", pretraining)
                probes = trained("tiny_probe", run_dir / "probe", {**files, **quiet, "pretrained_model": str(model)})
                report = scored(probes, run_dir / "report", files["validation_file"])
                rows.append(row(corpus.name, steps, seed, report))
                print(json.dumps(rows[-1]), flush=True)
                if args.table is not None:
                    keep_row(args.table, rows[-1])
    return rows


def keep_row(table: Path, new: dict) -> None:
    """Add `new` to the kept rows of `table`, replacing a row of the same corpus, steps and seed."""
    key = (new["corpus"], new["steps"], new["seed"])
    kept = json.loads(table.read_text()) if table.is_file() else []
    kept = [old for old in kept if (old["corpus"], old["steps"], old["seed"]) != key] + [new]
    write_text_atomically(table, json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
