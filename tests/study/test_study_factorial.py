"""The 2x2 analysis of cooperation and embedding sharing on planted values: kept type sums written as a study keeps
them, the endpoints recomputed from them, the linear model and the permutation test against independent sums."""

import dataclasses
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from twotower.evaluation.scoring.cross_fitting import CrossFittedPreference
from twotower.evaluation.scoring.report_files import TYPE_SUMS_PARQUET
from twotower.evaluation.study.config import StudyConfig
from twotower.evaluation.study.factorial import (
    PER_RUN_ENDPOINTS, KeptPoint, cross_fitted_r, effect_model, explanation, factorial_analysis, family_factors,
    stratified_permutation_p, type_preferences,
)
from twotower.evaluation.tower_preference.replica_preference import compute_preference

REPLICAS, TYPES, MIN_COUNT = 2, 40, 8
FAMILIES = {  # family -> (cooperation, embedding)
    "causal": (1, 1), "causal_separate": (1, -1), "causal_control": (-1, 1), "causal_control_separate": (-1, -1)}


# the planted types' parts of speech: 10 function-word types (DET, ADP), 30 content-word types (NOUN, VERB)
TYPE_TAGS = {t: "DET" if t < 5 else "ADP" if t < 10 else "NOUN" if t < 25 else "VERB" for t in range(TYPES)}
FUNCTION_TYPES = np.arange(TYPES) < 10
TAG_TABLE = pd.DataFrame({"token_id": list(TYPE_TAGS), "count": 50, "tag": list(TYPE_TAGS.values()), "agreement": 1.0,
                          "tagged": True})  # as the study keeps a text's tags (TypeTags.table())


def planted_predictions(rng, signal: float, occurrences: int = 24, function_gain: float = 0.0):
    """token ids, gold log-probs [probes, n] (tower-major) and documents of one run whose towers differ per type by
    `signal` times a type's own preference (shared by every replica and both halves), plus probe noise; tower 0
    gains `function_gain` nats over tower 1 on the function-word types."""
    token_ids = np.repeat(np.arange(TYPES), occurrences)
    rng.shuffle(token_ids)
    preference = rng.normal(0, 1, TYPES) * signal + function_gain * FUNCTION_TYPES
    base = rng.normal(-4, 1, TYPES)
    towers = np.array([[+0.5], [-0.5]]) * preference[token_ids]
    logprobs = np.repeat(base[token_ids] + towers, REPLICAS, axis=0) + rng.normal(0, 0.5, (2 * REPLICAS, token_ids.size))
    return token_ids, logprobs, np.arange(token_ids.size) % 6


def keep_run(runs_dir, family, seed, signal, rng, steps=(3, 6), function_gain=0.0):
    """A kept run folder (run.json, type sums at every step) as the study writes it; returns its run.json."""
    name = f"{family}-t2-s{seed}"
    trajectory = []
    for step in steps:
        cross_fit = CrossFittedPreference(2, REPLICAS, TYPES)
        cross_fit.update(*planted_predictions(rng, signal, function_gain=function_gain))
        point_dir = runs_dir / name / ("" if step == steps[-1] else f"trajectory/step-{step}")
        (point_dir / "scores" / "wiki").mkdir(parents=True, exist_ok=True)
        cross_fit.type_sums().to_parquet(point_dir / "scores" / "wiki" / TYPE_SUMS_PARQUET)
        trajectory.append({"step": step, "scores": {"wiki": {"cross_fit": cross_fit.compute(min_count=MIN_COUNT),
                                                             "replicas_per_tower": [REPLICAS, REPLICAS]}}})
    summary = {"run": {"name": name, "family": family, "seed": seed, "num_towers": 2}, "trajectory": trajectory}
    (runs_dir / name / "run.json").write_text(json.dumps(summary))
    return summary


def study_of(families=FAMILIES):
    overrides = {(1, 1): {}, (1, -1): {"separate_embeddings": True}, (-1, 1): {"cooperative": False},
                 (-1, -1): {"cooperative": False, "separate_embeddings": True}}
    return StudyConfig(
        train_file="t", validation_file="v", eval_texts={"wiki": {"file": "w"}},
        families={name: {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "overrides": overrides[cell]}
                  for name, cell in families.items()},
        grid=[{"family": name, "seeds": [0, 1, 2]} for name in families], probe={"probe_replicas": REPLICAS})


def planted_study(tmp_path, signal_of, seeds=3, function_gain_of=lambda c, e: 0.0):
    rng = np.random.default_rng(0)
    summaries = [keep_run(tmp_path, family, seed, signal_of(*cell), rng, function_gain=function_gain_of(*cell))
                 for seed in range(seeds) for family, cell in FAMILIES.items()]
    return summaries


def test_endpoints_recomputed_from_the_kept_sums_equal_the_scoring_code(tmp_path):
    rng = np.random.default_rng(1)
    summary = keep_run(tmp_path, "causal", 0, 0.6, rng, steps=(6,))
    point = KeptPoint(tmp_path / "causal-t2-s0", summary, "wiki", 6)
    assert cross_fitted_r(point) == pytest.approx(summary["trajectory"][0]["scores"]["wiki"]["cross_fit"]["cross_fitted_r"],
                                                  abs=1e-12)
    # the pooled, centered preference is the scoring command's (compute_preference with center=True) on predictions
    # that each carry their (half, type) row's mean log-prob: the same sums
    table = point.type_sums
    rebuilt = compute_preference(
        np.concatenate([np.full(n, t) for t, n in zip(table["token_id"], table["count"])]),
        np.concatenate([np.repeat(table[[f"logprob_sum_probe{k}" for k in range(4)]].to_numpy() / table[["count"]].to_numpy(),
                                  table["count"], axis=0)]).T,
        probe_towers=[0, 0, 1, 1], center=True, min_count=MIN_COUNT)
    eligible = rebuilt.token_ids[rebuilt.eligible]
    runs = type_preferences(point)
    np.testing.assert_array_equal(runs.token_ids, eligible)
    np.testing.assert_allclose(runs.preference[0], rebuilt.preference_nats[0][rebuilt.eligible], atol=1e-10)


def test_linear_model_matches_cell_means_and_pooled_variance():
    rng = np.random.default_rng(2)
    records = [{"cooperation": c, "embedding": e, "seed": s, "value": 0.3 * c + 0.1 * c * e + rng.normal(0, 0.05)}
               for c, e in itertools.product((1, -1), (1, -1)) for s in range(4)]
    model = effect_model(records)
    cell = {(c, e): np.array([r["value"] for r in records if (r["cooperation"], r["embedding"]) == (c, e)])
            for c, e in itertools.product((1, -1), (1, -1))}
    means = {key: values.mean() for key, values in cell.items()}
    pooled = sum(((values - values.mean()) ** 2).sum() for values in cell.values()) / 12
    cooperation = (means[1, 1] + means[1, -1] - means[-1, 1] - means[-1, -1]) / 2
    interaction = (means[1, 1] - means[-1, 1]) - (means[1, -1] - means[-1, -1])
    assert model["df"] == 12
    assert model["effects"]["cooperation"]["value"] == pytest.approx(cooperation)
    assert model["effects"]["interaction"]["value"] == pytest.approx(interaction)
    # a main effect is a difference of two means of 8 values: standard error sqrt(pooled (1/8 + 1/8))
    half = stats.t.ppf(0.975, 12) * np.sqrt(pooled / 4)
    assert model["effects"]["cooperation"]["ci"] == pytest.approx([cooperation - half, cooperation + half])
    assert model["effects"]["cooperation"]["p"] < 1e-6
    assert model["effects"]["embedding"]["ci"][0] < 0 < model["effects"]["embedding"]["ci"][1]


def test_stratified_permutation_test_enumerates_arrangements_within_strata():
    rng = np.random.default_rng(3)
    records = [{"cooperation": c, "embedding": e, "value": rng.normal() + c}
               for c, e in itertools.product((1, -1), (1, -1)) for _ in range(2)]
    result = stratified_permutation_p(records, "cooperation")
    assert result["arrangements"] == 36  # C(4, 2) in each of the 2 embedding levels
    # independently: relabel by brute force over every assignment of two +1 labels per stratum
    values = np.array([r["value"] for r in records])
    strata = [[i for i, r in enumerate(records) if r["embedding"] == level] for level in (1, -1)]

    def effect(plus):
        return sum(values[[i for i in s if i in plus]].mean() - values[[i for i in s if i not in plus]].mean()
                   for s in strata) / 2
    observed = effect({i for i, r in enumerate(records) if r["cooperation"] == 1})
    effects = [effect(set(a) | set(b)) for a in itertools.combinations(strata[0], 2)
               for b in itertools.combinations(strata[1], 2)]
    assert result["p"] == pytest.approx(np.mean(np.abs(effects) >= abs(observed) - 1e-12))
    four_seeds = [r | {"value": r["value"]} for r in records for _ in range(2)]
    assert stratified_permutation_p(four_seeds, "embedding")["arrangements"] == 4900


def test_a_planted_cooperation_effect_is_found_and_a_null_is_not(tmp_path):
    planted = planted_study(tmp_path / "planted", lambda c, e: 1.0 if c == 1 else 0.15)
    analysis = factorial_analysis(planted, tmp_path / "planted", study_of())
    final = [point for point in analysis["points"] if point["step"] == 6][0]
    endpoint = final["endpoints"]["cross_fitted_r"]
    assert endpoint["effects"]["cooperation"]["ci"][0] > 0.3
    assert analysis["verdict"]["explanation"] == "cooperation"
    # each run's value is its run.json's cross-fitted r
    for summary in planted:
        kept = summary["trajectory"][-1]["scores"]["wiki"]["cross_fit"]["cross_fitted_r"]
        assert endpoint["per_run"][summary["run"]["name"]] == pytest.approx(kept, abs=1e-12)
    assert [point["multiple"] for point in analysis["points"]] == [1.0, 2.0]

    null = planted_study(tmp_path / "null", lambda c, e: 0.5)
    verdict = factorial_analysis(null, tmp_path / "null", study_of())["verdict"]
    assert verdict["explanation"] == "neither"


def test_a_per_run_endpoint_enters_the_same_model(tmp_path):
    summaries = planted_study(tmp_path, lambda c, e: 0.5, seeds=2)
    planted = {s["run"]["name"]: 2.0 * (s["run"]["family"] in ("causal", "causal_control")) + 0.1 * s["run"]["seed"]
               for s in summaries}
    endpoints = PER_RUN_ENDPOINTS | {"planted": lambda point: planted[point.run_dir.name]}
    analysis = factorial_analysis(summaries, tmp_path, study_of(), endpoints)
    effects = analysis["points"][-1]["endpoints"]["planted"]["effects"]
    assert effects["embedding"]["value"] == pytest.approx(2.0)
    assert effects["cooperation"]["value"] == pytest.approx(0.0, abs=1e-12)
    # within each cell the seeds differ by 0.1: pooled variance 0.005 on 4 degrees of freedom, standard error 0.05
    assert effects["embedding"]["p"] == pytest.approx(2 * stats.t.sf(2.0 / 0.05, 4))
    assert effects["cooperation"]["p"] == pytest.approx(1.0)


def test_a_planted_part_of_speech_contrast_gives_the_syntax_reading_and_a_null_does_not(tmp_path):
    def analysis(folder, gain, type_tag_table_of=lambda text, tokenizer_file: TAG_TABLE):
        summaries = planted_study(folder, lambda c, e: 0.5, function_gain_of=lambda c, e: gain if c == 1 else 0.0)
        return factorial_analysis(summaries, folder, study_of(), type_tag_table_of=type_tag_table_of)

    planted = analysis(tmp_path / "planted", 1.5)
    endpoint = planted["points"][-1]["endpoints"]["part_of_speech_z"]
    assert endpoint["effects"]["cooperation"]["ci"][0] > 2
    assert planted["verdict"]["syntax_reading"] == "supported"
    # seed 0's d, independently with pandas: tower 0 minus tower 1 per replica group and half, averaged, over the
    # types seen MIN_COUNT times in each half; the mean over function-word types minus that over content-word ones
    table = pd.read_parquet(tmp_path / "planted" / "causal-t2-s0" / "scores" / "wiki" / TYPE_SUMS_PARQUET)
    means = table[[f"logprob_sum_probe{k}" for k in range(4)]].div(table["count"], axis=0)
    table["preference"] = ((means.iloc[:, 0] - means.iloc[:, 2]) + (means.iloc[:, 1] - means.iloc[:, 3])) / 2
    seen = table.groupby("token_id").filter(lambda rows: len(rows) == 2 and (rows["count"] >= MIN_COUNT).all())
    preference = seen.groupby("token_id")["preference"].mean()
    is_function = preference.index.map(TYPE_TAGS).isin(["DET", "ADP"])
    d = preference[is_function].mean() - preference[~is_function].mean()
    signs = endpoint["signs"]["cooperative, shared embedding"]
    assert signs["d_nats"][0] == pytest.approx(d, rel=1e-9)
    assert d == pytest.approx(1.5, abs=0.3)
    assert signs["num_positive"] == 3 and signs["num_runs"] == 3

    null = analysis(tmp_path / "null", 0.0)
    assert null["verdict"]["syntax_reading"] == "not supported at this scale"
    # untagged texts leave endpoint 3 out, and the reading with it
    untagged = analysis(tmp_path / "untagged", 1.5, type_tag_table_of=lambda text, tokenizer_file: None)
    assert "part_of_speech_z" not in untagged["points"][-1]["endpoints"]
    assert untagged["verdict"]["syntax_reading"] is None


def test_explanation_words_follow_the_preregistered_rules():
    def effects(cooperation, embedding, interaction):
        return {name: {"value": (ci[0] + ci[1]) / 2, "ci": ci}
                for name, ci in zip(("cooperation", "embedding", "interaction"), (cooperation, embedding, interaction))}
    null = [-0.1, 0.1]
    assert explanation({"a": effects([0.1, 0.3], null, null), "b": effects([-0.1, 0.3], null, null)}, "a") == "cooperation"
    assert explanation({"a": effects([0.1, 0.3], null, null), "b": effects([-0.3, 0.1], null, null)}, "a") \
        == "none of the pre-registered answers"
    assert explanation({"a": effects(null, [-0.4, -0.1], null)}, "a") == "embedding sharing"
    assert explanation({"a": effects([0.1, 0.3], null, [0.05, 0.2])}, "a") == "interaction"
    assert explanation({"a": effects(null, null, null)}, "a") == "neither"


def test_families_that_do_not_cross_are_no_factorial(tmp_path):
    study = study_of({name: cell for name, cell in FAMILIES.items() if name != "causal_separate"})
    assert factorial_analysis(planted_study(tmp_path, lambda c, e: 0.5, seeds=1), tmp_path, study) is None
    # a family that differs in more than the two factors (another width) stays out of the 2x2
    study = study_of()
    study.families["causal_w128"] = dataclasses.replace(study.families["causal"], overrides={"hidden_size": 128})
    assert set(family_factors(study)) == set(FAMILIES)
