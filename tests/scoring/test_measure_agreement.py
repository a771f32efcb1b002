"""The agreement of the two measures of preference (tower_preference/measure_agreement.py) and report.md's words."""

import numpy as np
import pytest

from twotower.evaluation.scoring import report
from twotower.evaluation.tower_preference.measure_agreement import (
    FEW_TYPES, agreement_meaning, agreement_verdict, measure_agreement,
)
from twotower.evaluation.tower_preference.replica_preference import compute_preference

from test_replica_report import MIN_COUNT, PROBE_RUNS, PROBE_TOWERS, replica_predictions


def planted(correlation, num_types=400, seed=0):
    """Two towers' preferences [2, types] (tower 1's minus tower 0's) and an ablation preference correlated with them."""
    rng = np.random.default_rng(seed)
    probe = rng.normal(0, 1, num_types)
    ablation = correlation * probe + np.sqrt(1 - correlation**2) * rng.normal(0, 1, num_types)
    return np.stack([probe, -probe]), np.stack([ablation, -ablation])


@pytest.mark.parametrize("correlation, verdict", [(0.9, "agree"), (0.3, "partly agree"), (0.0, "do not agree")])
def test_agreement_is_the_correlation_over_eligible_types_with_its_interval(correlation, verdict):
    probe, ablation = planted(correlation)
    eligible = np.ones(probe.shape[1], bool)
    eligible[::10] = False
    probe[:, ~eligible] = 100.0  # types that are not eligible take no part
    agreement = measure_agreement(probe, ablation, eligible)
    assert agreement["r"] == pytest.approx(np.corrcoef(probe[0, eligible], ablation[0, eligible])[0, 1], abs=1e-12)
    assert agreement["num_types"] == eligible.sum()
    low, high = agreement["ci"]
    # a 95% interval of r over 360 types: about r -+ 1.96 (1 - r^2) / sqrt(n)
    half_width = 1.96 * (1 - agreement["r"] ** 2) / np.sqrt(eligible.sum())
    assert low < agreement["r"] < high and (high - low) == pytest.approx(2 * half_width, rel=0.25)
    assert agreement_verdict(agreement) == verdict


def test_no_agreement_from_fewer_than_three_types():
    probe, ablation = planted(0.5, num_types=2)
    assert measure_agreement(probe, ablation, [True, True]) == {"r": None, "ci": [None, None], "num_types": 2}


def reliable_report(agreement_r, agreement_ci):
    token_ids, gold_logprobs = replica_predictions(0, tower_nats=0.8)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, top_k=3, probe_towers=PROBE_TOWERS,
                                probe_runs=PROBE_RUNS)
    assert result.summary["reliability"] >= report.RELIABLE_PREFERENCE
    metadata = {
        "model": {"path": "planted"}, "data": {"description": "planted", "num_blocks": 3, "block_size": 32},
        "perplexity": {"joint": 12.0, "probes": [20.0, 21.0]}, "summary": result.summary,
        "ablation": {"mean_increase_nats": [0.1, 0.2], "num_significant": 1, "significant_share": 0.1,
                     "split_half_consistency": 0.9, "num_eligible_types": result.summary["num_eligible_types"],
                     "correlation_with_probe_preference": agreement_r,
                     "correlation_with_probe_preference_ci": agreement_ci},
    }
    tokens = [f"tok{token_id}" for token_id in result.token_ids]
    return report.render_markdown(metadata, report.per_token_table(result, tokens))


def test_a_reliable_preference_the_joint_model_does_not_share_is_not_called_the_towers():
    markdown = reliable_report(-0.044, [-0.13, 0.05])
    assert "property of the towers" not in markdown
    lead = markdown.split("## Perplexity")[0]
    assert "**Two measures of preference.**" in lead and "r = -0.04 (95% bootstrap interval over types -0.13 to 0.05)" in lead
    assert "They do not agree" in lead
    assert "reproducibly decodable from the towers. It is not how the joint model divides the work" in markdown


def test_a_reliable_preference_the_joint_model_shares_is_said_to_be_in_part_its_division_of_work():
    markdown = reliable_report(0.57, [0.52, 0.62])
    assert "They agree: a tower whose features decode" in markdown.split("## Perplexity")[0]
    assert "the preference relied on by the joint model (mean ablation, no probe) agrees with it (r = 0.57)" in markdown


def test_a_strong_negative_agreement_over_few_types_is_worded_as_such_with_a_caveat():
    # six types whose ablation preference is nearly the probes' mirror image, as on a short text
    probe = np.array([0.30, -0.20, 0.10, -0.40, 0.25, -0.05])
    ablation = -probe + np.array([0.02, -0.03, 0.05, 0.01, -0.04, 0.03])
    agreement = measure_agreement(np.stack([probe, -probe]), np.stack([ablation, -ablation]), np.ones(6, bool))
    assert agreement["r"] == pytest.approx(np.corrcoef(probe, ablation)[0, 1]) and agreement["r"] < -0.9
    assert agreement["ci"][1] < 0 and agreement_verdict(agreement) == "disagree"
    meaning = agreement_meaning(agreement)
    assert meaning.startswith("They point opposite ways: where a tower's features decode a type better, the joint "
                              "model tends to rely on the other tower for it")
    assert "says nothing" not in meaning
    assert meaning.endswith("Over only 6 types, though: a correlation over so few types moves a lot with each type, "
                            "so read it as a hint.")
    # strongly negative, but an interval that reaches 0: still opposite ways, and said to be uncertain
    uncertain = agreement_meaning({"r": -0.7, "ci": [-0.95, 0.1], "num_types": 8})
    assert uncertain.startswith("They point opposite ways, though the interval reaches 0:")


def test_no_agreement_over_many_types_is_worded_without_the_caveat():
    probe, ablation = planted(0.0)
    agreement = measure_agreement(probe, ablation, np.ones(probe.shape[1], bool))
    assert agreement["num_types"] == 400 >= FEW_TYPES and agreement["ci"][0] < 0 < agreement["ci"][1]
    meaning = agreement_meaning(agreement)
    assert meaning.startswith("They do not agree: the correlation cannot be told from 0")
    assert "opposite" not in meaning and "Over only" not in meaning


def test_the_strong_negative_wording_reaches_report_md_and_its_ablation_bullets_stay_apart():
    markdown = reliable_report(-0.94, [-0.99, -0.62])
    lead = markdown.split("## Perplexity")[0]
    assert "They point opposite ways: where a tower's features decode a type better" in lead
    assert "says nothing" not in markdown
    lines = markdown.splitlines()
    # each of the ablation section's bullets on its own line
    correlation = next(line for line in lines if line.startswith("- correlation with the probe preference"))
    assert correlation.endswith("(95% bootstrap interval over types -0.990 to -0.620)")
    assert any(line.startswith("- significant over occurrences (Benjamini-Hochberg") for line in lines)
    assert any(line.startswith("- split-half consistency: 0.900") for line in lines)
