"""The long-run check's rows: each family followed along its trajectory, cooperative against control."""

import math

import pytest

from twotower.evaluation.study import StudyConfig
from twotower.evaluation.study_long_run import difference_interval, long_run_rows, long_run_table

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


def test_a_point_the_control_has_not_reached_is_left_out(study):
    summaries = [summary("causal", [point(1000, 5.0, 0.8, [0.7, 0.9], 0.5), point(2000, 4.5, 0.8, [0.7, 0.9], 0.5)]),
                 summary("control", [point(1000, 5.2, 0.3, [0.2, 0.4], 0.2)])]  # fmt: skip
    assert [row["step"] for row in long_run_rows(summaries, TEXT, study)] == [1000]


def test_no_interval_without_both_arms_intervals():
    assert difference_interval({"reliability": 0.5, "reliability_ci": [None, None]},
                               {"reliability": 0.2, "reliability_ci": [0.1, 0.3]}) == (None, None)
