"""The study's token categories: per family, each seed's share of every category's types preferring a tower (towers
aligned to the first seed's), and whether a category leans to the same matched tower across seeds. A tower that is
better at most types (a dominant tower: the masked family's offsets reach 0.75 nats) would make every category lean
to it, so categories are compared after each tower's median preference over the eligible types is removed, every
type counted once (the scoring's centering removes the offset over occurrences, which the frequent types dominate).
"""

import numpy as np
import pandas as pd

from ..scoring.formatting import number
from ..scoring.report import eligible_preferences, tower_columns
from ..scoring.token_categories import categorize, category_preferences
from ..tower_preference.comparisons import compare_preferences
from .kept_tables import load_kept_report

RECURRENCE_GROUPINGS = ("kind", "frequency", "case")  # the groupings whose recurrence the document tabulates


def category_rows(summaries, runs_dir, text):
    """Per family (its first tower count): token categories of each seed, towers aligned to the first seed's."""
    by_family = {}
    for summary in summaries:
        run = summary["run"]
        if text in summary["scores"]:
            by_family.setdefault((run["family"], run["num_towers"]), []).append(run["name"])
    results = {}
    for (family, num_towers), names in by_family.items():
        reference = load_kept_report(runs_dir / names[0] / "scores" / text).table
        per_seed = {}
        for name in names:
            table = load_kept_report(runs_dir / name / "scores" / text).table
            (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, (reference, table))
            mapping = compare_preferences(ids_a, preference_a, ids_b, preference_b)["tower_mapping"]
            labels = categorize(table)
            recentered = without_type_offset(table)
            per_seed[name] = {
                column: category_preferences(recentered, values, weighted=False).assign(tower_of_reference_0=mapping[0])
                for column, values in labels.items()
            }
        results[(family, num_towers)] = per_seed
    return results


def _category_share(frame, category):
    """One seed's share of a category's types preferring the reference tower 0; `*` when the split differs."""
    match = frame[frame["category"] == category]
    if match.empty:
        return "n/a"
    tower = int(match["tower_of_reference_0"].iloc[0])
    share = match[f"num_preferring_tower{tower}"].iloc[0] / match["num_types"].iloc[0]
    return number(share, 2) + ("*" if match["q_value"].iloc[0] < 0.05 else "")


def category_table(per_seed):
    """Per category of the first seed: its number of types and every seed's share preferring tower 0."""
    seeds = list(per_seed)
    rows = [
        [grouping, category, int(num_types), *(_category_share(per_seed[seed][grouping], category) for seed in seeds)]
        for grouping, frame in per_seed[seeds[0]].items()
        for category, num_types in zip(frame["category"], frame["num_types"])
    ]
    return pd.DataFrame(rows, columns=["grouping", "category", "types", *seeds])


def _category_side(frame, category):
    """
    (q-value of the category's split, its side: does a larger share of its types prefer the reference's tower 0 than
    of all the grouping's types?) in one seed. The side is the test's direction, not the sign of the mean
    preference: centering on occurrences makes the frequent types' mean preference about 0 whichever way they split.
    """
    match = frame[frame["category"] == category]
    if match.empty:
        return None
    preferring = f"num_preferring_tower{int(match['tower_of_reference_0'].iloc[0])}"
    share = match[preferring].iloc[0] / match["num_types"].iloc[0]
    overall_share = frame[preferring].sum() / frame["num_types"].sum()
    return float(match["q_value"].iloc[0]), bool(share > overall_share)


def category_recurrence(by_family, groupings=RECURRENCE_GROUPINGS):
    """
    Per category of `groupings`: in each family, the seeds whose towers split it differently from the overall split
    (q < 0.05) and whether those seeds lean to the same (matched) tower; recurs across seeds when at least two
    seeds do and agree, across families when it recurs in every family.
    """
    rows = {}
    for (family, _), per_seed in by_family.items():
        for grouping in groupings:
            frames = [per_run[grouping] for per_run in per_seed.values() if grouping in per_run]
            categories = {category for frame in frames for category in frame["category"]}
            for category in categories:
                sides = [_category_side(per_run[grouping], category) for per_run in per_seed.values()]
                significant = [side for q, side in filter(None, sides) if q < 0.05]
                row = rows.setdefault((grouping, category), {"grouping": grouping, "category": category})
                row[family] = {"significant_seeds": len(significant), "seeds": len(sides),
                               "same_side": len(set(significant)) <= 1,
                               "recurs": len(significant) >= 2 and len(set(significant)) == 1}
    families = [family for family, _ in by_family]
    for row in rows.values():
        row["recurs_in_every_family"] = all(row.get(family, {}).get("recurs", False) for family in families)
    return sorted(rows.values(), key=lambda row: (row["grouping"], str(row["category"])))


def recurrence_table(recurrence, families):
    def cell(entry):
        if entry is None:
            return "n/a"
        mark = " (recurs)" if entry["recurs"] else "" if entry["same_side"] else " (sides differ)"
        return f"{entry['significant_seeds']}/{entry['seeds']}{mark}"

    return pd.DataFrame(
        [[row["grouping"], row["category"], *(cell(row.get(family)) for family in families),
          "yes" if row["recurs_in_every_family"] else "no"] for row in recurrence],
        columns=["grouping", "category", *families, "in every family"],
    )


def without_type_offset(table: pd.DataFrame) -> pd.DataFrame:
    """The per-token table with each tower's preference less its median over the eligible types, and each type's
    preferred tower taken again from the result."""
    preference = tower_columns(table, "preference_nats")  # [towers, types]
    offset = np.median(preference[:, table["eligible"].to_numpy(dtype=bool)], axis=1, keepdims=True)
    recentered = preference - offset
    columns = {f"preference_nats_tower{tower}": values for tower, values in enumerate(recentered)}
    return table.assign(**columns, preferred_tower=recentered.argmax(axis=0))
