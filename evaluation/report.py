"""The report folder of a scored model: preference.json, a per-token table, PNG plots and report.md.

Layout (written into a staging folder, then moved in: a failed write leaves no partial report):

    preference.json             {"model", "data", "settings", "perplexity": {"joint", "probes"}, "summary"}
    preference_per_token.csv    one row per observed token type (see PER_TOKEN_COLUMNS)
    logprob_scatter.png         per token type: mean log-prob under one tower against another, with the diagonal
    preference_histogram.png    distribution of the preference over eligible token types
    preference_vs_frequency.png preference against log10 of the token type's count
    preference_vs_floor.png     with probe replicas: per token type, the two-tower difference against the
                                same-tower floor, with the diagonal
    report.md                   the numbers, the plots and each tower's top tokens

With probe replicas (summary["test"] == "replica"), perplexity may also hold "probe_replicas" ([per replica] per
tower), and report.md leads with whether the per-type preference belongs to the towers or to the probes.

`plot_preference_comparison` draws the scatter plot of twotower.evaluation.compare.
"""

import itertools
import json
import os
import shutil
from pathlib import Path

import matplotlib


matplotlib.use("Agg")  # files only: no display on servers and CI

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from twotower.training.atomic import disk_full_error, is_disk_full  # noqa: E402
from twotower.training.atomic import write_atomically, write_text_atomically  # noqa: E402


PREFERENCE_JSON = "preference.json"
PER_TOKEN_CSV = "preference_per_token.csv"
REPORT_MD = "report.md"
STAGING_DIR = ".report.tmp"  # inside the report folder: where a report is written before its files move in
PLOTS = {
    "logprob_scatter": "logprob_scatter.png",
    "preference_histogram": "preference_histogram.png",
    "preference_vs_frequency": "preference_vs_frequency.png",
}
REPLICA_PLOTS = {"preference_vs_floor": "preference_vs_floor.png"}  # only with probe replicas
TOWER_COLORS = plt.get_cmap("tab10").colors
PER_TOKEN_COLUMNS = (
    "token_id, token, count, mean_logprob_tower{t}, preference_nats_tower{t}, standard_error_tower{t} "
    "(one per tower t), preferred_tower, p_value, eligible, significant; with probe replicas also "
    "occurrence_p_value, occurrence_significant, two_tower_difference_nats, same_tower_difference_nats and "
    "probe_mean_logprob_probe{p} (one per probe p)"
)
RELIABLE_PREFERENCE = 0.7  # from this reliability on, report.md calls the per-type preference the towers'
BEYOND_NOISE = {False: "", True: " (replica-level)"}  # column labels of the tests, without and with probe replicas


def per_token_table(result, tokens):
    """A DataFrame with one row per observed token type; `tokens` are their strings, in result.token_ids order."""
    columns = {"token_id": result.token_ids, "token": tokens, "count": result.count}
    for name in ("mean_logprob", "preference_nats", "standard_error"):
        for tower_idx, values in enumerate(getattr(result, name)):
            columns[f"{name}_tower{tower_idx}"] = values
    columns.update(
        preferred_tower=result.preferred_tower,
        p_value=result.p_value,
        eligible=result.eligible,
        significant=result.significant,
    )
    if result.probe_mean_logprob is not None:  # probe replicas: p_value above is the replica-level test's
        columns.update(
            occurrence_p_value=result.occurrence_p_value,
            occurrence_significant=result.occurrence_significant,
            two_tower_difference_nats=result.two_tower_difference_per_type_nats,
            same_tower_difference_nats=result.same_tower_difference_per_type_nats,
        )
        for probe_idx, values in enumerate(result.probe_mean_logprob):
            columns[f"probe_mean_logprob_probe{probe_idx}"] = values
    return pd.DataFrame(columns)


def numbered_columns(table, prefix):
    """[n, types] array of the columns `prefix`0, `prefix`1, ... of a per-token table."""
    count = sum(column[len(prefix) :].isdigit() for column in table.columns if column.startswith(prefix))
    return np.stack([table[f"{prefix}{index}"].to_numpy() for index in range(count)])


def tower_columns(table, name):
    """[towers, types] array of the per-tower columns `name`_tower0, `name`_tower1, ... of a per-token table."""
    return numbered_columns(table, f"{name}_tower")


def eligible_preferences(table):
    """(token ids [types], preference_nats [towers, types], token strings) of a per-token table's eligible types."""
    eligible = table[table["eligible"]]
    return eligible["token_id"].to_numpy(), tower_columns(eligible, "preference_nats"), eligible["token"].tolist()


def save_figure(figure, path):
    write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(figure)


def _tower_color(tower_idx):
    return TOWER_COLORS[tower_idx % len(TOWER_COLORS)]


def _shown_preferences(preference):
    """The rows worth plotting: with two towers tower 1's preference mirrors tower 0's, so tower 0 alone."""
    return preference[:1] if preference.shape[0] == 2 else preference


def plot_logprob_scatter(table, path):
    """Per token type, mean log-prob under tower i (x) against tower j (y) for every pair of towers, with y = x."""
    mean_logprob = tower_columns(table, "mean_logprob")
    preferred = table["preferred_tower"].to_numpy()
    pairs = list(itertools.combinations(range(mean_logprob.shape[0]), 2))
    figure, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 5), squeeze=False)
    low, high = mean_logprob.min(), mean_logprob.max()
    for axis, (first, second) in zip(axes[0], pairs):
        for tower_idx in np.unique(preferred):
            prefers = preferred == tower_idx
            axis.scatter(
                mean_logprob[first, prefers], mean_logprob[second, prefers], s=6, alpha=0.6, linewidths=0,
                color=_tower_color(tower_idx), label=f"prefers tower {tower_idx}",
            )
        axis.plot([low, high], [low, high], color="black", linewidth=0.8, label="equal log-prob")
        axis.set_xlabel(f"mean log-prob, tower {first} probe (nats)")
        axis.set_ylabel(f"mean log-prob, tower {second} probe (nats)")
        axis.set_title("one point per token type")
        axis.legend(loc="upper left")
    save_figure(figure, path)


def plot_preference_histogram(table, path):
    """Histogram of the preference over eligible token types (one histogram per tower beyond two towers)."""
    preference = tower_columns(table[table["eligible"]], "preference_nats")
    shown = _shown_preferences(preference)
    figure, axis = plt.subplots(figsize=(6, 4))
    bins = np.linspace(shown.min(), shown.max(), 60) if shown.size and np.ptp(shown) > 0 else 10
    for tower_idx, values in enumerate(shown):
        axis.hist(values, bins=bins, alpha=0.6, color=_tower_color(tower_idx), label=f"tower {tower_idx}")
    axis.axvline(0.0, color="black", linewidth=0.8)
    axis.set_xlabel(_preference_label(preference.shape[0]))
    axis.set_ylabel("eligible token types")
    if len(shown) > 1:
        axis.legend()
    save_figure(figure, path)


def plot_preference_vs_frequency(table, path):
    """Each token type's preference against log10 of its count (types below min_count drawn faint)."""
    preference = tower_columns(table, "preference_nats")
    log_count = np.log10(table["count"].to_numpy())
    eligible = table["eligible"].to_numpy()
    figure, axis = plt.subplots(figsize=(6, 4))
    for tower_idx, values in enumerate(_shown_preferences(preference)):
        color = _tower_color(tower_idx)
        label = f"tower {tower_idx}" if preference.shape[0] > 2 else "eligible"
        axis.scatter(log_count[eligible], values[eligible], s=6, color=color, alpha=0.6, linewidths=0, label=label)
        axis.scatter(log_count[~eligible], values[~eligible], s=6, color=color, alpha=0.15, linewidths=0)
    axis.axhline(0.0, color="black", linewidth=0.8)
    axis.set_xlabel("log10(count of the token type)")
    axis.set_ylabel(_preference_label(preference.shape[0]))
    axis.set_title("faint: below min_count")
    axis.legend()
    save_figure(figure, path)


def plot_preference_vs_floor(table, path):
    """Per eligible token type, the same-tower difference (x) against the two-tower difference (y), with y = x."""
    eligible = table[table["eligible"]]
    same_tower = eligible["same_tower_difference_nats"].to_numpy()
    two_tower = eligible["two_tower_difference_nats"].to_numpy()
    significant = eligible["significant"].to_numpy(dtype=bool)
    figure, axis = plt.subplots(figsize=(5, 5))
    groups = [(~significant, "grey", "not significant"), (significant, _tower_color(0), "beyond probe noise")]
    for shown, color, label in groups:
        axis.scatter(same_tower[shown], two_tower[shown], s=6, alpha=0.6, linewidths=0, color=color, label=label)
    high = 1.05 * max(same_tower.max(initial=0.0), two_tower.max(initial=0.0), 1e-3)
    axis.plot([0.0, high], [0.0, high], color="black", linewidth=0.8, label="two towers = one tower")
    axis.set_xlim(0.0, high)
    axis.set_ylim(0.0, high)
    axis.set_xlabel("same-tower difference: probes of one tower (nats)")
    axis.set_ylabel("two-tower difference: probes of two towers (nats)")
    above = np.mean(two_tower > same_tower) if two_tower.size else float("nan")
    axis.set_title(f"one point per eligible token type; {above:.0%} above the diagonal")
    axis.legend(loc="upper left")
    save_figure(figure, path)


def plot_preference_comparison(preference_a, preference_b, comparison, path):
    """Per shared token type, run A's preference against run B's matched tower (for two towers: tower 0 only)."""
    shown = range(len(_shown_preferences(preference_a)))
    figure, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 5), squeeze=False)
    for axis, tower_idx in zip(axes[0], shown):
        matched = comparison["tower_mapping"][tower_idx]
        correlation = comparison["correlation_matrix"][tower_idx][matched]
        axis.scatter(preference_a[tower_idx], preference_b[matched], s=6, alpha=0.6, linewidths=0)
        axis.axhline(0.0, color="black", linewidth=0.8)
        axis.axvline(0.0, color="black", linewidth=0.8)
        axis.set_xlabel(f"first report: preference of tower {tower_idx} (nats)")
        axis.set_ylabel(f"second report: preference of tower {matched} (nats)")
        axis.set_title(f"r = {correlation:.3f} over {comparison['num_shared_types']} token types")
    save_figure(figure, path)


def _preference_description(num_towers):
    if num_towers == 2:
        return "tower 0's mean log-probability minus tower 1's"
    return "a tower's mean log-probability minus the mean of the other towers'"


def _preference_label(num_towers):
    if num_towers == 2:
        return "preference (nats): tower 0 minus tower 1"
    return "preference (nats): tower minus the others"


def _markdown_token(token):
    """A token string as a Markdown table cell: a code span with pipes escaped and backticks replaced."""
    return "`" + str(token).replace("`", "'").replace("|", "\\|") + "`"


def _objective_lines(report):
    """What the model predicts and how the scored predictions were made (reports before objectives had none)."""
    settings = report.get("settings", {})
    if "objective" not in settings:
        return []
    model = report["model"]
    kind = f"{model.get('tower_type', 'transformer')} towers" + (
        "" if model.get("cooperative", True) else ", independent-towers control (no cooperation)"
    )
    return [f"Objective: {settings['objective']} LM ({kind}). Masking: {settings['masking']}.", ""]


def _offset_line(summary):
    """The global offset of each tower and whether the preferences shown are centered on it."""
    offsets = ", ".join(f"tower {t} {value:+.3f}" for t, value in enumerate(summary["global_offset_nats"]))
    centering = (
        "the preferences below are centered: it was subtracted from each type's before testing."
        if summary["centered"]
        else "the preferences below are raw, not centered (`--center` subtracts it before testing each type)."
    )
    return (
        f"Global offset (each tower's preference over all predictions; with two towers, the difference of the "
        f"probes' log perplexities): {offsets} nats; {centering}"
    )


def _number(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"


def _perplexity_lines(perplexity):
    """The perplexity table, with a column of each tower's replicas when it has several probes."""
    replicas = perplexity.get("probe_replicas")
    if replicas is None:
        return [
            "| model | perplexity |",
            "|---|---|",
            f"| joint model | {_number(perplexity['joint'], 2)} |",
            *[f"| probe of tower {t} | {_number(value, 2)} |" for t, value in enumerate(perplexity["probes"])],
        ]
    return [
        "| model | perplexity | each replica |",
        "|---|---|---|",
        f"| joint model | {_number(perplexity['joint'], 2)} | |",
        *[
            f"| probes of tower {t} | {_number(value, 2)} | {', '.join(_number(r, 2) for r in replicas[t])} |"
            for t, value in enumerate(perplexity["probes"])
        ],
    ]


def _replica_verdict(summary):
    """One sentence: what the reliability says about the towers and the probes."""
    reliability, (low, _) = summary["reliability"], summary["reliability_ci"]
    if reliability is None:
        return "Too few eligible token types to tell the towers from the probes."
    if low is None or low <= 0.0:
        return (
            "The reliability is indistinguishable from 0: the towers differ only as much as probes of one tower do, "
            "so the per-type preference below is probe noise."
        )
    if reliability >= RELIABLE_PREFERENCE:
        return (
            "The reliability is high: probes of one tower agree, so the per-type preference is a property of the "
            "towers."
        )
    return (
        "The reliability is between 0 and 1: part of the per-type preference belongs to the towers and part is "
        "probe noise, so read single types by their replica-level significance."
    )


def _power_note(summary):
    """Why a reliable preference can leave no single type significant: too few replicas for a per-type test."""
    low = summary["reliability_ci"][0]
    if summary["num_significant"] or low is None or low <= 0.0:
        return ""
    borrowed = "" if summary["prior_df"] is None else f" (and {summary['prior_df']:.1f} borrowed from the other types)"
    return (
        f" No single type passes the per-type test, though: each type is tested against its own replica noise, "
        f"estimated on {summary['residual_df']} degree(s) of freedom{borrowed}, too little to single out a type "
        f"among {summary['num_eligible_types']}; more replicas (`--probe_replicas`) give the per-type test its power."
    )


def _replica_lines(summary):
    """The section that leads a report with probe replicas: is the per-type preference the towers' or the probes'?"""
    low, high = summary["reliability_ci"]
    replicas = ", ".join(f"{count} of tower {t}" for t, count in enumerate(summary["replicas_per_tower"]))
    pairing = "paired by training run" if summary["paired"] else "independent replicas"
    return [
        "## Tower or probe?",
        "",
        f"{summary['num_probes']} probes ({replicas}; {pairing}). A second probe of the same tower differs from the "
        "first per token type; these figures measure the towers against that.",
        "",
        f"- reliability (share of the across-type variance of the preference that is between towers, not between "
        f"replicas): {_number(summary['reliability'])}, 95% CI {_number(low)} to {_number(high)}; with one probe "
        f"per tower it would be {_number(summary['reliability_single_probe'])}",
        f"- significant beyond probe noise (replica-level test, Benjamini-Hochberg at alpha = {summary['alpha']}): "
        f"{summary['num_significant']} of {summary['num_eligible_types']} eligible types "
        f"({_number(summary['significant_share'])})",
        f"- two-tower difference {_number(summary['two_tower_difference_nats'])} nats against a same-tower floor of "
        f"{_number(summary['same_tower_floor_nats'])} nats (mean absolute difference per type between probes of "
        "two towers, and between probes of one tower)",
        "",
        _replica_verdict(summary) + _power_note(summary),
        "",
        f"![same-tower floor against two-tower difference]({REPLICA_PLOTS['preference_vs_floor']})",
        "",
    ]


def render_markdown(report, table):
    """report.md: model and data, perplexities, the summary, the plots and each tower's top tokens.

    With probe replicas, a "Tower or probe?" section follows the perplexities, and the occurrence-level figures,
    which do not account for probe noise, get a section of their own.
    """
    summary, perplexity = report["summary"], report["perplexity"]
    num_towers = summary["num_towers"]
    is_replica = summary.get("test") == "replica"
    tokens = dict(zip(table["token_id"], table["token"]))
    counts = dict(zip(table["token_id"], table["count"]))
    p_values = dict(zip(table["token_id"], table["p_value"]))
    prefix = "occurrence_" if is_replica else ""
    significance_line = (
        f"- significant after Benjamini-Hochberg at alpha = {summary['alpha']}: "
        f"{summary[prefix + 'num_significant']} types ({_number(summary[prefix + 'significant_share'])} of eligible)"
    )
    consistency_line = (
        f"- split-half consistency (correlation of the preference on interleaved halves of each type's "
        f"occurrences): {_number(summary['split_half_consistency'])}"
    )
    occurrence_lines = [significance_line, consistency_line]

    lines = [
        "# Tower preference report",
        "",
        f"Model: `{report['model']['path']}` ({num_towers} towers). Data: {report['data']['description']}, "
        f"{report['data']['num_blocks']} blocks of {report['data']['block_size']} tokens, "
        f"{summary['num_predictions']} predictions of {summary['num_token_types']} token types.",
        "",
        *_objective_lines(report),
        "## Perplexity",
        "",
        *_perplexity_lines(perplexity),
        "",
        *(_replica_lines(summary) if is_replica else []),
        "## Preference",
        "",
        f"The preference of a token type is {_preference_description(num_towers)}, in nats, over its occurrences. "
        f"Token types seen at least {summary['min_count']} times are eligible ({summary['num_eligible_types']}; "
        f"{summary['num_excluded_types']} excluded).",
        "",
        _offset_line(summary),
        "",
        f"| tower | share of token types | share of occurrences | significant types{BEYOND_NOISE[is_replica]} |",
        "|---|---|---|---|",
        *[
            f"| {t} | {_number(summary['type_share_preferring'][t])} "
            f"| {_number(summary['occurrence_share_preferring'][t])} | {summary['num_significant_preferring'][t]} |"
            for t in range(num_towers)
        ],
        "",
        f"- mean absolute preference: {_number(summary['mean_abs_preference_nats'])} nats",
        *([] if is_replica else occurrence_lines),
        f"- Sarle's bimodality coefficient: {_number(summary['bimodality_coefficient'])} "
        "(above 0.556 suggests two modes)",
        "",
        f"![mean log-prob per token type]({PLOTS['logprob_scatter']})",
        "",
        f"![preference histogram]({PLOTS['preference_histogram']})",
        "",
        f"![preference vs frequency]({PLOTS['preference_vs_frequency']})",
        "",
    ]
    if is_replica:
        lines += [
            "## Occurrence-level statistics (they do not account for probe noise)",
            "",
            "Tested over the occurrences of each type, on each tower's mean over its replicas: a probe's own "
            "per-type error passes for a preference here.",
            "",
            *occurrence_lines,
            "",
        ]
    for tower_idx, (token_ids, preferences) in enumerate(zip(summary["top_token_ids"], summary["top_preference_nats"])):
        lines += [
            f"## Top tokens of tower {tower_idx}",
            "",
            f"| token | id | count | preference (nats) | p-value{BEYOND_NOISE[is_replica]} |",
            "|---|---|---|---|---|",
            *[
                f"| {_markdown_token(tokens[token_id])} | {token_id} | {counts[token_id]} | {preference:.3f} "
                f"| {p_values[token_id]:.2g} |"
                for token_id, preference in zip(token_ids, preferences)
            ],
            "",
        ]
    return "\n".join(lines)


def write_report(output_dir, report, result, tokens):
    """
    Write the report folder for `result` (a PreferenceResult); `report` holds model, data, settings, perplexity.

    Every file is written into a staging folder first and moved in only once all are written: a failure (a full
    disk) leaves neither a partial report nor the staging folder behind.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = output_dir / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write_report_files(staging, {**report, "summary": result.summary}, per_token_table(result, tokens))
        for path in sorted(staging.iterdir()):
            os.replace(path, output_dir / path.name)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(error):
            raise disk_full_error(output_dir, staging) from error
        raise
    staging.rmdir()
    return output_dir


def _write_report_files(folder, report, table):
    write_text_atomically(folder / PREFERENCE_JSON, json.dumps(report, indent=2, allow_nan=False) + "\n")
    write_atomically(folder / PER_TOKEN_CSV, lambda tmp: table.to_csv(tmp, index=False))
    plot_logprob_scatter(table, folder / PLOTS["logprob_scatter"])
    plot_preference_histogram(table, folder / PLOTS["preference_histogram"])
    plot_preference_vs_frequency(table, folder / PLOTS["preference_vs_frequency"])
    if report["summary"].get("test") == "replica":
        plot_preference_vs_floor(table, folder / REPLICA_PLOTS["preference_vs_floor"])
    write_text_atomically(folder / REPORT_MD, render_markdown(report, table))


def load_report(report_dir):
    """(preference.json as a dict, the per-token table as a DataFrame) of a report folder."""
    report_dir = Path(report_dir)
    missing = [name for name in (PREFERENCE_JSON, PER_TOKEN_CSV) if not (report_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{report_dir} is not a tower preference report (missing {missing}); pass a folder written by "
            "`python -m twotower.evaluation.score`."
        )
    report = json.loads((report_dir / PREFERENCE_JSON).read_text(encoding="utf-8"))
    # empty cells are missing numbers, but token strings stay as written ("nan" and "null" are tokens too)
    columns = pd.read_csv(report_dir / PER_TOKEN_CSV, nrows=0).columns
    missing_numbers = {column: [""] for column in columns if column != "token"}
    table = pd.read_csv(report_dir / PER_TOKEN_CSV, keep_default_na=False, na_values=missing_numbers)
    return report, table
