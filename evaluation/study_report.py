"""
The results document of a tower preference study: per-run tables of the replica-level figures against the
same-tower noise floor, agreement across pretraining seeds, the independent-towers control, token categories, plots,
and plain verdicts. This module computes the figures, tables and plots; the text is the Jinja template
templates/study.md.j2.

Layout of the report folder:
    STUDY.md                the document (commands, machine, tables, plots, verdicts)
    study.json              every number of the tables
    noise_floor.png         per run and text: two-tower difference vs the same-tower floor, replica-level vs
                            occurrence-level significance, reliability with its 95% interval
    cross_seed.png          matched correlation of per-type preferences between seeds, with its ceiling
    categories_FAMILY-tN_TEXT.png  which token categories each tower prefers (first seed)
"""

import itertools
import json
import os
import platform
from datetime import date

import numpy as np
import pandas as pd
import torch
from matplotlib import pyplot as plt
from scipy import stats

from twotower.training.atomic import write_text_atomically

from .report import eligible_preferences, load_report, save_figure, template_environment
from .token_categories import categorize, category_preferences, plot_category_preferences
from .tower_preference.preference_stats import compare_preferences


RECURRENCE_ALPHA = 0.01  # every seed pair's correlation must be this significant for a split to "recur"
STUDY_MD = "STUDY.md"
STUDY_JSON = "study.json"
STUDY_TEMPLATE = "study.md.j2"


def _fmt(value, digits=3):
    return "n/a" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.{digits}f}"


def _percent(share):
    return "n/a" if share is None or np.isnan(share) else f"{100 * share:.1f}%"


def _difference(value, reference):
    return None if value is None or reference is None else value - reference


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
                    "excess_difference_nats": _difference(
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
    """Wall-clock minutes of the whole run (pretraining, the probe run, scoring every text); None when a score
    folder was reused from an interrupted run, whose scoring time is not known."""
    phases = [summary["pretrain"], summary["probe"], *summary["scores"].values()]
    seconds = [phase["seconds"] for phase in phases]
    return None if None in seconds else sum(seconds) / 60


def correlation_p_value(correlation, num_types):
    """Two-sided p-value of a Pearson correlation over num_types pairs (t test with num_types - 2 degrees of freedom).

    For two towers the matched correlation is |r|, whose p-value under no relation is exactly this one.
    """
    degrees = num_types - 2
    t_statistic = abs(correlation) * np.sqrt(degrees / max(1e-300, 1 - correlation**2))
    return float(2 * stats.t.sf(t_statistic, degrees))


def correlation_ceiling(reliability_a, reliability_b):
    """The correlation two runs' per-type preferences would show if their towers split the types identically:
    probe noise independent between runs attenuates it to sqrt(reliability_a * reliability_b)."""
    if reliability_a is None or reliability_b is None:
        return None
    return float(np.sqrt(max(reliability_a, 0.0) * max(reliability_b, 0.0)))


def cross_seed_rows(rows, runs_dir):
    """Per (family, towers, text): matched correlation of the replica-mean per-type preferences between seeds."""
    groups = {}
    for row in rows:
        groups.setdefault((row["family"], row["num_towers"], row["text"]), []).append(row)
    results = []
    for (family, num_towers, text), group in groups.items():
        if len(group) < 2:
            continue
        correlations, p_values, ceilings = [], [], []
        for first, second in itertools.combinations(group, 2):
            tables = [load_report(score_dir(runs_dir, row["run"], text))[1] for row in (first, second)]
            (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, tables)
            comparison = compare_preferences(ids_a, preference_a, ids_b, preference_b)
            correlations.append(comparison["correlation"])
            p_values.append(correlation_p_value(comparison["correlation"], comparison["num_shared_types"]))
            ceilings.append(correlation_ceiling(first["reliability"], second["reliability"]))
        results.append(
            {
                "family": family,
                "num_towers": num_towers,
                "text": text,
                "num_seeds": len(group),
                "correlation": float(np.mean(correlations)),
                "correlations": correlations,
                "p_values": p_values,
                "ceiling": None if None in ceilings else float(np.mean(ceilings)),
                "ceilings": ceilings,
                "recurs": max(p_values) < RECURRENCE_ALPHA,
            }
        )
    return results


def category_rows(summaries, runs_dir, text):
    """Per family (its first tower count): token categories of each seed, towers aligned to the first seed's."""
    by_family = {}
    for summary in summaries:
        run = summary["run"]
        if text in summary["scores"]:
            by_family.setdefault((run["family"], run["num_towers"]), []).append(run["name"])
    results = {}
    for (family, num_towers), names in by_family.items():
        _, reference = load_report(score_dir(runs_dir, names[0], text))
        per_seed = {}
        for name in names:
            _, table = load_report(score_dir(runs_dir, name, text))
            (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, (reference, table))
            mapping = compare_preferences(ids_a, preference_a, ids_b, preference_b)["tower_mapping"]
            labels = categorize(table)
            per_seed[name] = {
                column: category_preferences(table, values).assign(tower_of_reference_0=mapping[0])
                for column, values in labels.items()
            }
        results[(family, num_towers)] = per_seed
    return results


def plot_noise_floor(frame, path):
    """Per run and text: two towers against the same-tower floor, the two tests, and the reliability."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 0.4 * len(frame) + 1.5), sharey=True)
    positions = np.arange(len(frame))
    panels = (
        ("two_tower_difference_nats", "two towers", "same_tower_floor_nats", "same tower (floor)"),
        ("significant_share", "replica-level test", "occurrence_significant_share", "occurrence-level test"),
    )
    titles = ("mean |difference| between probes (nats)", "share of eligible token types significant")
    for axis, (key, label, other_key, other_label), title in zip(axes, panels, titles):
        axis.barh(positions - 0.2, frame[key].fillna(0), height=0.4, label=label)
        axis.barh(positions + 0.2, frame[other_key].fillna(0), height=0.4, label=other_label)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8, loc="lower right")
    low, high = frame[["reliability_ci_low", "reliability_ci_high"]].to_numpy(dtype=float).T
    axes[2].hlines(positions, low, high, color="C0", label="95% interval")
    axes[2].scatter(frame["reliability"].to_numpy(dtype=float), positions, color="C0", label="reliability")
    axes[2].scatter(
        frame["reliability_single_probe"].to_numpy(dtype=float), positions, color="C1", marker="x", label="one probe"
    )
    axes[2].axvline(0, color="gray", linewidth=0.8)
    axes[2].set_title("reliability", fontsize=10)
    axes[2].legend(fontsize=8, loc="best")
    axes[0].set_yticks(positions, [f"{row.run} / {row.text}" for row in frame.itertuples()], fontsize=8)
    axes[0].invert_yaxis()
    figure.tight_layout()
    save_figure(figure, path)


def plot_cross_seed(rows, path):
    figure, axis = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    for index, row in enumerate(rows):
        axis.scatter(row["correlations"], [index] * len(row["correlations"]), color="C0")
        if row["ceiling"] is not None:
            axis.scatter(row["ceilings"], [index] * len(row["ceilings"]), color="C1", marker="|", s=200)
    axis.scatter([], [], color="C0", label="seed pair")
    axis.scatter([], [], color="C1", marker="|", s=200, label="ceiling: identical splits seen through probe noise")
    axis.set_yticks(range(len(rows)), [f"{r['family']} t{r['num_towers']} / {r['text']}" for r in rows], fontsize=8)
    axis.axvline(0, color="gray", linewidth=0.8)
    axis.set_xlabel("matched correlation of per-type preferences between two seeds")
    axis.legend(fontsize=8)
    axis.invert_yaxis()
    figure.tight_layout()
    save_figure(figure, path)


def markdown_table(frame):
    """A DataFrame of formatted cells as a Markdown table; cells stay as written (no parsing into numbers)."""
    return frame.to_markdown(index=False, disable_numparse=True)


def family_verdicts(frame, cross_rows):
    """Per family, the figures its verdict states: averages over its run/text pairs, and its cross-seed rows."""
    averaged = ["reliability", "reliability_single_probe", "significant_share", "occurrence_significant_share"]
    averaged += ["two_tower_difference_nats", "same_tower_floor_nats"]
    families = []
    for family, group in frame.groupby("family", sort=False):
        families.append(
            {
                "name": family,
                "num_pairs": len(group),
                "probe_replicas": int(group["probe_replicas"].max()),
                "reliability_ci_low": group["reliability_ci_low"].min(),
                "reliability_ci_high": group["reliability_ci_high"].max(),
                **group[averaged].mean().to_dict(),
                "num_above_floor": int((group["excess_difference_nats"] > 0).sum()),
                "cross_seed": [row for row in cross_rows if row["family"] == family],
            }
        )
    return families


def cooperation_verdicts(frame, study):
    """Per cooperative family with its independent-towers control in the runs: both families' averaged figures."""
    means = frame.groupby("family")[["reliability", "significant_share", "excess_difference_nats"]].mean()
    pairs = []
    for name, family in study.families.items():
        if family.control_of is None or not {name, family.control_of} <= set(means.index):
            continue
        pairs.append(
            {
                "family": family.control_of,
                "control": name,
                "family_means": means.loc[family.control_of].to_dict(),
                "control_means": means.loc[name].to_dict(),
            }
        )
    return pairs


def _perplexities(per_tower, per_replica):
    """Per tower: its perplexity (from the replicas' mean NLL) and the range over its replicas."""
    return " / ".join(
        f"{_fmt(tower, 1)} ({_fmt(min(replicas), 1)}-{_fmt(max(replicas), 1)})"
        for tower, replicas in zip(per_tower, per_replica)
    )


def runs_table(frame):
    return pd.DataFrame(
        {
            "run": frame["run"],
            "text": frame["text"],
            "joint ppl": frame["joint_perplexity"].map(lambda value: _fmt(value, 1)),
            "probe ppl per tower (replica range)": [
                _perplexities(*values) for values in zip(frame["probe_perplexity"], frame["probe_replica_perplexity"])
            ],
            "probe stop step": frame["probe_stop_step"],
            "offset (nats)": frame["global_offset_nats"].map(_fmt),
            "reliability (95% interval)": [
                f"{_fmt(value)} ({_fmt(low)} to {_fmt(high)})"
                for value, low, high in zip(
                    frame["reliability"], frame["reliability_ci_low"], frame["reliability_ci_high"]
                )
            ],
            "one probe": frame["reliability_single_probe"].map(_fmt),
            "significant: replica-level": frame["significant_share"].map(_fmt),
            "occurrence-level": frame["occurrence_significant_share"].map(_fmt),
            "two-tower diff (nats)": frame["two_tower_difference_nats"].map(_fmt),
            "same-tower floor": frame["same_tower_floor_nats"].map(_fmt),
            "eligible types": frame["num_eligible_types"],
            "run minutes": frame["run_minutes"].map(lambda value: _fmt(value, 1)),
        }
    )


def cross_seed_table(cross_rows):
    frame = pd.DataFrame(cross_rows)
    return pd.DataFrame(
        {
            "family": frame["family"],
            "towers": frame["num_towers"],
            "text": frame["text"],
            "seeds": frame["num_seeds"],
            "matched r": frame["correlation"].map(_fmt),
            "largest p": frame["p_values"].map(lambda p_values: f"{max(p_values):.2g}"),
            "ceiling": frame["ceiling"].map(_fmt),
            "recurs": frame["recurs"].map({True: "yes", False: "no"}),
        }
    )


def _category_share(frame, category):
    """One seed's share of a category's types preferring the reference tower 0; `*` when the split differs."""
    match = frame[frame["category"] == category]
    if match.empty:
        return "n/a"
    tower = int(match["tower_of_reference_0"].iloc[0])
    share = match[f"num_preferring_tower{tower}"].iloc[0] / match["num_types"].iloc[0]
    return f"{share:.2f}{'*' if match['q_value'].iloc[0] < 0.05 else ''}"


def category_table(per_seed):
    """Per category of the first seed: its number of types and every seed's share preferring tower 0."""
    seeds = list(per_seed)
    rows = [
        [grouping, category, int(num_types), *(_category_share(per_seed[seed][grouping], category) for seed in seeds)]
        for grouping, frame in per_seed[seeds[0]].items()
        for category, num_types in zip(frame["category"], frame["num_types"])
    ]
    return pd.DataFrame(rows, columns=["grouping", "category", "types", *seeds])


def category_sections(categories, report_dir):
    """Per evaluation text and family: the category plot of the first seed (written here) and the table."""
    sections = []
    for text, by_family in categories.items():
        families = []
        for (family, num_towers), per_seed in by_family.items():
            first_seed = next(iter(per_seed))
            plot = f"categories_{family}-t{num_towers}_{text}.png"
            title = f"{family}: {first_seed} on {text}"
            plot_category_preferences(per_seed[first_seed]["kind"], report_dir / plot, title)
            table = markdown_table(category_table(per_seed))
            families.append({"name": family, "num_towers": num_towers, "plot": plot, "table": table})
        has_part_of_speech = any("pos" in per_run for per_seed in by_family.values() for per_run in per_seed.values())
        sections.append({"text": text, "has_part_of_speech": has_part_of_speech, "families": families})
    return sections


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
    """A document from evaluation/templates (shipped with the package), with the report's number filters."""
    return template_environment(fmt=_fmt, percent=_percent).get_template(name).render(**context)


def study_json(command, rows, cross_rows, categories):
    """Every number of the tables, as study.json stores them."""
    return {
        "command": command,
        "runs": rows,
        "cross_seed": cross_rows,
        "categories": {
            text: {
                f"{family}-t{num_towers}": {
                    run: {grouping: frame.to_dict("records") for grouping, frame in per_run.items()}
                    for run, per_run in per_seed.items()
                }
                for (family, num_towers), per_seed in text_categories.items()
            }
            for text, text_categories in categories.items()
        },
    }


def write_study_report(summaries, runs_dir, report_dir, command, study):
    """Aggregate finished runs into report_dir (STUDY.md, study.json, plots); returns the STUDY.md path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = run_rows(summaries)
    frame = pd.DataFrame(rows)
    cross_rows = cross_seed_rows(rows, runs_dir)
    categories = {text: category_rows(summaries, runs_dir, text) for text in study.eval_texts}
    plot_noise_floor(frame, report_dir / "noise_floor.png")
    if cross_rows:
        plot_cross_seed(cross_rows, report_dir / "cross_seed.png")
    minutes = frame["run_minutes"].dropna()
    document = render_template(
        STUDY_TEMPLATE,
        command=command,
        machine=machine_description(),
        num_replicas=study.probe["probe_replicas"],
        recurrence_alpha=RECURRENCE_ALPHA,
        families=family_verdicts(frame, cross_rows),
        cooperation=cooperation_verdicts(frame, study),
        num_runs=len(summaries),
        longest_run_minutes=minutes.max() if len(minutes) else None,
        runs_table=markdown_table(runs_table(frame)),
        cross_seed_table=markdown_table(cross_seed_table(cross_rows)) if cross_rows else None,
        category_sections=category_sections(categories, report_dir),
    )
    results = study_json(command, rows, cross_rows, categories)
    write_text_atomically(report_dir / STUDY_JSON, json.dumps(results, indent=2) + "\n")
    return write_text_atomically(report_dir / STUDY_MD, document)
