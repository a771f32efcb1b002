"""
The results document of a tower preference study: the verdicts with their 95% intervals (verdicts.py), the
cross-fitted verdicts and the size grid (cross_fit.py), the long-run check (long_run.py), per-run tables of
the replica-level figures against the same-tower noise floor, the training trajectory and the comparison at matched
probe quality, the convergence check, token categories (categories.py) and each tower's most reliably preferred
types, plots (plots.py). This module gathers the figures and tables; the text is the Jinja template
templates/study.md.j2.

Layout of the report folder:
    STUDY.md                the document (commands, machine, verdicts, tables, plots)
    study.json              every number of the document; `verdicts.FAMILY` holds each family's verdict on the
                            first evaluation text, `verdicts_by_text.TEXT.FAMILY` the same on every text,
                            `cross_fit_verdicts.FAMILY` the cross-fitted one, `size_grid` every family against each
                            of its controls, `long_run` each family point by point (long.yaml)
    noise_floor.png         per run and text: two-tower difference vs the same-tower floor, replica-level vs
                            occurrence-level significance, reliability with its 95% interval
    trajectory.png          per family: reliability against pretraining validation loss and probe perplexity, both
                            arms, every seed, at every trajectory step
    convergence.png         validation loss of each family's first run and of its convergence run, twice as long
    categories_FAMILY.png   which token categories each tower prefers (first seed, first evaluation text)
    runs/RUN/               what the document reads of each finished run: run.json, scores/TEXT/ (the scoring
                            command's preference.json and per-token table, gzipped)
    convergence/RUN.json    each convergence run's validation curve
"""

import dataclasses
import json
import os
import platform
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from modeling_twotower.towers import TOWER_KINDS

from twotower.training.utils.atomic import write_text_atomically

from ..scoring.cross_fitting import replica_groups
from ..scoring.formatting import markdown_table, number, percent, with_interval
from ..scoring.report import template_environment, tower_columns
from .categories import category_recurrence, category_rows, category_table, recurrence_table
from .cross_fit import (
    NEAR_ZERO_R,
    cross_fit_summary_lines,
    cross_fit_table,
    cross_fit_verdicts,
    size_grid_rows,
    size_grid_table,
)
from .dataset import write_dataset_card
from .factorial import factorial_analysis
from .joint_gradient import joint_gradient_analysis
from .factorial_report import factorial_context
from .full_tables import full_tables_note
from .kept_tables import load_kept_report
from .joint_gradient_report import gradient_context
from .long_run import long_run_rows, long_run_table
from .plots import plot_convergence, plot_noise_floor, plot_trajectory
from .verdicts import (
    CONVERGENCE_TOLERANCE, MASKED_MARGIN_NATS, NULL_PERMUTATIONS, convergence_check, difference_or_none,
    family_verdict, load_run_types, matched_quality, trajectory_rows,
)
from ..scoring.token_categories import plot_category_preferences


TOP_TYPES = 20
STUDY_MD = "STUDY.md"
STUDY_JSON = "study.json"
STUDY_TEMPLATE = "study.md.j2"
TEMPLATES_DIR = Path(__file__).with_name("templates")  # beside the module, in a wheel too (setup.py package_data)
STUDY_PLOTS = ("noise_floor.png", "trajectory.png", "convergence.png", "categories_*.png")  # what the study draws


def score_dir(runs_dir, run_name, text):
    """The report folder the scoring command wrote for one run and text."""
    return runs_dir / run_name / "scores" / text


def run_rows(summaries):
    """One row per (run, evaluation text): the replica-level figures of its run.json."""
    rows = []
    for summary in summaries:
        run = summary["run"]
        for text, scores in summary["scores"].items():
            low, high = scores["reliability_ci"]
            rows.append(
                {
                    "run": run["name"],
                    "family": run["family"],
                    "num_towers": run["num_towers"],
                    "seed": run["seed"],
                    "text": text,
                    "probe_replicas": max(scores["replicas_per_tower"]),
                    "joint_perplexity": scores["perplexity"]["joint"],
                    "probe_perplexity": scores["perplexity"]["probes"],
                    "probe_replica_perplexity": scores["perplexity"]["probe_replicas"],
                    "probe_stop_step": _probe_steps(summary["probe"]),
                    "global_offset_nats": scores["global_offset_nats"][0],
                    "reliability": scores["reliability"],
                    "reliability_ci_low": low,
                    "reliability_ci_high": high,
                    "reliability_single_probe": scores["reliability_single_probe"],
                    "significant_share": scores["significant_share"],
                    "occurrence_significant_share": scores["occurrence_significant_share"],
                    "two_tower_difference_nats": scores["two_tower_difference_nats"],
                    "same_tower_floor_nats": scores["same_tower_floor_nats"],
                    "excess_difference_nats": difference_or_none(
                        scores["two_tower_difference_nats"], scores["same_tower_floor_nats"]
                    ),
                    "num_eligible_types": scores["num_eligible_types"],
                    "run_minutes": run_minutes(summary),
                }
            )
    return rows


def _probe_steps(probe):
    """The step whose weights a probe run kept, marked when the step cap, not the validation loss, ended the run."""
    step = probe["best_step"] or probe["completed_steps"]
    if probe["stopped_early"]:
        return str(step)
    return f"{step} (cap)" if step == probe["completed_steps"] else f"{step} (cap {probe['completed_steps']})"


def run_minutes(summary):
    """Wall-clock minutes of the whole run (pretraining, every probe run, scoring every text at every trajectory
    step); None when a phase was reused from an interrupted run, whose time is not known."""
    points = summary.get("trajectory") or [summary]
    phases = [summary["pretrain"]]
    phases += [phase for point in points for phase in (point["probe"], *point["scores"].values())]
    seconds = [phase["seconds"] for phase in phases]
    return None if None in seconds else sum(seconds) / 60


def compute_minutes(summaries):
    """(total, longest) wall-clock minutes of the runs whose time is known; None, None when none is."""
    minutes = [value for value in map(run_minutes, summaries) if value is not None]
    return (sum(minutes), max(minutes)) if minutes else (None, None)


def _perplexities(per_tower, per_replica):
    """Per tower: its perplexity (from the replicas' mean NLL) and the range over its replicas."""
    return " / ".join(
        f"{number(tower, 1)} ({number(min(replicas), 1)}-{number(max(replicas), 1)})"
        for tower, replicas in zip(per_tower, per_replica)
    )


def runs_table(frame):
    return pd.DataFrame(
        {
            "run": frame["run"],
            "text": frame["text"],
            "joint ppl": frame["joint_perplexity"].map(lambda value: number(value, 1)),
            "probe ppl per tower (replica range)": [
                _perplexities(*values) for values in zip(frame["probe_perplexity"], frame["probe_replica_perplexity"])
            ],
            "probe stop step": frame["probe_stop_step"],
            "offset (nats)": frame["global_offset_nats"].map(number),
            "reliability (95% interval)": [
                f"{number(value)} ({number(low)} to {number(high)})"
                for value, low, high in zip(
                    frame["reliability"], frame["reliability_ci_low"], frame["reliability_ci_high"]
                )
            ],
            "one probe": frame["reliability_single_probe"].map(number),
            "significant: replica-level": frame["significant_share"].map(number),
            "occurrence-level": frame["occurrence_significant_share"].map(number),
            "two-tower diff (nats)": frame["two_tower_difference_nats"].map(number),
            "same-tower floor": frame["same_tower_floor_nats"].map(number),
            "eligible types": frame["num_eligible_types"],
            "run minutes": frame["run_minutes"].map(lambda value: number(value, 1)),
        }
    )


def category_sections(by_family, report_dir, text):
    """Per family: the category plot of the first seed (written here) and the table of every seed's shares."""
    families = []
    for (family, num_towers), per_seed in by_family.items():
        first_seed = next(iter(per_seed))
        plot = f"categories_{family}.png"
        plot_category_preferences(per_seed[first_seed]["kind"], report_dir / plot, f"{family}: {first_seed} on {text}")
        families.append({"name": family, "num_towers": num_towers, "plot": plot,
                         "table": markdown_table(category_table(per_seed))})
    has_part_of_speech = any("pos" in per_run for per_seed in by_family.values() for per_run in per_seed.values())
    return {"text": text, "has_part_of_speech": has_part_of_speech, "families": families}


def top_types(runs_dir, summaries, text, count=TOP_TYPES):
    """Per family, its first seed's `count` most reliably preferred types of each tower (smallest replica-level
    p-value, then largest preference) on `text`."""
    first = {}
    for summary in summaries:
        first.setdefault(summary["run"]["family"], summary["run"]["name"])
    result = {}
    for family, name in first.items():
        table = load_kept_report(score_dir(runs_dir, name, text)).table
        eligible = table[table["eligible"]].assign(strength=lambda frame: -frame["preference_nats_tower0"].abs())
        result[family] = {"run": name, "towers": [
            eligible[eligible["preferred_tower"] == tower].sort_values(["p_value", "strength"]).head(count)[
                ["token", "preference_nats_tower0", "p_value", "count"]].to_dict("records")
            for tower in range(tower_columns(table, "preference_nats").shape[0])
        ]}
    return result


def machine_description():
    """Where the report was generated, for its first line."""
    return {
        "date": date.today().isoformat(),
        "architecture": platform.machine(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def render_template(name, **context):
    """A document from evaluation/study/templates (shipped with the package), with the report's number filters."""
    return template_environment(TEMPLATES_DIR, fmt=number, percent=percent).get_template(name).render(**context)


def family_runs(summaries, runs_dir, text, family):
    return [load_run_types(score_dir(runs_dir, summary["run"]["name"], text), summary["run"]["name"],
                           summary["run"]["seed"])
            for summary in summaries if summary["run"]["family"] == family and text in summary["scores"]]


def text_verdicts(summaries, runs_dir, text, study):
    """Per cooperative family with finished runs: its verdict on `text` against its control's runs."""
    verdicts = {}
    for name, family in study.families.items():
        runs = family_runs(summaries, runs_dir, text, name)
        if family.control_of is not None or not runs:
            continue
        control = next((other for other, spec in study.families.items() if spec.control_of == name), None)
        control_runs = family_runs(summaries, runs_dir, text, control) if control else []
        verdicts[name] = {"control": control, "replicas": study.probe["probe_replicas"],
                          **family_verdict(runs, control_runs)}
    return verdicts


def family_quality(summaries, family, control, text, unigram_entropy):
    """The family's (and its control's) model quality at the end of pretraining, averaged over seeds: joint
    perplexity on `text`, validation loss; for masked transformers, that loss against the unigram cross-entropy."""
    def mean_of(name, value):
        values = [value(summary) for summary in summaries if summary["run"]["family"] == name]
        return float(np.mean(values)) if values else None

    loss = mean_of(family, lambda summary: summary["pretrain"]["eval_history"][-1]["loss"])
    quality = {
        "joint_perplexity": mean_of(family, lambda summary: summary["scores"][text]["perplexity"]["joint"]),
        "control_joint_perplexity": mean_of(control, lambda summary: summary["scores"][text]["perplexity"]["joint"]),
        "validation_loss_nats": loss,
        "unigram_entropy_nats": unigram_entropy,
    }
    model = next(summary for summary in summaries if summary["run"]["family"] == family)["model"]
    if model["objective"] == "masked" and TOWER_KINDS[model["tower_type"]].sees_predicted_token:  # masked in training
        quality["masked_loss_nats"] = loss
        quality["masked_below_unigram_nats"] = None if unigram_entropy is None else unigram_entropy - loss
        quality["meets_masked_criterion"] = None if unigram_entropy is None else bool(
            unigram_entropy - loss >= MASKED_MARGIN_NATS
        )
    return quality


def convergence_checks(summaries, convergence):
    """Per convergence run: its family's run of the same seed against it (`convergence_check`), with both curves."""
    checks = []
    for long_run in convergence or []:
        run = next((summary for summary in summaries if summary["run"]["family"] == long_run["family"]
                    and summary["run"]["seed"] == long_run["seed"]), None)
        if run is None or not long_run["eval_history"]:
            continue
        history = run["pretrain"]["eval_history"]
        check = convergence_check(history, long_run["eval_history"], history[-1]["step"], long_run["max_train_steps"])
        checks.append({"family": long_run["family"], "seed": long_run["seed"], **check, "history": history,
                       "long_history": long_run["eval_history"]})
    return checks


def summary_lines(verdicts) -> list[str]:
    """One Markdown line per family: its verdict with the figures behind it (the README quotes these lines)."""
    lines = []
    for family, verdict in verdicts.items():
        seeds = len(verdict["seeds"])
        line = f"- **{family}** ({seeds} seed{'s' if seeds != 1 else ''}): *{verdict['conclusion']}*; reliability "
        line += with_interval(verdict["reliability"], verdict["reliability_ci"], 2)
        if verdict["control_reliability"] is not None:
            line += f" vs {with_interval(verdict['control_reliability'], verdict['control_reliability_ci'], 2)} for "
            difference = with_interval(verdict["difference"], verdict["difference_ci"], 2)
            line += f"independent towers (difference {difference})"
        over_floor = with_interval(verdict["preference_over_floor"], verdict["preference_over_floor_ci"], 2)
        line += f", over the same-tower floor by {over_floor} nats"
        if verdict["cross_seed_r"] is not None:
            line += (f", cross-seed r {with_interval(verdict['cross_seed_r'], verdict['cross_seed_r_ci'], 2)} "
                     f"(null {number(verdict['cross_seed_null_r'], 2)})")
        lines.append(line + ".")
    return lines


def verdict_rows(verdicts):
    """The verdicts as a table: one row per family, every figure with its interval."""
    return pd.DataFrame([
        {"family": family, "seeds": len(verdict["seeds"]), "joint ppl": number(verdict["joint_perplexity"], 1),
         "reliability": with_interval(verdict["reliability"], verdict["reliability_ci"]),
         "control reliability": with_interval(verdict["control_reliability"], verdict["control_reliability_ci"]),
         "difference": with_interval(verdict["difference"], verdict["difference_ci"]),
         "over floor (nats)": with_interval(verdict["preference_over_floor"], verdict["preference_over_floor_ci"]),
         "control over floor": with_interval(verdict["control_preference_over_floor"],
                                       verdict["control_preference_over_floor_ci"]),
         "cross-seed r": with_interval(verdict["cross_seed_r"], verdict["cross_seed_r_ci"]),
         "null r (95th pct)": "n/a" if verdict["cross_seed_null_r"] is None else
         f"{number(verdict['cross_seed_null_r'])} ({number(verdict['cross_seed_null_r_95'])})",
         "verdict": verdict["conclusion"]}
        for family, verdict in verdicts.items()
    ])


@dataclasses.dataclass
class StudyAnalysis:
    """Every figure and table of the document, computed once from the finished runs."""

    primary_text: str  # the first evaluation text: the document's tables and plots
    rows: list  # run_rows
    trajectory: list  # trajectory_rows on the primary text
    verdicts_by_text: dict  # text -> family -> verdict
    cross_fit_by_text: dict  # text -> family -> cross-fitted verdict
    long_run: list
    size_grid: list
    checks: list  # convergence checks
    categories: dict  # (family, num_towers) -> run -> grouping -> table
    recurrence: list
    top_types: dict
    num_runs: int
    total_minutes: float
    longest_run_minutes: float
    factorial: dict | None = None  # the 2x2 of cooperation and embedding sharing, where the families cross them
    joint_gradient: dict | None = None  # the joint-gradient experiment, where the study has its two arms

    @property
    def verdicts(self):
        return self.verdicts_by_text[self.primary_text]

    @property
    def cross_fit(self):
        return self.cross_fit_by_text[self.primary_text]


def analyse_runs(summaries, runs_dir, study, convergence=None, unigram_entropy=None,
                 type_tag_table_of=None) -> StudyAnalysis:
    """The verdicts (on every text, with the model quality of each arm), the cross-fitted verdicts, the long-run
    rows, the size grid, the convergence checks, the token categories of the finished runs and the 2x2 (its
    part-of-speech endpoint from `type_tag_table_of(text, tokenizer_file)`, factorial_analysis) and the joint-gradient
    experiment (joint_gradient_analysis)."""
    primary = next(iter(study.eval_texts))
    trajectory = trajectory_rows(summaries, primary)
    verdicts_by_text = {text: text_verdicts(summaries, runs_dir, text, study) for text in study.eval_texts}
    for text, by_family in verdicts_by_text.items():
        for family, verdict in by_family.items():
            verdict |= family_quality(summaries, family, verdict["control"], text, unigram_entropy)
    for family, verdict in verdicts_by_text[primary].items():
        verdict["matched_quality"] = matched_quality(trajectory, family, verdict["control"])
    categories = category_rows(summaries, runs_dir, primary)
    total_minutes, longest_run_minutes = compute_minutes(summaries)
    return StudyAnalysis(
        primary_text=primary,
        rows=run_rows(summaries),
        trajectory=trajectory,
        verdicts_by_text=verdicts_by_text,
        cross_fit_by_text={text: cross_fit_verdicts(summaries, runs_dir, text, study) for text in study.eval_texts},
        long_run=long_run_rows(summaries, primary, study) if study.long_run else [],
        size_grid=size_grid_rows(summaries, runs_dir, primary, study),
        checks=convergence_checks(summaries, convergence),
        categories=categories,
        recurrence=category_recurrence(categories),
        top_types=top_types(runs_dir, summaries, primary),
        num_runs=len(summaries),
        total_minutes=total_minutes,
        longest_run_minutes=longest_run_minutes,
        factorial=factorial_analysis(summaries, runs_dir, study, type_tag_table_of=type_tag_table_of),
        joint_gradient=joint_gradient_analysis(summaries, runs_dir, study, type_tag_table_of=type_tag_table_of),
    )


def study_document(analysis: StudyAnalysis, command, study, report_dir) -> str:
    """STUDY.md from the template; draws the plots it shows into report_dir."""
    frame = pd.DataFrame(analysis.rows)
    plot_noise_floor(frame, report_dir / "noise_floor.png")
    plot_trajectory(analysis.trajectory, study, report_dir / "trajectory.png")
    if analysis.checks:
        plot_convergence(analysis.checks, report_dir / "convergence.png")
    verdicts, cross_fit, primary = analysis.verdicts, analysis.cross_fit, analysis.primary_text
    family_names = [family for family, _ in analysis.categories]
    return render_template(
        STUDY_TEMPLATE,
        command=command,
        machine=machine_description(),
        study=study,
        primary_text=primary,
        num_replicas=study.probe["probe_replicas"],
        verdicts=verdicts,
        summary_lines=summary_lines(verdicts),
        cross_fit_lines=cross_fit_summary_lines(cross_fit),
        cross_fit_verdicts=cross_fit,
        cross_fit_other_texts={text: cross_fit_summary_lines(by_family)
                               for text, by_family in analysis.cross_fit_by_text.items()
                               if text != primary and by_family},
        cross_fit_table=markdown_table(cross_fit_table(cross_fit)) if cross_fit else None,
        cross_fit_groups=replica_groups(study.probe["probe_replicas"]),
        near_zero_r=NEAR_ZERO_R,
        long_run=analysis.long_run,
        size_grid_table=markdown_table(size_grid_table(analysis.size_grid)) if len(analysis.size_grid) > 1 else None,
        long_run_table=markdown_table(long_run_table(analysis.long_run)) if analysis.long_run else None,
        verdicts_table=markdown_table(verdict_rows(verdicts)),
        other_texts={text: markdown_table(verdict_rows(by_family))
                     for text, by_family in analysis.verdicts_by_text.items() if text != primary and by_family},
        checks=analysis.checks,
        convergence_tolerance=CONVERGENCE_TOLERANCE,
        null_permutations=NULL_PERMUTATIONS,
        masked_margin=MASKED_MARGIN_NATS,
        trajectory_table=markdown_table(trajectory_table(analysis.trajectory)),
        num_runs=analysis.num_runs,
        total_minutes=analysis.total_minutes,
        longest_run_minutes=analysis.longest_run_minutes,
        runs_table=markdown_table(runs_table(frame)),
        categories=category_sections(analysis.categories, report_dir, primary),
        recurrence_table=(markdown_table(recurrence_table(analysis.recurrence, family_names))
                          if analysis.recurrence else None),
        top_types=analysis.top_types,
        factorial=factorial_context(analysis.factorial, markdown_table),
        gradient=gradient_context(analysis.joint_gradient, markdown_table),
        run_families={row["family"] for row in analysis.rows},  # a family without finished runs is not described
        full_tables=full_tables_note(report_dir),
    )


def study_results(analysis: StudyAnalysis, command) -> dict:
    """study.json: every number of the document (the bootstrap replicates left out)."""
    return {
        "command": command,
        "verdicts": _without_bootstrap_values(analysis.verdicts),
        "cross_fit_verdicts": analysis.cross_fit,
        "cross_fit_verdicts_by_text": analysis.cross_fit_by_text,
        "long_run": analysis.long_run,
        "size_grid": analysis.size_grid,
        "verdicts_by_text": {text: _without_bootstrap_values(by_text)
                             for text, by_text in analysis.verdicts_by_text.items()},
        "convergence": [{key: value for key, value in check.items() if key not in ("history", "long_history")}
                        for check in analysis.checks],
        "trajectory": analysis.trajectory,
        "runs": analysis.rows,
        "categories": {f"{family}-t{num_towers}": {
            run: {grouping: frame.to_dict("records") for grouping, frame in per_run.items()}
            for run, per_run in per_seed.items()} for (family, num_towers), per_seed in analysis.categories.items()},
        "category_recurrence": analysis.recurrence,
        "top_types": analysis.top_types,
        **({"factorial": analysis.factorial} if analysis.factorial else {}),
        **({"joint_gradient": analysis.joint_gradient} if analysis.joint_gradient else {}),
    }


def write_study_report(summaries, runs_dir, report_dir, command, study, convergence=None, unigram_entropy=None,
                       type_tag_table_of=None):
    """Aggregate finished runs into report_dir (STUDY.md, study.json, plots); returns the STUDY.md path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyse_runs(summaries, runs_dir, study, convergence, unigram_entropy, type_tag_table_of)
    document = study_document(analysis, command, study, report_dir)
    write_text_atomically(report_dir / STUDY_JSON, json.dumps(study_results(analysis, command), indent=2) + "\n")
    write_dataset_card(summaries, report_dir, study, render_template)  # where runs keep per-type sums
    written = write_text_atomically(report_dir / STUDY_MD, document)
    remove_stale_plots(report_dir, document)
    return written


def remove_stale_plots(report_dir, document):
    """Delete the plots an earlier document had and this one does not show (a family whose runs are gone, a
    convergence plot without a convergence run), so the folder holds only what the document describes."""
    for pattern in STUDY_PLOTS:
        for plot in report_dir.glob(pattern):
            if f"]({plot.name})" not in document:
                plot.unlink()


def _without_bootstrap_values(verdicts):
    return {family: {key: value for key, value in verdict.items() if key != "values"}
            for family, verdict in verdicts.items()}


def trajectory_table(trajectory):
    frame = pd.DataFrame(trajectory)
    return pd.DataFrame({
        "run": frame["run"], "step": frame["step"],
        "validation loss": frame["validation_loss"].map(number),
        "probe ppl": frame["probe_perplexity"].map(lambda value: number(value, 1)),
        "joint ppl": frame["joint_perplexity"].map(lambda value: number(value, 1)),
        "reliability": frame["reliability"].map(number),
        "over floor (nats)": frame["preference_over_floor"].map(number),
    })
