"""
The tower preference study in one command: for every run of a grid (model family x tower count x seed), pretrain,
train K probe replicas per tower on the frozen model in one probe run, score every evaluation text with the
scoring command's code (twotower.evaluation.score), then aggregate the runs into a results document (tables,
plots): replica-level reliability and significance against the same-tower noise floor, cross-seed agreement, the
independent-towers control and token categories.

Runs resume: a finished run (its run.json exists) is not repeated, and within a run each finished phase (a saved
model, a written score folder) is reused. So an interrupted study continues where it stopped, and a grid can be
spread over GPUs or machines with --runs (a regular expression over run names) and aggregated at the end.

The CPU grid, then the document:
    python -m twotower.evaluation.study --recipe cpu --data_dir ../shared/data --output_dir outputs/study-cpu \
        --report_dir docs/study

Layout of OUTPUT_DIR/runs/RUN (RUN = FAMILY-tTOWERS-sSEED):
    pretrain/       the training command's output (model/, checkpoints/, train_result.json)
    probe/          the probe run: `probe_replicas` probes per tower, replica r of every tower on one data order
    scores/TEXT/    the scoring command's report folder (preference.json, preference_per_token.csv, plots,
                    report.md), centered preferences with the replica-level test
    run.json        the run's summary (see `text_figures`); written last, it marks the run finished
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

import yaml

from twotower.training import cli
from twotower.training.arguments import load_config, read_recipe, resolve_recipe_path
from twotower.training.atomic import write_text_atomically
from twotower.training.checkpointing import FINAL_MODEL_DIR
from twotower.training.errors import TwoTowerUserError
from twotower.training.loading import read_training_config
from twotower.training.run_folder import continuation_options
from twotower.training.train import training_function

from .report import PER_TOKEN_CSV, PREFERENCE_JSON
from .score import ScoringArguments, score_model
from .study_report import write_study_report


STUDY_RECIPES_DIR = Path(__file__).resolve().parent / "study_recipes"
RUN_SUMMARY = "run.json"
TRAIN_RESULT = "train_result.json"
PHASE_RESULT_FIELDS = ("eval_metrics", "completed_steps", "best_step", "stopped_early")
MIN_PROBE_REPLICAS = 2  # the replica-level test and the same-tower floor compare replicas of one tower
SCORING_SET_BY_STUDY = ("model_dir", "output_dir", "validation_file", "max_blocks", "spread_blocks", "center")
# the summary keys of each text's preference.json that run.json keeps (their meaning: the scoring command's)
SUMMARY_FIELDS = (
    "reliability",
    "reliability_ci",
    "reliability_single_probe",
    "num_significant",
    "significant_share",
    "occurrence_num_significant",
    "occurrence_significant_share",
    "two_tower_difference_nats",
    "same_tower_floor_nats",
    "global_offset_nats",
    "mean_abs_preference_nats",
    "num_eligible_types",
    "replicas_per_tower",
    "paired",
)


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
    probe: dict = field(default_factory=dict)  # training options over every probe recipe; must set probe_replicas
    scoring: dict = field(default_factory=dict)  # ScoringArguments fields (batch_size, min_count, alpha, ...)

    def __post_init__(self):
        self.eval_texts = {name: EvalText(**text) for name, text in self.eval_texts.items()}
        self.families = {name: ModelFamily(**family) for name, family in self.families.items()}
        if not self.eval_texts:
            raise TwoTowerUserError("The study recipe lists no `eval_texts`; name at least one text to score.")
        for cell in self.grid:
            if cell.get("family") not in self.families:
                raise TwoTowerUserError(
                    f"Grid cell {cell} names family {cell.get('family')!r}; define it under `families` "
                    f"(known: {sorted(self.families)})."
                )
            unknown = set(cell) - {"family", "num_towers", "seeds"}
            if unknown:
                raise TwoTowerUserError(f"Grid cell {cell} has unknown keys {sorted(unknown)}; use family, num_towers, seeds.")
        for name, family in self.families.items():
            if family.control_of is not None and family.control_of not in self.families:
                raise TwoTowerUserError(f"Family {name!r} is the control of {family.control_of!r}, which is not defined.")
        replicas = self.probe.get("probe_replicas")
        if not isinstance(replicas, int) or replicas < MIN_PROBE_REPLICAS:
            raise TwoTowerUserError(
                f"The study recipe's `probe` options set probe_replicas={replicas!r}; set it to an integer >= "
                f"{MIN_PROBE_REPLICAS} (e.g. `probe: {{probe_replicas: 4}}`): the replica-level test and the "
                "same-tower noise floor compare probes of one tower."
            )
        self._check_scoring_options()

    def _check_scoring_options(self):
        """Scoring runs after hours of training: a bad option must fail now, not then."""
        known = {option.name for option in dataclasses.fields(ScoringArguments)}
        unknown = sorted(set(self.scoring) - known)
        if unknown:
            raise TwoTowerUserError(f"The study recipe's `scoring` sets unknown options {unknown}; see ScoringArguments.")
        fixed = sorted(set(self.scoring) & set(SCORING_SET_BY_STUDY))
        if fixed:
            raise TwoTowerUserError(
                f"The study recipe's `scoring` sets {fixed}, which the study sets itself (the probe model, the score "
                "folder, each text and its max_blocks spread over the text, centered preferences); drop them."
            )

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
    path = resolve_recipe_path(recipe, STUDY_RECIPES_DIR)
    if "probe_seed_offset" in (yaml.safe_load(path.read_text()) or {}):
        raise TwoTowerUserError(
            f"{path} sets `probe_seed_offset`, which the study no longer has: instead of a second probe set trained "
            "with another seed, each run trains one probe run with several probe replicas per tower, and the noise "
            "floor compares replicas of one tower. Delete `probe_seed_offset` and set `probe: {probe_replicas: 4}`."
        )
    return StudyConfig(**read_recipe(str(path), StudyConfig, STUDY_RECIPES_DIR))


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
    options = {**options, **continuation_options(output_dir)}
    config = dataclasses.replace(load_config(recipe), output_dir=str(output_dir), **options)
    start = time.perf_counter()
    result = training_function(config)
    kept = {name: result.get(name) for name in PHASE_RESULT_FIELDS} | {"seconds": time.perf_counter() - start}
    write_text_atomically(result_file, json.dumps(kept, indent=2) + "\n")
    return kept


def score_text(probe_model_dir: Path, score_dir: Path, text_path: str, max_blocks, scoring: dict) -> tuple:
    """
    The scoring command's report of one text (centered, max_blocks spread over the text), unless score_dir already
    holds it; returns the report and the seconds scoring took (None for a reused folder).
    """
    if (score_dir / PREFERENCE_JSON).is_file() and (score_dir / PER_TOKEN_CSV).is_file():
        return json.loads((score_dir / PREFERENCE_JSON).read_text()), None
    options = {"block_size": read_training_config(probe_model_dir)["block_size"], "disable_tqdm": True, **scoring}
    start = time.perf_counter()
    report = score_model(
        probe_model_dir,
        score_dir,
        validation_file=text_path,
        max_blocks=max_blocks,
        spread_blocks=True,
        center=True,
        **options,
    )
    return report, time.perf_counter() - start


def text_figures(report: dict, seconds: float | None) -> dict:
    """What run.json keeps of one text's report: the replica-level figures, perplexities and the scoring time."""
    summary = report["summary"]
    if summary.get("test") != "replica":
        raise TwoTowerUserError(
            f"{report['model']['path']} has {report['model'].get('probe_replicas', 1)} probe per tower, so its "
            "report has no replica-level test; the probe run must train `probe_replicas` >= 2 probes per tower."
        )
    return {
        **{key: summary[key] for key in SUMMARY_FIELDS},
        "perplexity": report["perplexity"],  # joint, probes (per tower), probe_replicas (per replica per tower)
        "num_blocks": report["data"]["num_blocks"],
        "num_predictions": report["data"]["num_predictions"],
        "seconds": seconds,
    }


def run_one(study: StudyConfig, run: StudyRun, data_dir: Path, run_dir: Path) -> dict:
    """Pretrain, train the probe replicas, score every evaluation text; returns (and writes) the run's summary."""
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
    probe = train_phase(
        family.probe_recipe,
        run_dir / "probe",
        {**study.probe, **data, **quiet, "seed": run.seed, "pretrained_model": pretrained_model},
    )
    scores = {}
    for name, text in study.eval_texts.items():
        report, seconds = score_text(
            run_dir / "probe" / FINAL_MODEL_DIR,
            run_dir / "scores" / name,
            data_path(data_dir, text.file),
            text.max_blocks,
            study.scoring,
        )
        scores[name] = text_figures(report, seconds)
    summary = {
        "run": dataclasses.asdict(run) | {"name": run.name, "control_of": family.control_of},
        "pretrain": pretrain,
        "probe": probe,
        "scores": scores,
    }
    write_text_atomically(run_dir / RUN_SUMMARY, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def load_run_summary(path: Path) -> dict:
    """A finished run's run.json; a clear error for one written before probe replicas (two probe sets)."""
    summary = json.loads(path.read_text())
    if "probe" not in summary:
        raise TwoTowerUserError(
            f"{path} was written by the study's earlier design (two probe sets, no probe replicas), which this "
            "report cannot read; pass a new --output_dir, or delete that run's folder to rerun it."
        )
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
        raise TwoTowerUserError(f"--runs {runs_pattern!r} selects none of the grid's runs: {names}.")
    if not aggregate_only:
        for index, run in enumerate(selected, 1):
            run_dir = output_dir / "runs" / run.name
            if (run_dir / RUN_SUMMARY).is_file():
                print(f"[{index}/{len(selected)}] {run.name}: finished earlier, kept")
                continue
            print(f"[{index}/{len(selected)}] {run.name}: running in {run_dir}", flush=True)
            run_one(study, run, data_dir, run_dir)
    summaries = [
        load_run_summary(output_dir / "runs" / run.name / RUN_SUMMARY)
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
    cli.run(main)
