"""
The tower preference study in one command: for every run of a grid (model family x tower count x seed), pretrain,
train K probe replicas per tower on the frozen model in one probe run, score every evaluation text with the
scoring command's code (twotower.evaluation.scoring.score), then aggregate the runs into a results document (tables,
plots): replica-level reliability and significance against the same-tower noise floor, cross-seed agreement, the
independent-towers control and token categories.

Runs resume: a finished run is not repeated, and within a run each finished phase (a saved model, a written score
folder) is reused. So an interrupted study continues where it stopped, and a grid can be spread over GPUs or machines
with --runs (a regular expression over run names) and aggregated at the end. The report folder keeps what the
document reads of every finished run (REPORT_DIR/runs/RUN: run.json, each text's preference.json and each scored
point's per-type sums, from which with the run's tokenizer its per-token table is recomputed: kept_tables.py;
REPORT_DIR/tokenizers/DIGEST.json.gz: each distinct tokenizer of the runs once, named in their run.json;
REPORT_DIR/convergence/RUN.json: the convergence curves), and the document is made from those alone: with
--report_dir docs/study, a fresh clone of the repository continues the study where the committed results stop, and
OUTPUT_DIR (models and checkpoints, gigabytes) can be deleted once a run is finished.

The CPU grid, then the document:
    python -m twotower.evaluation.study --recipe cpu --data_dir ../shared/data --output_dir outputs/study-cpu \
        --report_dir docs/study

Layout of OUTPUT_DIR/runs/RUN (RUN = FAMILY-tTOWERS-sSEED):
    pretrain/       the training command's output (model/, checkpoints/ of every trajectory step, runs/ with
                    eval_history.jsonl, train_result.json)
    probe/          the probe run of the final model: `probe_replicas` probes per tower, replica r of every tower on
                    one data order
    scores/TEXT/    the scoring command's report folder (preference.json, preference_per_token.csv, plots,
                    report.md), centered preferences with the replica-level test
    trajectory/step-S/  the same at an earlier pretraining step S: model/ (the checkpoint's weights), probe/,
                    scores/TEXT/ (the recipe's first text only)
    run.json        the run's summary (see `text_figures`); written last, it marks the run finished
and OUTPUT_DIR/convergence/FAMILY-sSEED/pretrain: the convergence check of each cooperative family, one pretraining
run `convergence_factor` times as long as the family's.
"""

import dataclasses
import json
import math
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from twotower.training.arguments import load_config
from twotower.training.checkpoints.checkpointing import FINAL_MODEL_DIR, checkpoints_root
from twotower.training.hub import check_hub_target, check_repo_id
from twotower.training.loading import load_two_tower, load_two_tower_config, read_training_config
from twotower.training.data.objectives import objective_of
from twotower.training.run.run_folder import continuation_options, read_eval_history
from twotower.training.data.tokenizer import load_tokenizer
from twotower.training.train import training_function
from twotower.training.utils import cli
from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.utils.patterns import check_regular_expression

from ..scoring.report import PER_TOKEN_CSV, PREFERENCE_JSON, load_report
from ..scoring.report_files import TYPE_SUMS_PARQUET
from ..scoring.score import score_model
from .config import StudyConfig, StudyRun, load_study_config
from .kept_files import check_kept_run, json_problem, read_kept_json, set_aside_if_damaged
from .kept_tables import RUN_TOKENIZER_KEY, TYPE_TOTALS_PARQUET, keep_point_sums, keep_tokenizer, write_type_totals
from .dataset import push_study_dataset
from .full_tables import check_run_tables_present
from .document import STUDY_JSON, summary_lines, write_study_report
from .parts_of_speech import kept_type_tag_table
from .verdicts import unigram_cross_entropy
from ..tower_preference.measures import PROBE_FREE_MEASURES, PROBE_MEASURE
from ..tower_preference.summary import summary_keys


RUN_SUMMARY = "run.json"
CONVERGENCE_DIR = "convergence"
# in the report folder: each finished run's results (run.json, score tables), the only input of the document
KEPT_RUNS_DIR = "runs"
KEPT_CONVERGENCE_DIR = "convergence"
HUB_DATASET_DIR = "hub-dataset"  # in OUTPUT_DIR: the dataset repository staged for --push_to_hub
QUIET = {"report_to": "none", "disable_tqdm": True}
TRAIN_RESULT = "train_result.json"
PHASE_RESULT_FIELDS = ("eval_metrics", "completed_steps", "best_step", "stopped_early")
# the summary keys of each text's preference.json that run.json keeps (their meaning: the scoring command's)
SUMMARY_FIELDS = summary_keys(*PROBE_MEASURE.study_reads)


def data_path(data_dir: Path, relative: str) -> str:
    path = data_dir / relative
    if not path.exists() and not any(path.parent.glob(path.name)):
        raise FileNotFoundError(f"{path} does not exist; check --data_dir ({data_dir}) and the study recipe's paths.")
    return str(path)


def training_texts(study: StudyConfig, data_dir: Path) -> dict:
    """The --train_file and --validation_file of every training phase of the study."""
    return {
        "train_file": data_path(data_dir, study.train_file),
        "validation_file": data_path(data_dir, study.validation_file),
    }


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


def score_text(probe_model_dir: Path, score_dir: Path, text_path: str, max_tokens, scoring: dict) -> tuple:
    """
    The scoring command's report of one text (centered; blocks holding max_tokens tokens in all, spread over the
    text), unless score_dir already holds it; returns the report and the seconds scoring took (None for a reused folder).
    """
    if (score_dir / PREFERENCE_JSON).is_file() and (score_dir / PER_TOKEN_CSV).is_file():
        return json.loads((score_dir / PREFERENCE_JSON).read_text()), None
    block_size = read_training_config(probe_model_dir)["block_size"]
    max_blocks = None if max_tokens is None else max(1, max_tokens // block_size)
    # parts of speech: each text is tagged once per tokenizer for all runs (parts_of_speech_study), not per scoring
    options = {"block_size": block_size, "disable_tqdm": True, "parts_of_speech": False, **scoring}
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
    preference_summary = report["summary"]
    if preference_summary.get("test") != "replica":
        raise TwoTowerUserError(
            f"{report['model']['path']} has {report['model'].get('probe_replicas', 1)} probe per tower, so its "
            "report has no replica-level test; the probe run must train `probe_replicas` >= 2 probes per tower."
        )
    return {
        **{key: preference_summary[key] for key in SUMMARY_FIELDS},
        "perplexity": report["perplexity"],  # joint, probes (per tower), probe_replicas (per replica per tower)
        "num_blocks": report["data"]["num_blocks"],
        "num_predictions": report["data"]["num_predictions"],
        "cross_fit": report.get("cross_fit"),  # evaluation/scoring/cross_fitting.py, with probe replicas and documents
        # each probe-free measure's summary, under its name (tower_preference/measures.py)
        **{measure.name: report.get(measure.name) for measure in PROBE_FREE_MEASURES},
        "seconds": seconds,
    }


def trajectory_steps(fractions: list, max_train_steps: int) -> list[int]:
    """The pretraining steps where probes train: each fraction of the run, rounded to a whole step."""
    steps = sorted({max(1, round(fraction * max_train_steps)) for fraction in fractions})
    if steps[-1] != max_train_steps:
        raise TwoTowerUserError(f"The trajectory {fractions} does not end at the run's last step {max_train_steps}.")
    return steps


def pretrain_options(study: StudyConfig, run: StudyRun, data: dict, max_train_steps: int | None = None) -> dict:
    """The training options of a run's pretraining: recipe, study, family, run; checkpoints at every trajectory step."""
    family = study.families[run.family]
    options = {**study.pretrain, **family.overrides, **data, **QUIET, "seed": run.seed, "num_towers": run.num_towers}
    recipe_steps = load_config(family.pretrain_recipe).max_train_steps
    options["max_train_steps"] = max_train_steps or options.get("max_train_steps", recipe_steps)
    steps = trajectory_steps(study.trajectory, options["max_train_steps"])
    options["checkpointing_steps"] = math.gcd(*steps)
    # validation at every trajectory step too: the trajectory reads each step's validation loss
    options["eval_steps"] = math.gcd(options.get("eval_steps") or steps[-1], options["checkpointing_steps"])
    # every checkpoint stays: the rotation removes the oldest, and the trajectory's first steps are the oldest. A run
    # takes at most one checkpoint per step (those of epoch ends come on top of the schedule's, as many as the
    # epochs); the disk check counts the ones it writes
    options["checkpoints_total_limit"] = options["max_train_steps"]
    return options


def model_at_step(pretrain_dir: Path, step: int, out_dir: Path) -> Path:
    """
    A model folder with the weights pretraining had after `step`: the saved model for the last step, else the
    step's checkpoint weights in a copy of the saved model's folder (config, tokenizer, training config).
    """
    final = pretrain_dir / FINAL_MODEL_DIR
    if step == saved_model_steps(final):
        return final
    model_dir = out_dir / FINAL_MODEL_DIR
    if (model_dir / "config.json").is_file():
        return model_dir
    checkpoint = checkpoints_root(pretrain_dir) / f"step_{step}"
    if not (checkpoint / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{checkpoint} holds no weights: the pretraining run did not keep its checkpoint of step {step}; delete "
            f"{pretrain_dir.parent} to rerun it."
        )
    model = load_two_tower(final, trained_probes=False)
    missing, unexpected = model.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
    tied = {**(model._tied_weights_keys or {})}  # target -> source: a checkpoint stores one of the two
    if unexpected or set(missing) - set(tied) - set(tied.values()):
        raise TwoTowerUserError(
            f"{checkpoint}'s weights do not fit {final}: missing {missing}, unexpected {unexpected}."
        )
    model.tie_weights()

    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{FINAL_MODEL_DIR}.partial"  # renamed into place when whole
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(final, partial, ignore=shutil.ignore_patterns("*.safetensors"))
    model.save_pretrained(partial)
    partial.replace(model_dir)
    return model_dir


def saved_model_steps(model_dir: Path) -> int:
    """The optimizer steps a saved pretraining model took (its training config's max_train_steps)."""
    return int(read_training_config(model_dir)["max_train_steps"])


def probe_and_score(study, run, data, data_dir, model_dir: Path, out_dir: Path, texts: list[str]) -> dict:
    """Train the probe replicas on a frozen model and score `texts`: the probe run's result and each text's figures."""
    family = study.families[run.family]
    options = {**study.probe, **family.probe_overrides, **data, **QUIET}
    probe = train_phase(
        family.probe_recipe, out_dir / "probe", {**options, "seed": run.seed, "pretrained_model": str(model_dir)}
    )
    scores = {}
    for name in texts:
        text = study.eval_texts[name]
        report, seconds = score_text(
            out_dir / "probe" / FINAL_MODEL_DIR, out_dir / "scores" / name, data_path(data_dir, text.file),
            text.max_tokens, study.scoring,
        )
        scores[name] = text_figures(report, seconds)
    return {"probe": probe, "scores": scores}


def run_one(study: StudyConfig, run: StudyRun, data_dir: Path, run_dir: Path) -> dict:
    """
    Pretrain; at every trajectory step train the probe replicas and score (the first text; every text at the end);
    returns (and writes) the run's summary.
    """
    family = study.families[run.family]
    data = training_texts(study, data_dir)
    options = pretrain_options(study, run, data)
    pretrain = train_phase(family.pretrain_recipe, run_dir / "pretrain", options)
    history = read_eval_history(run_dir / "pretrain")
    trajectory = []
    for step in trajectory_steps(study.trajectory, options["max_train_steps"]):
        final = step == options["max_train_steps"]
        out_dir = run_dir if final else run_dir / "trajectory" / f"step-{step}"
        model_dir = model_at_step(run_dir / "pretrain", step, out_dir)
        texts = list(study.eval_texts) if final or study.score_every_text else list(study.eval_texts)[:1]
        point = probe_and_score(study, run, data, data_dir, model_dir, out_dir, texts)
        evaluation = next((entry for entry in history if entry["step"] == step), None)
        trajectory.append({"step": step, "pretrain_validation": evaluation, **point})
    summary = {
        "run": dataclasses.asdict(run) | {"name": run.name, "control_of": family.control_of},
        "pretrain": pretrain | {"eval_history": history},
        **trajectory[-1],  # the end of training: "probe" and "scores" of every text
        "trajectory": trajectory,
    }
    write_text_atomically(run_dir / RUN_SUMMARY, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def convergence_runs(study: StudyConfig) -> list[StudyRun]:
    """One run per cooperative family (the seed of its first grid cell) for the convergence check."""
    if study.convergence_factor is None:
        return []
    first = {}
    for run in study.runs():
        if study.families[run.family].control_of is None:
            first.setdefault(run.family, run)
    return list(first.values())


def run_convergence(study: StudyConfig, run: StudyRun, data_dir: Path, out_dir: Path) -> None:
    """Pretrain `convergence_factor` times as long as the family's runs (the report reads its eval history)."""
    data = training_texts(study, data_dir)
    length = pretrain_options(study, run, data)["max_train_steps"]
    options = pretrain_options(study, run, data, study.convergence_factor * length)
    options["checkpoints_total_limit"] = 1  # only to resume: no probe reads these weights
    train_phase(study.families[run.family].pretrain_recipe, out_dir / "pretrain", options)


def load_run_summary(path: Path) -> dict:
    """A finished run's run.json; a clear error for one written before probe replicas (two probe sets)."""
    summary = read_kept_json(path, f"run the study again with --runs '^{path.parent.name}$' to redo that run alone.")
    if "probe" not in summary:
        raise TwoTowerUserError(
            f"{path} was written by the study's earlier design (two probe sets, no probe replicas), which this "
            "report cannot read; pass a new --output_dir, or delete that run's folder to rerun it."
        )
    return summary


def keep_run_results(run_dir: Path, kept_dir: Path, texts: dict) -> None:
    """
    Copy what the document reads of a finished run into the report folder: run.json, with the pretrained model's
    objective and the unigram cross-entropy of the training text under the run's tokenizer, each text's
    preference.json and its scored points' per-type sums (keep_type_sums; a text scored without them keeps its
    per-token table's type totals: kept_tables.py). Written whole or not at all (a folder renamed into place); the
    run's tokenizer is kept before, once per report folder (REPORT_DIR/tokenizers, named in run.json).
    """
    summary = load_run_summary(run_dir / RUN_SUMMARY)
    model_dir = run_dir / "pretrain" / FINAL_MODEL_DIR
    config = load_two_tower_config(model_dir)
    summary["model"] = {"objective": objective_of(config), "tower_type": config.tower_type}
    summary["unigram_cross_entropy_nats"] = unigram_cross_entropy(load_tokenizer(str(model_dir)), *texts.values())
    partial = kept_dir.with_name(f".{kept_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    for text in summary["scores"]:
        source, kept = run_dir / "scores" / text, partial / "scores" / text
        kept.mkdir(parents=True)
        shutil.copyfile(source / PREFERENCE_JSON, kept / PREFERENCE_JSON)
        if not (source / TYPE_SUMS_PARQUET).is_file():  # scored without cross-fitting: no sums to recompute it from
            write_type_totals(kept / TYPE_TOTALS_PARQUET, *load_report(source))
    keep_type_sums(run_dir, partial, summary)
    tokenizer_file = model_dir / "tokenizer.json"
    if tokenizer_file.is_file():  # the report folder's copy, before the run.json that names it
        summary[RUN_TOKENIZER_KEY] = keep_tokenizer(kept_dir.parent.parent, tokenizer_file.read_bytes())
    (partial / RUN_SUMMARY).write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    shutil.rmtree(kept_dir, ignore_errors=True)  # never a finished copy: that one has its run.json
    partial.replace(kept_dir)


def keep_type_sums(run_dir: Path, kept_dir: Path, summary: dict) -> None:
    """
    Each scored point's per-half, per-type sums (every trajectory step's, every text's) in the study's kept form
    (kept_tables.keep_point_sums: the last point's whole, an earlier point's counts and probe sums): from these and
    the run's kept tokenizer alone every per-type figure of the run, its cross-fitted r and a per-type tagging of the
    texts can be recomputed. Points scored without cross-fitting have none.
    """
    last_step = summary["trajectory"][-1]["step"]
    for point in summary["trajectory"]:
        point_dir = Path() if point["step"] == last_step else Path("trajectory", f"step-{point['step']}")
        for text in point["scores"]:
            source = run_dir / point_dir / "scores" / text / TYPE_SUMS_PARQUET
            if source.is_file():
                kept = kept_dir / point_dir / "scores" / text / TYPE_SUMS_PARQUET
                min_count = point["scores"][text]["cross_fit"]["min_count"]
                keep_point_sums(source, kept, min_count, is_last=point["step"] == last_step)


def keep_convergence_results(run: StudyRun, out_dir: Path, kept_file: Path) -> None:
    """The convergence run's validation curve and length, as the document reads them, into the report folder."""
    results = {"family": run.family, "seed": run.seed, "eval_history": read_eval_history(out_dir / "pretrain"),
               "max_train_steps": saved_model_steps(out_dir / "pretrain" / FINAL_MODEL_DIR)}
    kept_file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(kept_file, json.dumps(results, indent=2, allow_nan=False) + "\n")


def finish_run(study, run, data_dir, output_dir, kept_dir, aggregate_only, label) -> None:
    """Run one grid run unless the report folder keeps its results (or, with aggregate_only, it did not finish);
    keep the results of a finished run there."""
    run_dir = output_dir / "runs" / run.name
    if (kept_dir / RUN_SUMMARY).is_file() and not set_aside_if_damaged(kept_dir, label):
        print(f"{label} {run.name}: finished earlier, kept in {kept_dir}")
        return
    if json_problem(run_dir / RUN_SUMMARY) is not None:  # not finished, or its run.json cut short: run it (again)
        if aggregate_only:
            return
        print(f"{label} {run.name}: running in {run_dir}", flush=True)
        run_one(study, run, data_dir, run_dir)
    keep_run_results(run_dir, kept_dir, training_texts(study, data_dir))


def finish_convergence(study, run, data_dir, output_dir, kept_file, aggregate_only) -> None:
    """The convergence run of one family, like `finish_run`."""
    out_dir = output_dir / CONVERGENCE_DIR / run.name
    if json_problem(kept_file) is None:  # a damaged copy is kept again
        return
    if not (out_dir / "pretrain" / TRAIN_RESULT).is_file():
        if aggregate_only:
            return
        print(f"[convergence] {run.name}: {study.convergence_factor}x as long", flush=True)
        run_convergence(study, run, data_dir, out_dir)
    keep_convergence_results(run, out_dir, kept_file)


def run_study(recipe, data_dir, output_dir, report_dir=None, runs_pattern=None, aggregate_only=False, command=None):
    """
    Run (or resume) every selected run of the grid, then aggregate all finished runs into the report.
    The report folder keeps each finished run's results (KEPT_RUNS_DIR, KEPT_CONVERGENCE_DIR), and only those are
    aggregated: the report folder alone, without OUTPUT_DIR, redoes the document and continues the study.
    """
    data_dir, output_dir = Path(data_dir), Path(output_dir)
    report_dir = Path(report_dir) if report_dir else output_dir / "report"
    check_run_tables_present(report_dir)  # archived run tables: restored before any run or aggregation
    study = load_study_config(recipe)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"--data_dir {data_dir} is not a folder; pass the folder holding the study's texts.")
    selected = [run for run in study.runs() if runs_pattern is None or re.search(runs_pattern, run.name)]
    if not selected:
        names = [run.name for run in study.runs()]
        raise TwoTowerUserError(f"--runs {runs_pattern!r} selects none of the grid's runs: {names}.")
    checks = {run.family: run for run in convergence_runs(study)
              if runs_pattern is None or re.search(runs_pattern, run.name)}
    kept_runs, kept_convergence = report_dir / KEPT_RUNS_DIR, report_dir / KEPT_CONVERGENCE_DIR
    for index, run in enumerate(selected, 1):
        finish_run(study, run, data_dir, output_dir, kept_runs / run.name, aggregate_only,
                   f"[{index}/{len(selected)}]")
        lead = study.lead_family(run.family)
        if lead in checks and all(study.lead_family(later.family) != lead for later in selected[index:]):
            check = checks.pop(lead)  # the family's runs are done: its convergence check follows
            finish_convergence(study, check, data_dir, output_dir, kept_convergence / f"{check.name}.json",
                               aggregate_only)
    for run in study.runs():  # every kept file checked before the document reads it
        if (kept_runs / run.name / RUN_SUMMARY).is_file():
            check_kept_run(kept_runs / run.name)
    summaries = [
        load_run_summary(kept_runs / run.name / RUN_SUMMARY)
        for run in study.runs()
        if (kept_runs / run.name / RUN_SUMMARY).is_file()
    ]
    if not summaries:
        raise FileNotFoundError(
            f"No finished run in {output_dir / 'runs'} or {kept_runs}; run the study without --aggregate_only."
        )
    convergence = [
        read_kept_json(path, "delete it and run the study again to keep it again from its convergence run.")
        for run in convergence_runs(study)
        if (path := kept_convergence / f"{run.name}.json").is_file()
    ]
    return write_study_report(
        summaries, kept_runs, report_dir, command, study, convergence, summaries[0]["unigram_cross_entropy_nats"],
        type_tag_table_of=scored_text_tags(study, data_dir, report_dir),
    )


def scored_text_tags(study, data_dir, report_dir):
    """The part-of-speech tags of the 2x2 and the joint-gradient experiment: type_tag_table_of(text, tokenizer_file),
    each text tagged once per tokenizer and kept in the report folder (parts_of_speech.kept_type_tag_table)."""

    def type_tag_table_of(text, tokenizer_file):
        return kept_type_tag_table(report_dir, text, data_path(data_dir, study.eval_texts[text].file), tokenizer_file)

    return type_tag_table_of


def main(argv=None):
    parser = cli.CommandParser(
        prog="python -m twotower.evaluation.study", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument("--recipe", default="cpu", help="a study recipe name (evaluation/study/recipes) or YAML path")
    parser.add_argument("--data_dir", required=True, help="folder the recipe's text paths are relative to")
    parser.add_argument("--output_dir", required=True, help="runs go to OUTPUT_DIR/runs")
    parser.add_argument("--report_dir", help="where the results document and each finished run's results go "
                        "(default OUTPUT_DIR/report); the study continues from the runs this folder keeps")
    parser.add_argument("--runs", help="run only the runs whose name matches this regular expression")
    parser.add_argument("--aggregate_only", action="store_true", help="only aggregate the runs already finished "
                        "(kept in the report folder or finished in OUTPUT_DIR)")
    parser.add_argument("--push_to_hub", metavar="REPO", help="then upload the kept per-type tables, their dataset "
                        "card and the document as the Hub dataset repository REPO (user/name)")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                        help="with --push_to_hub: stage the dataset repository in OUTPUT_DIR/hub-dataset and list it")
    args = parser.parse_args(argv)
    check_regular_expression("--runs", args.runs, "^gpt-t2-s0$")
    if args.push_to_hub and args.dry_run:
        check_repo_id(args.push_to_hub, "--push_to_hub")
    elif args.push_to_hub:  # before the runs and the aggregation: an upload that cannot happen is refused first
        check_hub_target(args.push_to_hub, "--push_to_hub", "pass --dry-run to stage the dataset without uploading it")
    command = "python -m twotower.evaluation.study " + shlex.join(sys.argv[1:] if argv is None else argv)
    report_path = run_study(
        args.recipe, args.data_dir, args.output_dir, args.report_dir, args.runs, args.aggregate_only, command
    )
    study = json.loads((Path(report_path).parent / STUDY_JSON).read_text())
    if study.get("joint_gradient"):  # its arms are not cooperative and independent towers: its own section says what it found
        print(f"Wrote {report_path}; see its section \"What in cooperation makes the split: the joint gradient\".")
    else:
        print(f"Wrote {report_path}; in short:", *summary_lines(study["verdicts"]), sep="\n")
    if args.push_to_hub:
        pushed = push_study_dataset(Path(report_path).parent, args.push_to_hub, Path(args.output_dir) / HUB_DATASET_DIR,
                                    dry_run=args.dry_run)
        print(f"Staged {pushed['folder']}:", pushed["files"], sep="\n")
        print(f"Uploaded: {pushed['commit_url']}" if pushed["commit_url"] else "Dry run: nothing uploaded.")
    return report_path


if __name__ == "__main__":
    cli.run(main)
