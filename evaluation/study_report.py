"""
The results document of a tower preference study: per-run tables against the same-tower noise floor, agreement
across seeds, the independent-towers control, token categories, plots, and plain verdicts.

Layout of the report folder:
    STUDY.md                the document (commands, machine, tables, plots, verdicts)
    study.json              every number of the tables
    noise_floor.png         preference size, significance, consistency: two towers vs the same tower twice
    cross_seed.png          matched correlation of per-token preferences between seeds, two towers vs floor
    categories_FAMILY-tN_TEXT.png  which token categories each tower prefers (first seed)
"""

import itertools
import json
import os
import platform
from datetime import date

import numpy as np
import torch
from matplotlib import pyplot as plt
from scipy import stats

from twotower.training.atomic import write_text_atomically

from .report import eligible_preferences, load_report, save_figure
from .token_categories import categorize, category_preferences, plot_category_preferences
from .tower_preference.preference_stats import compare_preferences


RECURRENCE_ALPHA = 0.01  # every seed pair's correlation must be this significant for a split to "recur"
STUDY_MD = "STUDY.md"
STUDY_JSON = "study.json"
TOWERS, ACROSS_RUNS = "towers", "towers_across_runs"
FLOOR_KEYS = ("significant_share", "split_half_consistency", "mean_abs_preference_nats")


def _fmt(value, digits=3):
    return "n/a" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.{digits}f}"


def _mean(values):
    values = [value for value in values if value is not None]
    return float(np.mean(values)) if values else None


def _floor_names(num_towers):
    return [f"same_tower_{tower}" for tower in range(num_towers)]


def run_rows(summaries):
    """One row per (run, evaluation text): the two-tower preference next to its same-tower noise floor."""
    rows = []
    for summary in summaries:
        run = summary["run"]
        for text, scores in summary["scores"].items():
            pairs = scores["pairs"]
            same_run, across = pairs[TOWERS]["centered"], pairs[ACROSS_RUNS]["centered"]
            floors = [pairs[name]["centered"] for name in _floor_names(run["num_towers"])]
            floor = {key: _mean([f[key] for f in floors]) for key in FLOOR_KEYS}
            rows.append(
                {
                    "run": run["name"],
                    "family": run["family"],
                    "num_towers": run["num_towers"],
                    "seed": run["seed"],
                    "text": text,
                    "joint_perplexity": scores["perplexity"]["joint"],
                    "probe_perplexity": scores["perplexity"]["probe_sets"][0],
                    "probe_best_steps": [_probe_steps(probe) for probe in summary["probes"]],
                    "global_offset_nats": pairs[TOWERS]["raw"]["global_offset_nats"][0],
                    "significant_share_raw": pairs[TOWERS]["raw"]["significant_share"],
                    "significant_share_same_run": same_run["significant_share"],
                    "significant_share": across["significant_share"],
                    "floor_significant_share": floor["significant_share"],
                    "excess_significant_share": _difference(across["significant_share"], floor["significant_share"]),
                    "split_half_consistency": across["split_half_consistency"],
                    "floor_split_half_consistency": floor["split_half_consistency"],
                    "mean_abs_preference_nats": across["mean_abs_preference_nats"],
                    "floor_mean_abs_preference_nats": floor["mean_abs_preference_nats"],
                    "replica_correlation": scores["replica_correlation"],
                    "replica_p_value": correlation_p_value(scores["replica_correlation"], scores["replica_num_types"]),
                    "num_eligible_types": same_run["num_eligible_types"],
                    "run_minutes": run_minutes(summary),
                }
            )
    return rows


def _p_text(p_value):
    return "< 1e-300" if p_value == 0 else f"{p_value:.1g}"  # float64 underflows below ~1e-308


def _difference(value, reference):
    return None if value is None or reference is None else value - reference


def _probe_steps(probe):
    """The step whose weights a probe run kept, marked when the step cap, not the validation loss, ended the run."""
    step = probe["best_step"] or probe["completed_steps"]
    if probe["stopped_early"]:
        return str(step)
    return f"{step} (cap)" if step == probe["completed_steps"] else f"{step} (cap {probe['completed_steps']})"


def run_minutes(summary):
    """Wall-clock minutes of the whole run (pretraining, both probe sets, scoring every text)."""
    phases = [summary["pretrain"], *summary["probes"], *summary["scores"].values()]
    return sum(phase["seconds"] for phase in phases) / 60


def correlation_p_value(correlation, num_types):
    """Two-sided p-value of a Pearson correlation over num_types pairs (t test with num_types - 2 degrees of freedom).

    For two towers the matched correlation is |r|, whose p-value under no relation is exactly this one.
    """
    degrees = num_types - 2
    t_statistic = abs(correlation) * np.sqrt(degrees / max(1e-300, 1 - correlation**2))
    return float(2 * stats.t.sf(t_statistic, degrees))


def cross_seed_rows(summaries, runs_dir):
    """Per (family, towers, text): matched correlation of per-token preferences between every two seeds."""
    groups = {}
    for summary in summaries:
        run = summary["run"]
        for text in summary["scores"]:
            groups.setdefault((run["family"], run["num_towers"], text), []).append(run["name"])
    rows = []
    for (family, num_towers, text), names in groups.items():
        if len(names) < 2:
            continue
        towers, floors, p_values = [], [], []
        for first, second in itertools.combinations(names, 2):
            comparisons = {}
            for pair in (TOWERS, "same_tower_0"):
                _, table_a = load_report(runs_dir / first / "scores" / text / pair)
                _, table_b = load_report(runs_dir / second / "scores" / text / pair)
                (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, (table_a, table_b))
                comparisons[pair] = compare_preferences(ids_a, preference_a, ids_b, preference_b)
            towers.append(comparisons[TOWERS]["correlation"])
            floors.append(comparisons["same_tower_0"]["correlation"])
            p_values.append(correlation_p_value(towers[-1], comparisons[TOWERS]["num_shared_types"]))
        correlation, floor_correlation = float(np.mean(towers)), float(np.mean(floors))
        rows.append(
            {
                "family": family,
                "num_towers": num_towers,
                "text": text,
                "num_seeds": len(names),
                "correlation": correlation,
                "correlations": towers,
                "p_values": p_values,
                "floor_correlation": floor_correlation,
                "floor_correlations": floors,
                "recurs": max(p_values) < RECURRENCE_ALPHA and correlation > floor_correlation,
            }
        )
    return rows


def category_rows(summaries, runs_dir, text):
    """Per family (its first tower count): token categories of each seed, towers aligned to the first seed's."""
    by_family = {}
    for summary in summaries:
        run = summary["run"]
        if text in summary["scores"]:
            by_family.setdefault((run["family"], run["num_towers"]), []).append(run["name"])
    results = {}
    for (family, num_towers), names in by_family.items():
        _, reference = load_report(runs_dir / names[0] / "scores" / text / TOWERS)
        per_seed = {}
        for name in names:
            _, table = load_report(runs_dir / name / "scores" / text / TOWERS)
            (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, (reference, table))
            mapping = compare_preferences(ids_a, preference_a, ids_b, preference_b)["tower_mapping"]
            labels = categorize(table)
            per_seed[name] = {
                column: category_preferences(table, values).assign(tower_of_reference_0=mapping[0])
                for column, values in labels.items()
            }
        results[(family, num_towers)] = per_seed
    return results


def plot_noise_floor(rows, path):
    """Per run and text: the two-tower preference across probe runs next to the same-tower noise floor."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 0.4 * len(rows) + 1.5), sharey=True)
    labels = [f"{row['run']} / {row['text']}" for row in rows]
    positions = np.arange(len(rows))
    panels = (
        ("mean_abs_preference_nats", "floor_mean_abs_preference_nats", "mean absolute preference (nats)"),
        ("significant_share", "floor_significant_share", "share of token types significant"),
        ("split_half_consistency", "floor_split_half_consistency", "split-half consistency"),
    )
    for axis, (key, floor_key, title) in zip(axes, panels):
        axis.barh(positions - 0.2, [row[key] or 0 for row in rows], height=0.4, label="two towers, across runs")
        axis.barh(positions + 0.2, [row[floor_key] or 0 for row in rows], height=0.4, label="same tower (floor)")
        axis.set_title(title, fontsize=10)
    axes[0].set_yticks(positions, labels, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    save_figure(figure, path)


def plot_cross_seed(rows, path):
    figure, axis = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    for index, row in enumerate(rows):
        axis.scatter(row["correlations"], [index + 0.1] * len(row["correlations"]), color="C0")
        axis.scatter(row["floor_correlations"], [index - 0.1] * len(row["floor_correlations"]), color="C1")
    axis.scatter([], [], color="C0", label="two towers")
    axis.scatter([], [], color="C1", label="same tower (noise floor)")
    axis.set_yticks(range(len(rows)), [f"{r['family']} t{r['num_towers']} / {r['text']}" for r in rows], fontsize=8)
    axis.axvline(0, color="gray", linewidth=0.8)
    axis.set_xlabel("matched correlation of per-token preferences between two seeds")
    axis.legend(fontsize=8)
    axis.invert_yaxis()
    figure.tight_layout()
    save_figure(figure, path)


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def verdicts(rows, cross_rows, study):
    """Plain statements of what the runs show, family by family."""
    lines = []
    for family in dict.fromkeys(row["family"] for row in rows):
        family_rows = [row for row in rows if row["family"] == family and row["excess_significant_share"] is not None]
        above = [row for row in family_rows if row["mean_abs_preference_nats"] > row["floor_mean_abs_preference_nats"]]
        replicated = [row for row in family_rows if row["replica_p_value"] < RECURRENCE_ALPHA]
        lines += [
            f"- **{family}**: above the same-tower noise floor (larger mean absolute preference, towers and floor "
            f"both compared across probe runs) in {len(above)} of {len(family_rows)} "
            f"run/text pairs; mean absolute preference {_fmt(_mean([r['mean_abs_preference_nats'] for r in family_rows]))}"
            f" vs {_fmt(_mean([r['floor_mean_abs_preference_nats'] for r in family_rows]))} nats for the floor, "
            f"excess share of significant types {_fmt(_mean([r['excess_significant_share'] for r in family_rows]))}.",
            f"  - survives new probes (preference measured with probe set A correlates with probe set B's, "
            f"p < {RECURRENCE_ALPHA}) in {len(replicated)} of {len(family_rows)} run/text pairs; mean replica r "
            f"{_fmt(_mean([r['replica_correlation'] for r in family_rows]))}, roughly the share of one run's "
            "per-type preference variance that is a reproducible difference between the towers.",
        ]
        for row in (r for r in cross_rows if r["family"] == family):
            lines.append(
                f"  - across {row['num_seeds']} seeds on {row['text']} ({row['num_towers']} towers): matched "
                f"correlation {_fmt(row['correlation'])} (largest p-value over seed pairs "
                f"{max(row['p_values']):.2g}) vs {_fmt(row['floor_correlation'])} for the noise floor: "
                + (
                    "the split **recurs** across seeds."
                    if row["recurs"]
                    else "the split **does not recur** across "
                    f"seeds (every seed pair must correlate at p < {RECURRENCE_ALPHA} and beat the noise floor)."
                )
            )
    for name, family in study.families.items():
        if family.control_of is None:
            continue
        cooperative = [
            r for r in rows if r["family"] == family.control_of and r["excess_significant_share"] is not None
        ]
        control = [r for r in rows if r["family"] == name and r["excess_significant_share"] is not None]
        if cooperative and control:
            lines.append(
                f"- **cooperation** ({family.control_of} vs {name}, its independent-towers control): mean excess share "
                f"of significant types {_fmt(_mean([r['excess_significant_share'] for r in cooperative]))} vs "
                f"{_fmt(_mean([r['excess_significant_share'] for r in control]))}; mean replica r "
                f"{_fmt(_mean([r['replica_correlation'] for r in cooperative]))} vs "
                f"{_fmt(_mean([r['replica_correlation'] for r in control]))}."
            )
    return lines


def category_section(categories, text, report_dir):
    lines = [
        f"## Token categories ({text})",
        "",
        "Share of eligible token types preferring the first seed's tower 0 (towers of the other seeds matched to "
        "it by the correlation of their preferences); `*` marks a category whose split differs from the overall "
        "split (Benjamini-Hochberg q < 0.05 of a binomial test). Centered preferences. Per-tower counts of "
        "preferring and significant types are in study.json.",
        "",
    ]
    if not any("pos" in per_run for per_seed in categories.values() for per_run in per_seed.values()):
        lines += ["Part of speech: not reported, nltk's tagger data is not installed (it is never downloaded).", ""]
    for (family, num_towers), per_seed in categories.items():
        seeds = list(per_seed)
        first = per_seed[seeds[0]]
        plot_name = f"categories_{family}-t{num_towers}_{text}.png"
        plot_category_preferences(first["kind"], report_dir / plot_name, f"{family}: {seeds[0]} on {text}")
        lines += [f"### {family} ({num_towers} towers)", "", f"![categories of {family}]({plot_name})", ""]
        rows = []
        for column, frame in first.items():
            for category in frame["category"]:
                cells = [column, category, int(frame.loc[frame["category"] == category, "num_types"].iloc[0])]
                for seed in seeds:
                    seed_frame = per_seed[seed][column]
                    match = seed_frame[seed_frame["category"] == category]
                    if match.empty:
                        cells.append("n/a")
                        continue
                    tower = int(match["tower_of_reference_0"].iloc[0])
                    share = match[f"num_preferring_tower{tower}"].iloc[0] / match["num_types"].iloc[0]
                    cells.append(f"{share:.2f}{'*' if match['q_value'].iloc[0] < 0.05 else ''}")
                rows.append(cells)
        lines += _table(["grouping", "category", "types", *seeds], rows)
    return lines


def write_study_report(summaries, runs_dir, report_dir, command, study):
    """Aggregate finished runs into report_dir (STUDY.md, study.json, plots); returns the STUDY.md path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = run_rows(summaries)
    cross_rows = cross_seed_rows(summaries, runs_dir)
    categories = {text: category_rows(summaries, runs_dir, text) for text in study.eval_texts}
    plot_noise_floor(rows, report_dir / "noise_floor.png")
    if cross_rows:
        plot_cross_seed(cross_rows, report_dir / "cross_seed.png")

    lines = [
        "# Tower preference study",
        "",
        f"Generated by `{command}` on {date.today().isoformat()}: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads"
        f"{', GPU ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ', no GPU'}.",
        "",
        "Each run pretrains a model, trains two probe sets on it with different seeds (A and B: other initial probe "
        "weights and data order; each stopped on validation loss), and scores both on each text. A probe set trains "
        "one probe per tower in one run, so its probes share that run's noise (data order, stopping step). The "
        "*noise floor* compares probe A and probe B of the **same** tower; any preference it shows is probe noise. "
        "It is matched by the two-tower preference *across runs* (tower 0's probe from set A, tower 1's from set B), "
        "which differs from it only in comparing two towers: *excess* is their difference. *One run* is the "
        "preference of set A's probes alone, the paper's measurement. Preferences are centered: the global offset "
        "(one tower better overall) is removed before testing each token type. *Replica r* correlates the per-type "
        "preference measured with probe set A and with probe set B: their probe noise is independent, so only a "
        "real difference between the towers correlates (p-value of a Pearson test over the eligible types). "
        "Split-half consistency cannot tell the two apart: a probe's own bias for a token type is as stable over the "
        "text as a tower's.",
        "",
        "## Verdicts",
        "",
        *verdicts(rows, cross_rows, study),
        "",
        "## Runs",
        "",
        f"{len(summaries)} runs; the longest took {max(run_minutes(summary) for summary in summaries):.1f} minutes "
        "(pretraining, two probe sets, scoring every text).",
        "",
        "![noise floor](noise_floor.png)",
        "",
        *_table(
            [
                "run",
                "text",
                "joint ppl",
                "probe ppl (A)",
                "probe stop steps (A, B)",
                "offset (nats)",
                "significant, one run (raw / centered)",
                "significant, across runs",
                "floor",
                "excess",
                "consistency",
                "floor consistency",
                "mean abs pref (nats)",
                "floor",
                "replica r (p)",
                "eligible types",
                "run minutes",
            ],
            [
                [
                    r["run"],
                    r["text"],
                    _fmt(r["joint_perplexity"], 1),
                    " / ".join(_fmt(p, 1) for p in r["probe_perplexity"]),
                    ", ".join(str(s) for s in r["probe_best_steps"]),
                    _fmt(r["global_offset_nats"]),
                    f"{_fmt(r['significant_share_raw'])} / {_fmt(r['significant_share_same_run'])}",
                    _fmt(r["significant_share"]),
                    _fmt(r["floor_significant_share"]),
                    _fmt(r["excess_significant_share"]),
                    _fmt(r["split_half_consistency"]),
                    _fmt(r["floor_split_half_consistency"]),
                    _fmt(r["mean_abs_preference_nats"]),
                    _fmt(r["floor_mean_abs_preference_nats"]),
                    f"{_fmt(r['replica_correlation'])} ({_p_text(r['replica_p_value'])})",
                    r["num_eligible_types"],
                    _fmt(r["run_minutes"], 1),
                ]
                for r in rows
            ],
        ),
    ]
    if cross_rows:
        lines += [
            "## Across seeds",
            "",
            "![cross-seed agreement](cross_seed.png)",
            "",
            *_table(
                [
                    "family",
                    "towers",
                    "text",
                    "seeds",
                    "matched r (two towers)",
                    "largest p",
                    "matched r (noise floor)",
                    "recurs",
                ],
                [
                    [
                        r["family"],
                        r["num_towers"],
                        r["text"],
                        r["num_seeds"],
                        _fmt(r["correlation"]),
                        f"{max(r['p_values']):.2g}",
                        _fmt(r["floor_correlation"]),
                        "yes" if r["recurs"] else "no",
                    ]
                    for r in cross_rows
                ],
            ),
            "Matched correlation: tower labels are arbitrary, so towers are matched first (for two towers, the larger "
            "of r and -r); the noise floor's value shows what matching alone gives on unrelated preferences.",
            "",
        ]
    for text, text_categories in categories.items():
        lines += category_section(text_categories, text, report_dir)
    results = {
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
    write_text_atomically(report_dir / STUDY_JSON, json.dumps(results, indent=2) + "\n")
    return write_text_atomically(report_dir / STUDY_MD, "\n".join(lines) + "\n")
