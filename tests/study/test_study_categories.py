"""The study's categories, compared after a dominant tower's offset is removed."""

import numpy as np
import pandas as pd

from twotower.evaluation.study.categories import without_type_offset
from twotower.evaluation.scoring.token_categories import category_preferences


def dominated_table(seed=0):
    """200 eligible types whose tower 0 is better by 0.75 nats at every type (a dominant tower), category "a" leaning
    a further 0.2 nats to tower 0 and category "b" 0.2 nats to tower 1; each type seen 10 to 999 times."""
    rng = np.random.default_rng(seed)
    categories = np.repeat(["a", "b"], 100)
    preference = 0.75 + np.where(categories == "a", 0.2, -0.2) + rng.normal(0, 0.05, 200)
    table = pd.DataFrame({
        "token_id": np.arange(200), "count": rng.integers(10, 1000, 200), "eligible": True,
        "significant": False, "preference_nats_tower0": preference, "preference_nats_tower1": -preference,
        "preferred_tower": np.where(preference > 0, 0, 1),
    })  # fmt: skip
    return table, categories


def test_a_dominant_tower_no_longer_makes_every_category_lean_to_it():
    table, categories = dominated_table()
    before = category_preferences(table, categories).set_index("category")
    assert (before["num_preferring_tower0"] == 100).all()  # every type prefers the dominant tower

    recentered = without_type_offset(table)
    median = np.median(table["preference_nats_tower0"])
    np.testing.assert_allclose(recentered["preference_nats_tower0"], table["preference_nats_tower0"] - median)
    after = category_preferences(recentered, categories, weighted=False).set_index("category")
    assert after.loc["a", "num_preferring_tower0"] == 100 and after.loc["b", "num_preferring_tower1"] == 100
    # every type counted once: the mean of "a" is its types' mean, not pulled by how often each occurs
    a = recentered[categories == "a"]
    assert after.loc["a", "mean_preference_tower0"] == a["preference_nats_tower0"].mean()
    assert after.loc["a", "mean_preference_tower0"] != np.average(a["preference_nats_tower0"], weights=a["count"])
    assert (after["q_value"] < 1e-10).all()
