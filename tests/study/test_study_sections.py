"""The study's long-run check (each family followed along its trajectory) and size grid (each family against each of
its controls)."""

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from twotower.evaluation.study.config import StudyConfig
from twotower.evaluation.study.cross_fit import ablation_over_seeds, cross_fit_verdicts, size_grid_rows, t_interval
from twotower.evaluation.study.long_run import PENDING, difference_interval, long_run_rows, long_run_table

TEXT = "wiki"


def point(step, loss, reliability, ci, cross_fitted_r):
    scores = {"reliability": reliability, "reliability_ci": ci, "cross_fit": {"cross_fitted_r": cross_fitted_r},
              "ablation": {"correlation_with_probe_preference": 0.3}}
    return {"step": step, "pretrain_validation": {"loss": loss}, "scores": {TEXT: scores}}


def summary(family, trajectory):
    return {"run": {"family": family, "seed": 0, "name": f"{family}-t2-s0"}, "trajectory": trajectory}


@pytest.fixture
def study():
    return StudyConfig(
        train_file="t", validation_file="v", eval_texts={TEXT: {"file": "x"}}, long_run=True,
        families={"causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe"},
                  "control": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "control_of": "causal"}},
        grid=[{"family": "causal"}, {"family": "control"}], trajectory=[0.25, 0.5, 1.0],
        probe={"probe_replicas": 4},
    )  # fmt: skip


def test_each_doubling_gives_its_loss_drop_difference_and_words(study):
    summaries = [
        summary("causal", [point(1000, 5.0, 0.80, [0.76, 0.84], 0.5), point(2000, 4.5, 0.85, [0.82, 0.88], 0.55),
                           point(4000, 4.41, 0.84, [0.80, 0.88], 0.6)]),
        summary("control", [point(1000, 5.2, 0.30, [0.20, 0.40], 0.2), point(2000, 4.8, 0.05, [0.00, 0.09], 0.05),
                            point(4000, 4.7, 0.83, [0.78, 0.88], 0.6)]),
    ]  # fmt: skip
    rows = long_run_rows(summaries, TEXT, study)
    assert [row["step"] for row in rows] == [1000, 2000, 4000] and [row["multiple"] for row in rows] == [1, 2, 4]
    assert rows[0]["relative_drop"] is None
    assert rows[1]["relative_drop"] == pytest.approx(0.1) and rows[2]["relative_drop"] == pytest.approx(0.02)
    # 0.80 - 0.30, the half-widths 0.04 and 0.10 in quadrature
    assert rows[0]["difference"] == pytest.approx(0.5)
    assert rows[0]["difference_ci"] == pytest.approx([0.5 - math.hypot(0.04, 0.10), 0.5 + math.hypot(0.04, 0.10)])
    assert [row["conclusion"] for row in rows] == [
        "more reliable with cooperation", "emerges from cooperation", "no difference shown"
    ]
    assert rows[1]["cross_fitted_r"] == 0.55 and rows[1]["control_cross_fitted_r"] == 0.05
    table = long_run_table(rows)
    assert table["drop since last"].tolist() == ["", "10.0%", "2.0%"]
    assert table["cross-fitted r"].tolist()[1] == "0.55 / 0.05"


def test_a_point_the_control_has_not_reached_shows_the_cooperative_arm_alone(study):
    summaries = [summary("causal", [point(1000, 5.0, 0.8, [0.7, 0.9], 0.5), point(2000, 4.5, 0.8, [0.7, 0.9], 0.5)]),
                 summary("control", [point(1000, 5.2, 0.3, [0.2, 0.4], 0.2)])]  # fmt: skip
    rows = long_run_rows(summaries, TEXT, study)
    assert [row["step"] for row in rows] == [1000, 2000]
    assert rows[1]["relative_drop"] == pytest.approx(0.1) and rows[1]["reliability"] == 0.8
    assert rows[1]["control_reliability"] is None and rows[1]["difference"] is None
    assert [row["conclusion"] for row in rows] == ["more reliable with cooperation", PENDING]
    assert long_run_table(rows)["control reliability"].tolist() == ["0.300 [0.200, 0.400]", "n/a"]
    # without any control run (still pretraining) every point is the cooperative arm's alone
    assert [row["conclusion"] for row in long_run_rows(summaries[:1], TEXT, study)] == [PENDING, PENDING]


def test_no_interval_without_both_arms_intervals():
    assert difference_interval({"reliability": 0.5, "reliability_ci": [None, None]},
                               {"reliability": 0.2, "reliability_ci": [0.1, 0.3]}) == (None, None)


def kept_run(runs_dir, name, seed, cross_fitted_r, rng):
    """A kept run's preference.json (cross-fitted, disjoint replicas) and per-token table, as the study keeps them."""
    folder = runs_dir / name / "scores" / TEXT
    folder.mkdir(parents=True)
    report = {"cross_fit": {"cross_fitted_r": cross_fitted_r, "same_probes_other_text_r": 0.6,
                            "other_probes_same_text_r": 0.7, "num_types": 50, "probe_replica_data": "disjoint"},
              "summary": {"global_offset_nats": [0.01, -0.01]}, "ablation": {"mean_increase_nats": [0.3, 0.2]}}  # fmt: skip
    (folder / "preference.json").write_text(json.dumps(report))
    probe = rng.normal(0, 1, 50)
    table = pd.DataFrame({"token_id": range(50), "eligible": True, "preference_nats_tower0": probe,
                          "preference_nats_tower1": -probe, "ablation_preference_nats_tower0": probe + rng.normal(0, 1, 50),
                          "ablation_preference_nats_tower1": 0.0})  # fmt: skip
    (folder / "preference_per_token.csv.gz").write_bytes(gzip.compress(table.to_csv(index=False).encode()))
    return {"run": {"family": name.split("-")[0], "seed": seed, "name": name}, "scores": {TEXT: {}}}


def test_the_size_grid_pairs_each_family_with_each_control_by_seed(tmp_path):
    study = StudyConfig(
        train_file="t", validation_file="v", eval_texts={TEXT: {"file": "x"}}, probe={"probe_replicas": 4},
        families={
            "causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "overrides": {"hidden_size": 128}},
            "shared": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "control_of": "causal"},
            "separate": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "control_of": "causal",
                         "overrides": {"separate_embeddings": True}},
        },
        grid=[{"family": "causal"}], pretrain={"max_train_steps": 300},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    values = {"causal": [0.5, 0.6, 0.55], "shared": [0.1, 0.0], "separate": [0.3, 0.4, 0.5]}
    summaries = [kept_run(tmp_path, f"{family}-t2-s{seed}", seed, value, rng)
                 for family, per_seed in values.items() for seed, value in enumerate(per_seed)]  # fmt: skip
    rows = {row["control_family"]: row for row in size_grid_rows(summaries, tmp_path, TEXT, study)}
    assert rows["shared"]["hidden_size"] == 128 and rows["shared"]["max_train_steps"] == 300
    assert not rows["shared"]["separate_embeddings"] and rows["separate"]["separate_embeddings"]
    # paired by seed: the shared control has seeds 0 and 1 only
    assert rows["shared"]["difference"]["seeds"] == [0, 1]
    assert rows["shared"]["difference"]["value"] == pytest.approx(np.mean([0.5 - 0.1, 0.6 - 0.0]))
    differences = [0.2, 0.2, 0.05]
    low, high = stats.t.interval(0.95, 2, loc=np.mean(differences), scale=stats.sem(differences))
    assert rows["separate"]["difference"]["ci"] == pytest.approx([low, high])

    verdict = cross_fit_verdicts(summaries, tmp_path, TEXT, study)["causal"]
    assert verdict["control_family"] == "shared" and list(verdict["other_controls"]) == ["separate"]
    assert verdict["other_controls"]["separate"]["difference"]["value"] == pytest.approx(np.mean(differences))


def test_the_t_interval_over_seeds():
    values = [0.3, 0.5, 0.4]
    half = stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / math.sqrt(3)
    result = t_interval([*values, None])  # a seed without the figure is left out
    assert result["n"] == 3 and result["value"] == pytest.approx(0.4)
    assert result["ci"] == pytest.approx([0.4 - half, 0.4 + half])
    # seeds that agree exactly: an interval of width 0, not NaN
    assert t_interval([0.25, 0.25])["ci"] == [0.25, 0.25]
    assert t_interval([0.7]) == {"value": 0.7, "ci": None, "n": 1}


def test_the_ablation_agreement_of_one_seed_keeps_its_interval_over_types():
    one_run = {"r": 0.55, "ci": [0.51, 0.59], "num_types": 1656}
    assert ablation_over_seeds([one_run, None]) == {"value": 0.55, "ci": [0.51, 0.59], "n": 1, "over": "types"}
    # from two seeds on, the interval is over seeds (t), as for every other figure
    two = ablation_over_seeds([one_run, {"r": 0.45, "ci": [0.40, 0.50], "num_types": 1656}])
    half = stats.t.ppf(0.975, 1) * stats.sem([0.55, 0.45])
    assert "over" not in two and two["ci"] == pytest.approx([0.5 - half, 0.5 + half])
    assert ablation_over_seeds([None]) == {"value": None, "ci": None, "n": 0}
