"""The joint-gradient experiment's analysis on planted runs: kept type sums written as a study keeps them, each endpoint
against an independent computation, and the pre-registered words following planted effects."""

import gzip
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from twotower.evaluation.scoring.cross_fitting import CrossFittedPreference
from twotower.evaluation.scoring.report_files import TYPE_SUMS_PARQUET
from twotower.evaluation.study.config import StudyConfig
from twotower.evaluation.study.factorial import KeptPoint
from twotower.evaluation.study.joint_gradient import (
    arm_families, gradient_explanation, joint_gradient_analysis, paired_difference, sign_flip_p,
)
from recomputed import assert_close, recomputed
from twotower.evaluation.study.dataset import run_index
from twotower.evaluation.study.document import render_template
from twotower.evaluation.study.joint_gradient_report import gradient_context
from twotower.evaluation.study.parts_of_speech import noise_only_table, tags_at, type_tags_path
from twotower.evaluation.scoring.formatting import markdown_table

REPLICAS, TYPES, MIN_COUNT, SEEDS = 4, 40, 8, 4
ARMS = {"causal_joint": "joint", "causal_stopped": "stopped"}
FUNCTION_TYPES = np.arange(TYPES) < 10


def tag_table(agreement_of_function_words=0.85):
    """A kept tags table: 10 function-word types (DET, ADP) whose majority tag has `agreement_of_function_words` of
    their occurrences, 30 content-word types (NOUN, VERB) at 0.99."""
    tags = ["DET" if t < 5 else "ADP" if t < 10 else "NOUN" if t < 25 else "VERB" for t in range(TYPES)]
    agreement = np.where(FUNCTION_TYPES, agreement_of_function_words, 0.99)
    return pd.DataFrame({"token_id": np.arange(TYPES), "count": 50, "tag": tags, "agreement": agreement,
                         "tagged": agreement >= 0.8})


def planted_predictions(rng, signal, function_gain, occurrences=24):
    """A run whose towers differ per type by `signal` times a type's own preference, tower 0 gaining
    `function_gain` nats on function words, plus probe noise (each replica its own)."""
    token_ids = np.repeat(np.arange(TYPES), occurrences)
    rng.shuffle(token_ids)
    preference = rng.normal(0, 1, TYPES) * signal + function_gain * FUNCTION_TYPES
    towers = np.array([[+0.5], [-0.5]]) * preference[token_ids]
    base = rng.normal(-4, 1, TYPES)[token_ids]
    logprobs = np.repeat(base + towers, REPLICAS, axis=0) + rng.normal(0, 0.5, (2 * REPLICAS, token_ids.size))
    return token_ids, logprobs, np.arange(token_ids.size) % 6


def keep_run(runs_dir, family, seed, signal, function_gain, rng, ablation_r):
    name = f"{family}-t2-s{seed}"
    cross_fit = CrossFittedPreference(2, REPLICAS, TYPES)
    cross_fit.update(*planted_predictions(rng, signal, function_gain))
    (runs_dir / name / "scores" / "wiki").mkdir(parents=True)
    cross_fit.type_sums().to_parquet(runs_dir / name / "scores" / "wiki" / TYPE_SUMS_PARQUET)
    scores = {"cross_fit": cross_fit.compute(min_count=MIN_COUNT), "replicas_per_tower": [REPLICAS, REPLICAS],
              "ablation": {"correlation_with_probe_preference": ablation_r}}
    summary = {"run": {"name": name, "family": family, "seed": seed, "num_towers": 2},
               "trajectory": [{"step": 4, "scores": {"wiki": scores}}]}
    (runs_dir / name / "run.json").write_text(json.dumps(summary))
    return summary


def study_of(seeds=SEEDS):
    return StudyConfig(
        train_file="t", validation_file="v", eval_texts={"wiki": {"file": "w"}},
        families={"causal_joint": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe",
                                   "overrides": {"tower_heads": True}},
                  "causal_stopped": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe",
                                     "overrides": {"tower_heads": True, "joint_gradient": False},
                                     "control_of": "causal_joint"},
                  "causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe"}},
        grid=[{"family": family, "seeds": list(range(seeds))} for family in ARMS], probe={"probe_replicas": REPLICAS},
        seed_major=True)


def planted(tmp_path, signal, function_gain, seeds=SEEDS):
    rng = np.random.default_rng(0)
    return [keep_run(tmp_path, family, seed, signal[arm], function_gain[arm], rng, 0.5 if arm == "joint" else 0.1)
            for seed in range(seeds) for family, arm in ARMS.items()]


def test_arms_are_the_families_that_differ_only_in_the_joint_gradient():
    assert arm_families(study_of()) == {"joint": "causal_joint", "stopped": "causal_stopped"}


def test_noise_only_table_makes_one_towers_replicas_two_pseudo_towers(tmp_path):
    rng = np.random.default_rng(1)
    summary = keep_run(tmp_path, "causal_joint", 0, 0.6, 0.0, rng, 0.5)
    table = KeptPoint(tmp_path / "causal_joint-t2-s0", summary, "wiki", 4).type_sums
    noise = noise_only_table(table, tower=1, replicas_per_tower=4)
    # pseudo-tower 0 = tower 1's replicas 0 and 2, pseudo-tower 1 = its replicas 1 and 3 (probes 4..7 of the run)
    for new, old in enumerate([4, 6, 5, 7]):
        np.testing.assert_array_equal(noise[f"logprob_sum_probe{new}"], table[f"logprob_sum_probe{old}"])
    # the cross-fitting groups of the pseudo-run ([0], [1]) hold replicas of the real run's groups ([0, 1], [2, 3])
    pseudo = CrossFittedPreference.from_type_sums(noise, 2, 2)
    assert pseudo.compute(min_count=MIN_COUNT)["replica_groups"] == [[0], [1]]
    with pytest.raises(ValueError, match="multiple of 4"):
        noise_only_table(table, tower=0, replicas_per_tower=2)


def test_sign_flip_p_is_the_exact_permutation_p():
    differences = np.array([0.3, 0.1, -0.05, 0.2, 0.25])
    means = [np.mean(np.array(signs) * differences) for signs in itertools.product((1, -1), repeat=5)]
    expected = np.mean(np.abs(means) >= abs(differences.mean()) - 1e-12)
    assert sign_flip_p(differences) == pytest.approx(expected)
    assert sign_flip_p([0.1] * 8) == pytest.approx(2 / 256)  # only all-positive and all-negative are as far


def test_paired_difference_is_the_paired_t_interval():
    joint, stopped = {0: 0.5, 1: 0.6, 2: 0.55, 3: 0.7}, {0: 0.2, 1: 0.25, 2: 0.4, 3: 0.3, 4: 0.9}
    figure = paired_difference(joint, stopped)  # seed 4 has no partner: left out
    result = stats.ttest_rel([0.5, 0.6, 0.55, 0.7], [0.2, 0.25, 0.4, 0.3])
    ci = result.confidence_interval(0.95)
    assert figure["n"] == 4 and figure["value"] == pytest.approx(0.3)
    assert figure["ci"] == pytest.approx([ci.low, ci.high])


def test_tags_at_a_threshold_reads_the_agreement_column():
    table = tag_table(agreement_of_function_words=0.85)
    assert len(tags_at(table, 0.8)) == TYPES
    assert len(tags_at(table, 0.9)) == TYPES - 10  # the function words drop out above their agreement


def test_planted_joint_gradient_split_is_found_and_worded(tmp_path):
    summaries = planted(tmp_path, signal={"joint": 0.8, "stopped": 0.0}, function_gain={"joint": 1.0, "stopped": 0.0})
    analysis = joint_gradient_analysis(summaries, tmp_path, study_of(), type_tag_table_of=lambda text, tok: tag_table())
    assert analysis["runs_kept"] == analysis["runs_planned"] == 2 * SEEDS
    (point,) = analysis["points"]
    r = point["endpoints"]["cross_fitted_r"]
    # each arm's per-seed values are the cross-fitted r the scoring code wrote
    for summary in summaries:
        arm = ARMS[summary["run"]["family"]]
        assert r["arms"][arm]["per_seed"][summary["run"]["seed"]] == pytest.approx(
            summary["trajectory"][0]["scores"]["wiki"]["cross_fit"]["cross_fitted_r"], abs=1e-12)
    assert r["difference"]["ci"][0] > 0
    assert analysis["verdict"]["explanation"] == "the split needs the joint gradient"
    lean = analysis["verdict"]["lean"]
    assert lean["joint"]["reading"] == "beyond probe noise on every text"
    assert lean["stopped"]["reading"] == "not shown"
    # z over noise is z less the noise-only z, run by run
    z, noise, over = (point["endpoints"][name]["arms"]["joint"]["per_seed"]
                      for name in ("part_of_speech_z", "noise_only_z", "z_over_noise"))
    assert all(over[seed] == pytest.approx(z[seed] - noise[seed]) for seed in z)
    # the function words are tagged at 0.85: above it they drop out, and the contrast has no function words
    assert "z_over_noise_at_0.9" not in point["endpoints"]
    ablation = point["endpoints"]["ablation_agreement"]["difference"]
    assert ablation["value"] == pytest.approx(0.4)
    recurrence = point["recurrence"]
    assert set(recurrence["arms"]) == {"joint", "stopped"}
    assert recurrence["arms"]["stopped"]["seed_level"]["num_pairs"] == SEEDS * (SEEDS - 1) // 2


def test_architecture_without_the_joint_gradient(tmp_path):
    summaries = planted(tmp_path, signal={"joint": 0.8, "stopped": 0.8}, function_gain={"joint": 0.0, "stopped": 0.0})
    analysis = joint_gradient_analysis(summaries, tmp_path, study_of())
    final = {point["text"]: point for point in analysis["points"]}
    assert gradient_explanation(final, "wiki") == "the architecture makes the split, no effect of the joint gradient shown"
    assert analysis["verdict"]["lean"]["joint"]["reading"] == "not shown"  # no tags: endpoint 3 left out


def test_no_words_before_every_planned_run_is_kept(tmp_path):
    summaries = planted(tmp_path, signal={"joint": 0.8, "stopped": 0.0}, function_gain={"joint": 0.0, "stopped": 0.0},
                        seeds=3)
    analysis = joint_gradient_analysis(summaries, tmp_path, study_of(seeds=4))
    assert analysis["runs_kept"] == 6 and analysis["runs_planned"] == 8
    assert analysis["verdict"]["explanation"] == "not read before every planned run is kept"


def test_the_document_section_writes_the_words_and_the_tables(tmp_path):
    summaries = planted(tmp_path, signal={"joint": 0.8, "stopped": 0.0}, function_gain={"joint": 1.0, "stopped": 0.0})
    analysis = joint_gradient_analysis(summaries, tmp_path, study_of(), type_tag_table_of=lambda text, tok: tag_table())
    section = render_template("study_joint_gradient.md.j2", gradient=gradient_context(analysis, markdown_table))
    r = analysis["points"][0]["endpoints"]["cross_fitted_r"]
    assert "*the split needs the joint gradient*" in section
    assert f"paired difference {r['difference']['value']:.2f} [{r['difference']['ci'][0]:.2f}," in section
    assert "over probe noise, joint gradient: *beyond probe noise on every text*" in section
    for heading in ("### Cross-fitted r", "### Part-of-speech z over probe noise", "### Ablation agreement",
                    "### Cross-seed r per arm"):
        assert heading in section
    interim = joint_gradient_analysis(summaries[:6], tmp_path, study_of(), type_tag_table_of=lambda text, tok: tag_table())
    section = render_template("study_joint_gradient.md.j2", gradient=gradient_context(interim, markdown_table))
    assert "*Not read yet*: 6 of 8 runs are kept" in section and "needs the joint gradient" not in section


def test_plain_numpy_script_recomputes_the_experiments_figures(tmp_path):
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    summaries = planted(runs_dir, signal={"joint": 0.8, "stopped": 0.2}, function_gain={"joint": 1.0, "stopped": 0.0})
    study = study_of()
    for summary in summaries:  # a tokenizer file names the text's kept tags, as the study keeps them
        (runs_dir / summary["run"]["name"] / "tokenizer.json.gz").write_bytes(gzip.compress(b"{}"))
    tags_file = type_tags_path(tmp_path, "wiki", runs_dir / summaries[0]["run"]["name"] / "tokenizer.json.gz")
    tags_file.parent.mkdir()
    tag_table().to_parquet(tags_file)
    run_index(summaries, runs_dir, study).to_parquet(tmp_path / "run_index.parquet")
    analysis = joint_gradient_analysis(summaries, runs_dir, study, type_tag_table_of=lambda text, tok: tag_table())
    (point,) = recomputed(tmp_path)["points"]
    (document,) = analysis["points"]
    names = {"value": "cross_fitted_r", "part_of_speech_z": "part_of_speech_z", "noise_only_z": "noise_only_z",
             "z_over_noise": "z_over_noise", "z_over_noise_at_0.6": "z_over_noise_at_0.6"}
    for mine, theirs in names.items():
        for arm, figure in point["arms"][mine]["arms"].items():
            assert_close(figure, document["endpoints"][theirs]["arms"][arm])
        difference = point["arms"][mine]["difference"]
        assert_close(difference, document["endpoints"][theirs]["difference"])
        assert difference["p"] == pytest.approx(document["endpoints"][theirs]["difference"]["p"])
    for arm, figure in point["arms"]["cross_seed"].items():
        assert figure["r"] == pytest.approx(document["recurrence"]["arms"][arm]["pair_rule"]["r"], abs=1e-10)
