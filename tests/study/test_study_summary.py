"""The study summary of README.md and docs/study.md is what the committed study JSON renders: no hand copies."""

import copy
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from twotower.evaluation.study.factorial import factorial_verdict
from twotower.evaluation.study.summary import (
    fill_blocks, load_results, render_findings, render_summary, summary_targets,
)
from twotower.training.utils.errors import TwoTowerUserError

REPO_ROOT = Path(__file__).resolve().parents[2]
STUDY_DIR = REPO_ROOT / "docs" / "study"


def test_readme_and_study_md_blocks_equal_what_the_study_json_renders():
    for path, expected in summary_targets(STUDY_DIR, REPO_ROOT).items():
        assert path.read_text() == expected, f"{path} is out of date: run python -m twotower.evaluation.study.summary"


def test_every_figure_of_the_readme_summary_is_in_the_study_json():
    results = load_results(STUDY_DIR)
    summary = render_summary(results, "docs/study", "docs/study.md")
    verdict = results["main"]["verdicts"]["masked"]
    assert f"matched r {verdict['cross_seed_r']:.2f} [{verdict['cross_seed_r_ci'][0]:.2f}, " in summary
    separate = results["crossfit"]["cross_fit_verdicts"]["causal"]["other_controls"]["causal_control_separate"]
    r = separate["control"]["cross_fitted_r"]
    assert f"share nothing at\n{r['value']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" in summary
    # the words follow the numbers: a split that recurs strongly is no longer called model-specific
    changed = copy.deepcopy(results)
    changed["main"]["verdicts"]["masked"] |= {"cross_seed_r": 0.8, "cross_seed_r_ci": [0.7, 0.9]}
    line = next(line for line in render_summary(changed, ".", "x").splitlines() if line.startswith("- **masked**"))
    assert "matched r 0.80 [0.70, 0.90]" in line
    assert "cooperative towers: matched r 0.80 [0.70, 0.90] against 0.02 for unrelated preferences (95th percentile " \
        "0.04): above chance, largely shared across seeds;" in line
    assert "matched r 0.39" not in line and "above chance, but mostly model-specific" in render_summary(results, ".", "x")
    # the layout and depth families beyond the base cell say whether their split recurs, from their own verdicts
    deeper = results["crossfit"]["verdicts"]["causal_l4"]
    assert (f"(causal_l4, {len(deeper['seeds'])} seeds; across seeds, matched r {deeper['cross_seed_r']:.2f} "
            f"[{deeper['cross_seed_r_ci'][0]:.2f}, {deeper['cross_seed_r_ci'][1]:.2f}]") in summary
    changed["crossfit"]["verdicts"]["causal_l4"] |= {"cross_seed_r": 0.8, "cross_seed_r_ci": [0.7, 0.9]}
    assert "matched r 0.80 [0.70, 0.90] against 0.02 for unrelated preferences (95th percentile 0.03): above chance, " \
        "largely shared across seeds)." in render_summary(changed, ".", "x")


def test_the_2x2_once_every_run_is_kept_gives_its_effects_recurrence_and_syntax_reading():
    results = copy.deepcopy(load_results(STUDY_DIR))
    factorial = results["causes"]["factorial"]
    final = {p["text"]: p for p in factorial["points"] if p["step"] == factorial["final_step"]}
    factorial |= {"runs_kept": factorial["runs_planned"], "verdict": factorial_verdict(final, factorial["primary_text"])}
    summary = render_summary(results, "docs/study", "docs/study.md")
    assert "embedding sharing ([what causes the split](docs/study.md#what-causes-the-split-the-2x2-pre-registered)) " \
        "answers it at the end of this summary." in summary
    primary = final[factorial["primary_text"]]
    interaction = primary["endpoints"]["cross_fitted_r"]["effects"]["interaction"]
    assert f"*{factorial['verdict']['explanation']}* ({factorial['runs_planned']} of {factorial['runs_planned']} " \
        f"runs kept) (effects on the cross-fitted r: " in summary
    assert f"interaction {interaction['value']:.2f} [{interaction['ci'][0]:.2f}, {interaction['ci'][1]:.2f}]" in summary
    cell = primary["cross_seed"]["cells"]["independent, shared embedding"]
    assert f"independent, shared embedding, matched r {cell['r']:.2f} [" in summary
    pos = factorial["verdict"]["part_of_speech"]["gutenberg"]["cooperative_z"]
    assert f"The paper's syntax/semantics reading (function-word against content-word types, pre-registered): " \
        f"*{factorial['verdict']['syntax_reading']}*; the cooperative cells' mean part-of-speech z " in summary
    assert f"{pos['value']:.2f} [{pos['ci'][0]:.2f}, {pos['ci'][1]:.2f}] on gutenberg (cooperation effect " in summary
    # an interaction is read through the cooperation effect at each embedding level, and the words follow them
    if factorial["verdict"]["explanation"] == "interaction":
        separate = results["causes"]["cross_fit_verdicts"]["causal_separate"]["difference"]
        assert f"{separate['value']:.2f} [{separate['ci'][0]:.2f}, {separate['ci'][1]:.2f}] with separate embeddings" \
            in summary
        claim = "cooperation makes the split more reproducible with either embedding"
        assert (claim in summary) == all(verdict["difference"]["ci"][0] > 0
                                         for verdict in results["causes"]["cross_fit_verdicts"].values())
        separate["ci"] = [-0.05, 0.5]
        assert claim not in render_summary(results, "docs/study", "docs/study.md")


def test_readme_findings_state_each_finding_with_its_figures_and_follow_them():
    results = copy.deepcopy(load_results(STUDY_DIR))
    findings = render_findings(results, "docs/study", "docs/study.md")
    assert len(findings.strip().splitlines()) <= 15
    factorial = results["causes"]["factorial"]
    primary = next(p for p in factorial["points"]
                   if p["step"] == factorial["final_step"] and p["text"] == factorial["primary_text"])
    shared = primary["endpoints"]["cross_fitted_r"]["cells"]["cooperative, shared embedding"]
    assert f"cross-fitted r {shared['value']:.2f} [{shared['ci'][0]:.2f}, {shared['ci'][1]:.2f}] for towers " in findings
    difference = results["causes"]["cross_fit_verdicts"]["causal"]["difference"]
    assert f"paired by seed: {difference['value']:.2f} [{difference['ci'][0]:.2f}, " in findings
    noise = factorial["verdict"]["part_of_speech"]["gutenberg"]["against_noise"]
    z = noise["cooperative_z_over_noise"]
    assert f"{z['value']:.2f} [{z['ci'][0]:.2f}, {z['ci'][1]:.2f}] on the Gutenberg novels (" in findings
    assert "![The 2x2's cross-fitted r per cell" in findings and "*supported*" not in findings
    # the words follow the numbers: no lean beyond noise, a split that does not recur, a finished experiment
    noise |= {"beyond_noise": False}
    cell = primary["cross_seed"]["cells"]["cooperative, shared embedding"]
    cell["seed_level"] |= {"recurs": False, "p": 0.3}
    changed = render_findings(results, "docs/study", "docs/study.md")
    assert "on the Gutenberg novels (not beyond noise)" in changed
    assert "not shown above chance (seed-level permutation p 0.300)" in changed


def _final_r(study):
    return next(point["endpoints"]["cross_fitted_r"] for point in study["points"]
                if point["step"] == study["final_step"] and point["text"] == study["primary_text"])


def test_the_joint_gradient_experiment_is_read_with_its_tower_heads_against_the_2x2_and_the_words_follow():
    results = copy.deepcopy(load_results(STUDY_DIR))
    experiment, factorial = results["gradient"]["joint_gradient"], results["causes"]["factorial"]
    assert experiment["runs_kept"] == experiment["runs_planned"] == 16
    r, cell = _final_r(experiment), _final_r(factorial)["cells"]["cooperative, shared embedding"]
    # the tower heads' effect, recomputed here: the joint arm minus the 2x2's cell over the seeds both have
    seeds = sorted(set(r["arms"]["joint"]["per_seed"]) & set(cell["per_seed"]))
    differences = [r["arms"]["joint"]["per_seed"][seed] - cell["per_seed"][seed] for seed in seeds]
    low, high = stats.t.interval(0.95, len(differences) - 1, loc=np.mean(differences), scale=stats.sem(differences))
    figure = f"{np.mean(differences):.2f} [{low:.2f}, {high:.2f}], {len(seeds)} seeds"
    findings = render_findings(results, "docs/study", "docs/study.md")
    summary = render_summary(results, "docs/study", "docs/study.md")
    difference = r["difference"]
    assert (f"(cross-fitted r with the gradient minus without, {difference['value']:.2f} [{difference['ci'][0]:.2f}, "
            f"{difference['ci'][1]:.2f}], 8 seeds: *{experiment['verdict']['explanation']}*)") in findings
    assert f"(the joint arm minus the 2x2, paired by seed, {figure}; a comparison not pre-registered)" in findings
    assert ("3. **Stopping the joint gradient made no difference shown, in a design that weakens the split.** "
            in findings) == (difference["ci"][0] <= 0 <= difference["ci"][1] and high < 0)
    assert f"the joint arm minus that cell, paired by seed, {figure}, not pre-registered" in summary
    # the words follow the numbers: towers whose own losses strengthen the split, a joint gradient that matters
    weakened = "the towers' own losses weakened the split"
    assert (weakened in findings) == (high < 0)
    for seed in seeds:
        r["arms"]["joint"]["per_seed"][seed] = cell["per_seed"][seed] + 0.1 + 0.01 * int(seed)
    difference |= {"value": 0.2, "ci": [0.05, 0.35]}
    changed = render_findings(results, "docs/study", "docs/study.md")
    assert "the towers' own losses strengthened the split" in changed and weakened not in changed
    assert "3. **Stopping the joint gradient changed the split.** " in changed
    assert "Stopping it changed the split (cross-fitted r with the gradient minus without, 0.20 [0.05, 0.35]" in changed
    assert "adds nothing shown" not in changed and "adds nothing shown" not in render_summary(results, ".", "x")
    # an experiment still running is not read
    experiment["runs_kept"] = 8
    running = render_findings(results, "docs/study", "docs/study.md")
    assert "3. **Whether the joint gradient makes it is being tested.** " in running
    assert "is under way (8 of 16 runs kept)" in running
    assert "not read before every run is kept" in render_summary(results, ".", "x")


def test_a_document_without_a_block_or_with_an_unknown_one_is_refused(tmp_path):
    plain = tmp_path / "plain.md"
    plain.write_text("no block here\n")
    with pytest.raises(TwoTowerUserError, match="no `<!-- study-summary -->`"):
        fill_blocks(plain, {"summary": "x"})
    unknown = tmp_path / "unknown.md"
    unknown.write_text("<!-- study-other -->\nold\n<!-- /study-other -->\n")
    with pytest.raises(TwoTowerUserError, match="study-other"):
        fill_blocks(unknown, {"summary": "x"})
    filled = tmp_path / "filled.md"
    filled.write_text("a\n<!-- study-summary -->\nold\n<!-- /study-summary -->\nb\n")
    assert fill_blocks(filled, {"summary": "new\n"}) == "a\n<!-- study-summary -->\nnew\n<!-- /study-summary -->\nb\n"
