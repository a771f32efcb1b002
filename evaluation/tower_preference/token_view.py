"""The token view: passages of a scored text with every token coloured by its type's tower preference.

One self-contained HTML page (inline CSS and JavaScript, the data embedded as JSON; nothing is fetched when it is
viewed), rendered from the Jinja template token_view.html.j2 beside this file. The colour of a token is the tower its
type prefers, its strength the size of that preference, and a type whose preference is not significant beyond probe
noise (the per-type test of the metric) is faded. Hovering a token shows a card: the token, each tower's
log-probability of it at this position, the type's preference with its interval and, when given, a line for each
probe-free measure (measures.py: mean ablation, ...). Filters select token categories, towers and significance.

`python -m twotower.evaluation.scoring.score` writes it as a report's tokens.html; the tower_preference Space shows it
for a model and a text. Both call `render_token_view` with the metric's result dict:

    html = render_token_view(results, tokens, passages, categories={"kind": kinds})
"""

import json
from pathlib import Path

import jinja2
import numpy as np
from scipy import special


try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .measure_agreement import agreement_meaning, measure_agreement
    from .measures import PROBE_FREE_MEASURES, PROBE_MEASURE
    from .preference_measure import measure_card
    from .text_cells import readable_token
except ImportError:
    from measure_agreement import agreement_meaning, measure_agreement
    from measures import PROBE_FREE_MEASURES, PROBE_MEASURE
    from preference_measure import measure_card
    from text_cells import readable_token


TEMPLATE = "token_view.html.j2"
# matplotlib's tab10, the colours of the towers in the report's plots
TOWER_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
INTERVAL_LEVEL = 0.95  # of the preference's interval on the hover card
FULL_COLOUR_QUANTILE = 0.95  # a preference this high among the eligible types' preferences is drawn in full colour
MIN_OPACITY, MAX_OPACITY = 0.15, 0.7  # of the token's background, from no preference to full colour: black text
# stays legible on the darkest tower colour
FADED_SHARE = 0.3  # a type without a significant preference keeps this share of its opacity
DECIMALS = 4  # of the nats in the page's data (the card shows 3): halves the page's size
CATEGORY_NAMES = {"frequency": "frequency rank"}  # a category's name on the page, where its key would mislead


def preference_interval(results, level=INTERVAL_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) [towers, types]: each preference's two-sided `level` interval, NaN where it has no standard error.

    On the degrees of freedom of the metric's per-type test, so that 0 lies outside the interval exactly when that
    test's p-value is below 1 - level: the replica-level test's residual plus prior degrees of freedom, or count - 1
    over occurrences. Like the p-value before Benjamini-Hochberg (and before Bonferroni over more than 2 towers), it is
    not corrected for the number of types tested.
    """
    standard_error = np.array(results["standard_error"], dtype=float)  # None (a single occurrence) -> NaN
    if results.get("test") == "replica":
        prior_df = results["prior_df"]  # None: infinite, the replica variances all equal the prior's
        df = results["residual_df"] + (np.inf if prior_df is None else prior_df)
    else:
        df = np.maximum(np.asarray(results["count"]) - 1, 1)
    half_width = special.stdtrit(df, 0.5 + level / 2) * standard_error
    preference = np.asarray(results["preference_nats"], dtype=float)
    return preference - half_width, preference + half_width


def full_colour_nats(results) -> float:
    """The preference drawn in full colour: FULL_COLOUR_QUANTILE of the eligible types' preferred-tower preference."""
    preference = np.asarray(results["preference_nats"], dtype=float)
    preferred = np.asarray(results["preferred_tower"])
    margin = preference[preferred, np.arange(preferred.shape[0])][np.asarray(results["eligible"], dtype=bool)]
    return max(float(np.quantile(margin, FULL_COLOUR_QUANTILE)) if margin.size else 0.0, 1e-3)


def token_background(card, full_colour) -> str:
    """The CSS background of a type's tokens: its preferred tower's colour, as opaque as its preference is large."""
    tower = card["preferred_tower"]
    strength = min(card["preference_nats"][tower] / full_colour, 1.0)
    opacity = MIN_OPACITY + (MAX_OPACITY - MIN_OPACITY) * strength
    if not card["significant"]:
        opacity *= FADED_SHARE
    red, green, blue = (int(TOWER_COLORS[tower % len(TOWER_COLORS)][i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {opacity:.3f})"


def type_cards(results, tokens, categories, shown_ids, byte_level=None) -> dict[int, dict]:
    """The hover card's fields of each type in `shown_ids`: a dict per type, so that a report can add fields."""
    index = {token_id: i for i, token_id in enumerate(results["token_ids"])}
    low, high = preference_interval(results)
    cards = {}
    for token_id in sorted(shown_ids):
        i = index[token_id]
        preference = [row[i] for row in results["preference_nats"]]
        cards[token_id] = {
            "token": readable_token(tokens[i], byte_level),
            "token_id": token_id,
            "count": results["count"][i],
            "categories": {CATEGORY_NAMES.get(scheme, scheme): labels[i] for scheme, labels in categories.items()},
            "eligible": results["eligible"][i],
            "significant": results["significant"][i],
            "preferred_tower": results["preferred_tower"][i],
            "preference_nats": [round(value, DECIMALS) for value in preference],
            "interval_nats": [_finite_pair(low[t, i], high[t, i]) for t in range(len(preference))],
            "p_value": None if results["p_value"][i] is None else float(f"{results['p_value'][i]:.3g}"),
            "measures": {},  # a line of each probe-free measure given (measure_rows)
        }
    return cards


def _finite_pair(low, high):
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    return [round(float(low), DECIMALS), round(float(high), DECIMALS)]


def tower_logprobs(gold_logprobs, results) -> np.ndarray:
    """[towers, seq]: each tower's mean over its probe replicas of the gold log-probabilities [probes, seq]."""
    gold_logprobs = np.asarray(gold_logprobs, dtype=float)
    probe_towers = results.get("probe_towers") or list(range(gold_logprobs.shape[0]))  # one probe per tower
    probe_towers = np.asarray(probe_towers)
    return np.stack([gold_logprobs[probe_towers == t].mean(axis=0) for t in range(results["num_towers"])])


def _passage_positions(passage, results):
    """One entry per token of a passage: [each tower's log-probability] where it was scored, else None."""
    logprobs = tower_logprobs(passage["gold_logprobs"], results)  # [towers, seq], NaN where not scored
    return [None if np.isnan(column).any() else column.round(DECIMALS).tolist() for column in logprobs.T]


def _passage_cells(passages, positions, cards):
    """What the template writes per cell (passage["cells"], text_cells.passage_cells; else one cell per token of
    passage["texts"]): its text, the passage and position of its last token (which completes its text), that token's
    type if it has a card, whether it was scored there, and, for a cell of several tokens, every piece's
    [passage, position, type] for the card (as JSON, an attribute's value) and how many of them were scored."""
    shown = []
    for index, passage in enumerate(passages):
        cells = passage.get("cells") or [
            {"positions": [[index, position]], "text": text} for position, text in enumerate(passage["texts"])
        ]
        shown.append([])
        for cell in cells:
            pieces = [[p, q, int(passages[p]["token_ids"][q])] for p, q in cell["positions"]]
            last_passage, last_position, token_id = pieces[-1]
            shown[-1].append({
                "text": cell["text"], "passage": last_passage, "position": last_position,
                "type": token_id if token_id in cards else None,
                "scored": positions[last_passage][last_position] is not None,
                "pieces": json.dumps(pieces) if len(pieces) > 1 else None,
                "scored_tokens": sum(positions[p][q] is not None for p, q, _ in pieces),
            })
    return shown


def measure_rows(results, measures, cards, shown_ids) -> list[dict]:
    """The page's row of each registered probe-free measure in `measures` ({name: its result dict}), in the registry's
    order: its words and its agreement with the probes' preference over types; each shown type's card gets the
    measure's line (`cards[token_id]["measures"][name]`)."""
    unknown = sorted(set(measures) - {measure.name for measure in PROBE_FREE_MEASURES})
    if unknown:
        raise ValueError(f"`measures` names {unknown}, which are not registered probe-free measures; give results "
                         f"under the names of measures.py's: {[measure.name for measure in PROBE_FREE_MEASURES]}.")
    rows = []
    for measure in PROBE_FREE_MEASURES:
        measured = measures.get(measure.name)
        if measured is None:
            continue
        index = {token_id: i for i, token_id in enumerate(measured["token_ids"])}
        for token_id in shown_ids & set(index):
            cards[token_id]["measures"][measure.name] = measure_card(measured, index, token_id, DECIMALS)
        agreement = measure_agreement(results["preference_nats"], measured["preference_nats"], results["eligible"])
        rows.append({"name": measure.name, "label": measure.label, "method": measure.method,
                     "question": measure.question, "agreement": agreement,
                     "agreement_meaning": agreement_meaning(agreement)})
    return rows


def render_token_view(results, tokens, passages, categories=None, title="Tower preference: token view", source="",
                      measures=None, byte_level=None):
    """The token view page (HTML) of passages of a scored text.

    Args:
        results: the metric's result dict (`PreferenceResult.to_dict()`, or what the `evaluate` module returns).
        tokens: the tokenizer's string of every type of results["token_ids"], in that order.
        passages: dicts with "token_ids" [seq], "gold_logprobs" [probes, seq] (the rows of probes as the metric was
            given them, NaN at the positions that were not scored), and either "cells" (text_cells.passage_cells: the
            text by character spans) or "texts" [seq] (`token_texts`, one cell per token).
        categories: {scheme: [label of every type of results["token_ids"]]}, e.g. {"kind": [...]}; one filter each.
        source: what the passages are, in words, for the page's heading (e.g. the first 8 of 40 blocks of a text).
        measures: optionally, {name: result dict} of registered probe-free measures (measures.py) of the same text;
            the hover card then shows a line of each, and the page says how far each agrees with the probes.
        byte_level: whether the tokens are byte-level BPE pieces (text_cells.is_byte_level); None guesses.
    """
    categories = categories or {}
    positions = [_passage_positions(passage, results) for passage in passages]
    shown_ids = {int(token_id) for passage in passages for token_id in passage["token_ids"]} & set(results["token_ids"])
    cards = type_cards(results, tokens, categories, shown_ids, byte_level)
    rows = measure_rows(results, measures or {}, cards, shown_ids)
    full_colour = full_colour_nats(results)
    data = {
        "num_towers": results["num_towers"],
        "num_eligible_types": results["num_eligible_types"],
        "alpha": results["alpha"],  # of Benjamini-Hochberg, which decides a card's "beyond noise: yes or no"
        "replicas_per_tower": results.get("replicas_per_tower"),
        "types": {str(token_id): card for token_id, card in cards.items()},
        "positions": positions,
        "probes": {"method": PROBE_MEASURE.method, "question": PROBE_MEASURE.question},
        "measures": rows,
    }
    return _environment().get_template(TEMPLATE).render(
        title=title,
        source=source,
        results=results,
        passages=_passage_cells(passages, positions, cards),
        probes=data["probes"],
        measures=rows,
        cards=cards,
        backgrounds={token_id: token_background(card, full_colour) for token_id, card in cards.items()},
        category_values={CATEGORY_NAMES.get(scheme, scheme): sorted(set(labels)) for scheme, labels in categories.items()},
        num_shown=sum(entry is not None for passage in positions for entry in passage),
        full_colour_nats=full_colour,
        full_colour_quantile=FULL_COLOUR_QUANTILE,
        tower_colors=[TOWER_COLORS[t % len(TOWER_COLORS)] for t in range(results["num_towers"])],
        opacities={"max": MAX_OPACITY, "faded": MAX_OPACITY * FADED_SHARE, "min": MIN_OPACITY},
        interval_level=INTERVAL_LEVEL,
        data=data,
    )


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,  # token strings are text: "<", "&" and quotes are escaped wherever they are written
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # tojson escapes <, >, & and ' inside the JSON (no "</script>" can end its tag); NaN would not parse in a browser
    environment.policies["json.dumps_kwargs"] = {"allow_nan": False, "sort_keys": False}
    return environment
