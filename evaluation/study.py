"""
The tower preference study in one command: for every run of a grid (model family x tower count x seed), pretrain,
train two probe sets on the frozen model (two seeds), score both on every evaluation text, then aggregate the runs
into a results document (tables, plots) with the same-tower noise floor, cross-seed agreement, the
independent-towers control and token categories.

Runs resume: a finished run (its run.json exists) is not repeated, and within a run each finished phase (a saved
model, a written score folder) is reused. So an interrupted study continues where it stopped, and a grid can be
spread over GPUs or machines with --runs (a regular expression over run names) and aggregated at the end.

The CPU grid (each run at most ~10 minutes on 2 cores), then the document:
    python -m twotower.evaluation.study --recipe cpu --data_dir ../shared/data --output_dir outputs/study-cpu \
        --report_dir docs/study

Layout of OUTPUT_DIR/runs/RUN (RUN = FAMILY-tTOWERS-sSEED):
    pretrain/            the training command's output (model/, checkpoints/, train_result.json)
    probe-sSEED/         probe set A, trained with the run's seed
    probe-sSEED+OFFSET/  probe set B, the same-tower control: same model, another probe seed
    scores/EVAL/PAIR/    one report folder (twotower.evaluation.report layout, centered preferences) per pair of
                         probes: `towers` (A's probes of all towers: the two-tower preference), `towers_replica`
                         (B's), `towers_across_runs` (tower 0 from A, tower 1 from B), `same_tower_T` (A's and B's
                         probe of tower T: the noise floor, to compare with towers_across_runs)
    run.json             the run's summary; written last, it marks the run finished
"""

import argparse
import dataclasses
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


from twotower.training.arguments import load_config, read_recipe
from twotower.training.atomic import write_text_atomically
from twotower.training.checkpointing import FINAL_MODEL_DIR
from twotower.training.train import training_function

from .study_report import write_study_report
from .study_scoring import score_run


STUDY_RECIPES_DIR = Path(__file__).resolve().parent / "study_recipes"
RUN_SUMMARY = "run.json"
TRAIN_RESULT = "train_result.json"
PHASE_RESULT_FIELDS = ("eval_metrics", "completed_steps", "best_step", "stopped_early")


@dataclass
class ModelFamily:
    pretrain_recipe: str  # a training recipe name (training/recipes) or YAML path
    probe_recipe: str
    overrides: dict = field(default_factory=dict)  # training options over this family's pretrain recipe
    control_of: str | None = None  # the family this one is the independent-towers control of


@dataclass
class EvalText:
    file: str  # a .txt file, folder or glob, relative to --data_dir
    max_blocks: int | None = None  # score this many blocks, evenly spaced over the text; None = all


@dataclass
class StudyConfig:
    train_file: str  # relative to --data_dir
    validation_file: str  # pretraining and probes stop on this text's loss
    eval_texts: dict[str, EvalText]  # name -> text scored after training
    families: dict[str, ModelFamily]
    grid: list[dict]  # [{family, num_towers: [..], seeds: [..]}]
    pretrain: dict = field(default_factory=dict)  # training options over every family's pretrain recipe
    probe: dict = field(default_factory=dict)  # training options over every probe recipe
    probe_seed_offset: int = 1000  # probe set B trains with seed + offset
    scoring: dict = field(default_factory=dict)  # ScoringArguments fields (batch_size, min_count, alpha, ...)

    def __post_init__(self):
        self.eval_texts = {name: EvalText(**text) for name, text in self.eval_texts.items()}
        self.families = {name: ModelFamily(**family) for name, family in self.families.items()}
        if not self.eval_texts:
            raise ValueError("The study recipe lists no `eval_texts`; name at least one text to score.")
        for cell in self.grid:
            if cell.get("family") not in self.families:
                raise ValueError(
                    f"Grid cell {cell} names family {cell.get('family')!r}; define it under `families` "
                    f"(known: {sorted(self.families)})."
                )
            unknown = set(cell) - {"family", "num_towers", "seeds"}
            if unknown:
                raise ValueError(f"Grid cell {cell} has unknown keys {sorted(unknown)}; use family, num_towers, seeds.")
        for name, family in self.families.items():
            if family.control_of is not None and family.control_of not in self.families:
                raise ValueError(f"Family {name!r} is the control of {family.control_of!r}, which is not defined.")
        if self.probe_seed_offset == 0:
            raise ValueError("`probe_seed_offset` is 0: probe set B would repeat probe set A; use e.g. 1000.")

    def runs(self) -> list["StudyRun"]:
        return [
            StudyRun(cell["family"], num_towers, seed)
            for cell in self.grid
            for num_towers in cell.get("num_towers", [2])
            for seed in cell.get("seeds", [0])
        ]


@dataclass(frozen=True)
class StudyRun:
    family: str
    num_towers: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}-t{self.num_towers}-s{self.seed}"


def load_study_config(recipe: str) -> StudyConfig:
    """A study recipe name (evaluation/study_recipes) or a YAML path -> StudyConfig."""
    return StudyConfig(**read_recipe(recipe, StudyConfig, STUDY_RECIPES_DIR))


def data_path(data_dir: Path, relative: str) -> str:
    path = data_dir / relative
    if not path.exists() and not any(path.parent.glob(path.name)):
        raise FileNotFoundError(f"{path} does not exist; check --data_dir ({data_dir}) and the study recipe's paths.")
    return str(path)


def train_phase(recipe: str, output_dir: Path, options: dict) -> dict:
    """One training phase, unless its model is already saved; returns its train_result.json."""
    result_file = output_dir / TRAIN_RESULT
    if (output_dir / FINAL_MODEL_DIR / "config.json").is_file() and result_file.is_file():
        return json.loads(result_file.read_text())
    config = dataclasses.replace(load_config(recipe), output_dir=str(output_dir), **options)
    start = time.perf_counter()
    result = training_function(config)
    kept = {name: result.get(name) for name in PHASE_RESULT_FIELDS} | {"seconds": time.perf_counter() - start}
    write_text_atomically(result_file, json.dumps(kept, indent=2) + "\n")
    return kept


def run_one(study: StudyConfig, run: StudyRun, data_dir: Path, run_dir: Path) -> dict:
    """Pretrain, probe twice, score every evaluation text; returns (and writes) the run's summary."""
    family = study.families[run.family]
    data = {
        "train_file": data_path(data_dir, study.train_file),
        "validation_file": data_path(data_dir, study.validation_file),
    }
    quiet = {"report_to": "none", "disable_tqdm": True}
    pretrain = train_phase(
        family.pretrain_recipe,
        run_dir / "pretrain",
        {**study.pretrain, **family.overrides, **data, **quiet, "seed": run.seed, "num_towers": run.num_towers},
    )
    pretrained_model = str(run_dir / "pretrain" / FINAL_MODEL_DIR)
    probe_dirs, probes = [], []
    for probe_seed in (run.seed, run.seed + study.probe_seed_offset):
        probe_dir = run_dir / f"probe-s{probe_seed}"
        options = {**study.probe, **data, **quiet, "seed": probe_seed, "pretrained_model": pretrained_model}
        probes.append(train_phase(family.probe_recipe, probe_dir, options))
        probe_dirs.append(probe_dir / FINAL_MODEL_DIR)

    scores = {}
    for name, text in study.eval_texts.items():
        scores[name] = score_run(
            probe_dirs, run_dir / "scores" / name, data_path(data_dir, text.file), text.max_blocks, study.scoring
        )
    summary = {
        "run": dataclasses.asdict(run) | {"name": run.name, "control_of": family.control_of},
        "pretrain": pretrain,
        "probes": probes,
        "scores": scores,
    }
    write_text_atomically(run_dir / RUN_SUMMARY, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def run_study(recipe, data_dir, output_dir, report_dir=None, runs_pattern=None, aggregate_only=False, command=None):
    """Run (or resume) every selected run of the grid, then aggregate all finished runs into the report."""
    study = load_study_config(recipe)
    data_dir, output_dir = Path(data_dir), Path(output_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"--data_dir {data_dir} is not a folder; pass the folder holding the study's texts.")
    selected = [run for run in study.runs() if runs_pattern is None or re.search(runs_pattern, run.name)]
    if not selected:
        names = [run.name for run in study.runs()]
        raise ValueError(f"--runs {runs_pattern!r} selects none of the grid's runs: {names}.")
    if not aggregate_only:
        for index, run in enumerate(selected, 1):
            run_dir = output_dir / "runs" / run.name
            if (run_dir / RUN_SUMMARY).is_file():
                print(f"[{index}/{len(selected)}] {run.name}: finished earlier, kept")
                continue
            print(f"[{index}/{len(selected)}] {run.name}: running in {run_dir}", flush=True)
            run_one(study, run, data_dir, run_dir)
    summaries = [
        json.loads((output_dir / "runs" / run.name / RUN_SUMMARY).read_text())
        for run in study.runs()
        if (output_dir / "runs" / run.name / RUN_SUMMARY).is_file()
    ]
    if not summaries:
        raise FileNotFoundError(f"No finished run in {output_dir / 'runs'}; run the study without --aggregate_only.")
    return write_study_report(
        summaries, output_dir / "runs", Path(report_dir) if report_dir else output_dir / "report", command, study
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--recipe", default="cpu", help="a study recipe name (evaluation/study_recipes) or YAML path")
    parser.add_argument("--data_dir", required=True, help="folder the recipe's text paths are relative to")
    parser.add_argument("--output_dir", required=True, help="runs go to OUTPUT_DIR/runs")
    parser.add_argument("--report_dir", help="where the results document goes (default OUTPUT_DIR/report)")
    parser.add_argument("--runs", help="run only the runs whose name matches this regular expression")
    parser.add_argument("--aggregate_only", action="store_true", help="only aggregate the runs already finished")
    args = parser.parse_args(argv)
    command = "python -m twotower.evaluation.study " + shlex.join(sys.argv[1:] if argv is None else argv)
    report_path = run_study(
        args.recipe, args.data_dir, args.output_dir, args.report_dir, args.runs, args.aggregate_only, command
    )
    print(f"Wrote {report_path}")
    return report_path


if __name__ == "__main__":
    main()
