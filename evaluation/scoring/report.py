"""The report folder of a scored model: preference.json, a per-token table, PNG plots and report.md.

Layout (written into a staging folder, then moved in: a failed write leaves no partial report):

    preference.json             {"model", "data", "settings", "perplexity": {"joint", "probes"}, "summary"}
    preference_per_token.csv    one row per observed token type (see PER_TOKEN_COLUMNS)
    logprob_scatter.png         per token type: mean log-prob under one tower against another, with the diagonal
    preference_histogram.png    distribution of the preference over eligible token types
    preference_vs_frequency.png preference against log10 of the token type's count
    preference_vs_floor.png     with probe replicas: per token type, the two-tower difference against the
                                same-tower floor, with the diagonal
    report.md                   the numbers, the plots and each tower's top tokens (its text: the Jinja template
                                templates/report.md.j2; its tables: pandas)
    tokens.html                 when the scoring command passes it: the token view, the first blocks' tokens
                                coloured by their type's preference (tower_preference/token_view.py), linked from
                                report.md

With probe replicas (summary["test"] == "replica"), perplexity may also hold "probe_replicas" ([per replica] per
tower), and report.md leads with whether the per-type preference belongs to the towers or to the probes.

`plot_preference_comparison` draws the scatter plot of twotower.evaluation.compare.
"""

import io
import itertools
import json
from pathlib import Path

import matplotlib


matplotlib.use("Agg")  # files only: no display on servers and CI

import jinja2  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

from twotower.training.utils.atomic import staged_folder  # noqa: E402
from twotower.training.utils.atomic import write_atomically, write_text_atomically  # noqa: E402
from twotower.training.utils.markdown_escape import code_span, markdown_text, markdown_url  # noqa: E402

from .formatting import markdown_table, number  # noqa: E402
from .report_agreement import agreement_of, top_tokens_split  # noqa: E402
from ..tower_preference.measures import PROBE_FREE_MEASURES  # noqa: E402
from ..tower_preference.text_cells import readable_token  # noqa: E402
from .report_files import (  # noqa: E402
    PER_TOKEN_CSV, PLOTS, PREFERENCE_JSON, REPLICA_PLOTS, REPORT_MD, TOKEN_VIEW_HTML, TYPE_SUMS_PARQUET
)
from .versioned_report import replace_report, staging_folder  # noqa: E402


REPORT_TEMPLATE = "report.md.j2"
TEMPLATES_DIR = Path(__file__).with_name("templates")  # beside the module, in a wheel too (setup.py package_data)
USER_DATA_FILTERS = {"code": code_span, "text": markdown_text, "url": markdown_url}
TOWER_COLORS = plt.get_cmap("tab10").colors
PER_TOKEN_COLUMNS = (
    "token_id, token, count, mean_logprob_tower{t}, preference_nats_tower{t}, standard_error_tower{t} "
    "(one per tower t), preferred_tower, p_value, eligible, significant; with probe replicas also "
    "occurrence_p_value, occurrence_significant, two_tower_difference_nats, same_tower_difference_nats and "
    "probe_mean_logprob_probe{p} (one per probe p); where the text was tagged, pos_tag and pos_tag_share"
)
RELIABLE_PREFERENCE = 0.7  # from this reliability on, report.md calls the per-type preference the towers'
# said beside a reliability below 0 (report.md, the scoring command's line), which otherwise reads as a small number
NEGATIVE_RELIABILITY_NOTE = "negative: probes agree less than chance, so there is no reproducible preference at this size"
BEYOND_NOISE = {False: "", True: " (replica-level)"}  # column labels of the tests, without and with probe replicas


def per_token_table(result, tokens, measured=None):
    """A DataFrame with one row per observed token type; `tokens` are their strings, in result.token_ids order;
    `measured`, {name: PreferenceResult} of probe-free measures of the same positions (tower_preference/measures.py),
    adds each one's columns, named after it."""
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
    for name, measure_result in (measured or {}).items():
        if not np.array_equal(measure_result.token_ids, result.token_ids):
            raise ValueError(f"the {name} result covers other token types than the probes' result")
        for tower_idx, values in enumerate(measure_result.preference_nats):
            columns[f"{name}_preference_nats_tower{tower_idx}"] = values
        columns.update({f"{name}_p_value": measure_result.p_value, f"{name}_significant": measure_result.significant})
    return pd.DataFrame(columns)


def with_parts_of_speech(table, parts_of_speech):
    """The per-token table with each type's part of speech where the report tagged the text (preference.json's
    `parts_of_speech`): pos_tag, its majority tag, and pos_tag_share, that tag's share of its occurrences (a type is
    tagged from the section's `threshold` on); empty for a type the tagger never saw inside a word."""
    if not (parts_of_speech or {}).get("available"):
        return table
    types = parts_of_speech["types"]
    return table.assign(
        pos_tag=table["token_id"].map(dict(zip(types["token_id"], types["tag"]))),
        pos_tag_share=table["token_id"].map(dict(zip(types["token_id"], types["tag_share"]))),
    )


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


FIGURE_DPI = 120
PALETTE_COLORS = 256


def palette_image(image: Image.Image) -> Image.Image:
    """A figure's pixels as a palette image of at most PALETTE_COLORS colours (median cut, no dithering): exact where
    the figure has no more colours than that (a plot's flat fills, lines and text mostly), the nearest palette colour
    elsewhere (antialiased edges and colour maps). Transparent pixels keep their alpha (fast octree, the one method
    Pillow quantizes RGBA with)."""
    image = image.convert("RGBA")
    if image.getextrema()[3][0] < 255:
        return image.quantize(PALETTE_COLORS, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    return image.convert("RGB").quantize(PALETTE_COLORS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)


def write_palette_png(image: Image.Image, path) -> Path:
    """`image` written atomically to `path` as a palette PNG (palette_image), compressed as small as zlib makes it."""
    return write_atomically(path, lambda tmp: palette_image(image).save(tmp, format="PNG", optimize=True))


def save_figure(figure, path):
    """A figure as the reports and the study keep it: rendered at FIGURE_DPI, written as a palette PNG (about a
    third of the bytes of matplotlib's RGBA PNG), atomically; the figure is closed."""
    rendered = io.BytesIO()
    figure.savefig(rendered, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    plt.close(figure)
    with Image.open(rendered) as image:
        write_palette_png(image, path)


def repack_png(path) -> bool:
    """A PNG figure saved before save_figure wrote palette PNGs, written again in place as it writes one (its pixels
    through palette_image, atomically); True where it was rewritten, False for a palette PNG already (left as is)."""
    with Image.open(path) as image:
        if image.mode == "P":
            return False
        image.load()
    write_palette_png(image, path)
    return True


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


def _preference_label(num_towers):
    if num_towers == 2:
        return "preference (nats): tower 0 minus tower 1"
    return "preference (nats): tower minus the others"


def _markdown_token(token):
    """A token string as a Markdown table cell: readable text (text_cells) in a code span, pipes escaped, backticks
    replaced."""
    return "`" + readable_token(str(token)).replace("`", "'").replace("|", "\\|") + "`"


def perplexity_table(perplexity):
    """The perplexity table, with a column of each tower's replicas when it has several probes."""
    replicas = perplexity.get("probe_replicas")
    if replicas is None:
        rows = [("joint model", number(perplexity["joint"], 2))]
        rows += [(f"probe of tower {t}", number(value, 2)) for t, value in enumerate(perplexity["probes"])]
        return markdown_table(pd.DataFrame(rows, columns=["model", "perplexity"]), tablefmt="github")
    rows = [("joint model", number(perplexity["joint"], 2), "")]
    rows += [
        (f"probes of tower {t}", number(value, 2), ", ".join(number(r, 2) for r in replicas[t]))
        for t, value in enumerate(perplexity["probes"])
    ]
    return markdown_table(pd.DataFrame(rows, columns=["model", "perplexity", "each replica"]), tablefmt="github")


def preference_table(summary, is_replica):
    """Per tower: the shares of token types and occurrences preferring it, and its significant types."""
    rows = [
        (
            t,
            number(summary["type_share_preferring"][t]),
            number(summary["occurrence_share_preferring"][t]),
            summary["num_significant_preferring"][t],
        )
        for t in range(summary["num_towers"])
    ]
    columns = ["tower", "share of token types", "share of occurrences", f"significant types{BEYOND_NOISE[is_replica]}"]
    return markdown_table(pd.DataFrame(rows, columns=columns), tablefmt="github")


def template_environment(templates_dir=TEMPLATES_DIR, **filters) -> jinja2.Environment:
    """The templates in `templates_dir` (shipped with the package; the report's by default), with the given filters."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,  # a missing figure fails the render instead of printing nothing
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update({**USER_DATA_FILTERS, **filters})  # user data shown as written, never as markup
    return environment


def render_markdown(report, table, has_token_view=False):
    """report.md (templates/report.md.j2): model and data, perplexities, the summary, plots, top tokens and, if the
    folder has one, a link to the token view."""
    summary = report["summary"]
    is_replica = summary.get("test") == "replica"
    environment = template_environment(number=number)
    return environment.get_template(REPORT_TEMPLATE).render(
        report=report,
        settings=report.get("settings", {}),  # reports before objectives had none
        summary=summary,
        num_towers=summary["num_towers"],
        is_replica=is_replica,
        prefix="occurrence_" if is_replica else "",  # the occurrence-level figures' keys in a replica summary
        reliable_preference=RELIABLE_PREFERENCE,
        negative_reliability_note=NEGATIVE_RELIABILITY_NOTE,
        plots=PLOTS,
        replica_plots=REPLICA_PLOTS,
        perplexity_table=perplexity_table(report["perplexity"]),
        preference_table=preference_table(summary, is_replica),
        top_tokens_tables=top_tokens_split(summary, table, is_replica, _markdown_token),
        token_view=TOKEN_VIEW_HTML if has_token_view else None,
        measure_sections=measure_sections(report, environment),
        **agreement_of(report),
    )


def measure_sections(report, environment) -> list[dict]:
    """{"heading", "body"} of report.md's section of every probe-free measure the report holds, in the registry's
    order: each measure's own template (its `report_section`) filled with its summary."""
    labels = {measure.name: measure.label for measure in PROBE_FREE_MEASURES}
    return [
        {"heading": measure.report_heading, "body": environment.from_string(measure.report_section).render(
            measure=measure, summary=report[measure.name], num_towers=report["summary"]["num_towers"],
            alpha=report["summary"]["alpha"], labels=labels)}
        for measure in PROBE_FREE_MEASURES if report.get(measure.name) is not None
    ]


def write_report(output_dir, report, result, tokens, token_view=None, measured=None, type_sums=None):
    """
    Write the report folder for `result` (a PreferenceResult); `report` holds model, data, settings, perplexity,
    `token_view` the HTML of tokens.html (tower_preference.token_view.render_token_view), if any, `measured` the
    probe-free measures' PreferenceResults by name, if any, and `type_sums` the per-half, per-type sums of
    cross-fitting (cross_fitting.CrossFittedPreference.type_sums), if any.

    Every file is written into a staging folder first, and the whole report replaces the earlier one in one step
    once all are written (versioned_report.py): a failure (a full disk) leaves neither a partial report nor the
    staging folder behind, and a kill at any instant leaves the earlier report whole.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # a staging folder unique to this process, made the folder's report in one step (versioned_report.py)
    with staged_folder(output_dir, staging_folder, lambda staging, folder: replace_report(folder, staging)) as staging:
        table = with_parts_of_speech(per_token_table(result, tokens, measured), report.get("parts_of_speech"))
        _write_report_files(staging, {**report, "summary": result.summary}, table, token_view)
        if type_sums is not None:
            write_atomically(staging / TYPE_SUMS_PARQUET, lambda tmp: type_sums.to_parquet(tmp, index=False))
    return output_dir


def _write_report_files(folder, report, table, token_view):
    write_text_atomically(folder / PREFERENCE_JSON, json.dumps(report, indent=2, allow_nan=False) + "\n")
    write_atomically(folder / PER_TOKEN_CSV, lambda tmp: table.to_csv(tmp, index=False))
    plot_logprob_scatter(table, folder / PLOTS["logprob_scatter"])
    plot_preference_histogram(table, folder / PLOTS["preference_histogram"])
    plot_preference_vs_frequency(table, folder / PLOTS["preference_vs_frequency"])
    if report["summary"].get("test") == "replica":
        plot_preference_vs_floor(table, folder / REPLICA_PLOTS["preference_vs_floor"])
    if token_view is not None:
        write_text_atomically(folder / TOKEN_VIEW_HTML, token_view)
    write_text_atomically(folder / REPORT_MD, render_markdown(report, table, has_token_view=token_view is not None))


def load_report(report_dir):
    """(preference.json as a dict, the per-token table as a DataFrame) of a report folder."""
    report_dir = Path(report_dir)
    table_path = report_dir / PER_TOKEN_CSV
    if not table_path.is_file() and (report_dir / f"{PER_TOKEN_CSV}.gz").is_file():
        table_path = report_dir / f"{PER_TOKEN_CSV}.gz"  # as the study keeps its runs' tables
    missing = [path.name for path in (report_dir / PREFERENCE_JSON, table_path) if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{report_dir} is not a tower preference report (missing {missing}); pass a folder written by "
            "`python -m twotower.evaluation.scoring.score`."
        )
    report = json.loads((report_dir / PREFERENCE_JSON).read_text(encoding="utf-8"))
    # empty cells are missing numbers, but token strings stay as written ("nan" and "null" are tokens too)
    columns = pd.read_csv(table_path, nrows=0).columns
    missing_numbers = {column: [""] for column in columns if column != "token"}
    table = pd.read_csv(table_path, keep_default_na=False, na_values=missing_numbers)
    return report, table
