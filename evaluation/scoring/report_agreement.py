"""What report.md says of the two measures of preference, and its top-token tables split by the per-type test.

The probe preference (decodable from the tower) and the mean-ablation preference (relied on by the joint model)
answer different questions; report.md leads with their agreement on the model (tower_preference/measure_agreement)
and words its verdict from it. Each tower's top tokens list first the types whose preference is beyond probe noise
(or significant over occurrences, with one probe per tower), then, apart, the strongest of the others; where the
text was tagged, with each type's part of speech.
"""

import pandas as pd

from .formatting import markdown_table
from ..tower_preference.measure_agreement import DECODABLE, RELIED_ON, agreement_meaning, agreement_verdict


def agreement_of(report: dict) -> dict:
    """The template's `agreement` ({"r", "ci", "num_types", "verdict", "meaning"}; r None without an ablation) and
    `measures`."""
    ablation = report.get("ablation") or {}
    agreement = {
        "r": ablation.get("correlation_with_probe_preference"),
        "ci": ablation.get("correlation_with_probe_preference_ci") or [None, None],
        "num_types": ablation.get("num_eligible_types"),
    }
    known = agreement["ci"][0] is not None
    verdict = agreement_verdict(agreement) if known else "unknown"
    meaning = agreement_meaning(agreement) if known else ""
    return {
        "agreement": agreement | {"verdict": verdict, "meaning": meaning},
        "measures": {"probe": DECODABLE, "ablation": RELIED_ON},
    }


def top_tokens_split(summary: dict, table: pd.DataFrame, is_replica: bool, token_cell) -> list[str]:
    """Per tower, its top tokens (summary's top_token_ids) as Markdown: the ones beyond noise in a table, then the
    others in a table of their own, each row with its count, preference, p-value, whether beyond noise and, where
    the table has them (report.with_parts_of_speech), its part of speech and that tag's share of its occurrences;
    `token_cell` writes a token string as a table cell."""
    rows_by_id = table.set_index("token_id")
    beyond = "beyond probe noise" if is_replica else "significant over occurrences"
    tagged = "pos_tag" in table.columns
    columns = ["token", "id", "count", "preference (nats)", "p-value", beyond] + (["part of speech"] if tagged else [])
    sections = []
    for token_ids, preferences in zip(summary["top_token_ids"], summary["top_preference_nats"]):
        rows = [
            (token_cell(rows_by_id.at[token_id, "token"]), token_id, rows_by_id.at[token_id, "count"], f"{preference:.3f}",
             f"{rows_by_id.at[token_id, 'p_value']:.2g}", "yes" if rows_by_id.at[token_id, "significant"] else "no")
            + ((_part_of_speech_cell(rows_by_id.loc[token_id]),) if tagged else ())
            for token_id, preference in zip(token_ids, preferences)
        ]
        passing = [row for row in rows if row[5] == "yes"]
        others = [row for row in rows if row[5] == "no"]
        parts = [f"{len(passing)} of the {len(rows)} strongest types are {beyond} (Benjamini-Hochberg at alpha = "
                 f"{summary['alpha']}):"]
        if passing:
            parts.append(markdown_table(pd.DataFrame(passing, columns=columns), tablefmt="github"))
        if others:
            parts.append(f"The other {len(others)}, not {beyond} (listed apart: their preference may be noise):")
            parts.append(markdown_table(pd.DataFrame(others, columns=columns), tablefmt="github"))
        sections.append("\n\n".join(parts))
    return sections


def _part_of_speech_cell(row) -> str:
    """A type's majority tag and its share of the type's occurrences ("NOUN, 97%"); "none" outside any word."""
    if pd.isna(row["pos_tag"]):
        return "none"
    return f"{row['pos_tag']}, {row['pos_tag_share']:.0%}"
