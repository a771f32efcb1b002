"""The measure contract (tower_preference/preference_measure.py) over every registered measure: each declares every
part, and the registry is what the scoring command, the per-token table and the study read."""

import dataclasses

import numpy as np
import pytest

from twotower.evaluation.scoring import report, score
from twotower.evaluation.study import driver
from twotower.evaluation.tower_preference.measure_agreement import DECODABLE, RELIED_ON
from twotower.evaluation.tower_preference.measures import MEASURES, PROBE_FREE_MEASURES, PROBE_MEASURE
from twotower.evaluation.tower_preference.preference_measure import PreferenceMeasure, TowerIntervention
from twotower.evaluation.tower_preference.preference_stats import PreferenceAccumulator

WORDS = ("name", "label", "method", "question", "report_heading")


@pytest.mark.parametrize("measure", MEASURES, ids=lambda measure: measure.name)
def test_every_measure_declares_every_part(measure):
    for attribute in WORDS:
        assert isinstance(getattr(measure, attribute), str) and getattr(measure, attribute), attribute
    assert measure.question in (DECODABLE, RELIED_ON)
    descriptions = measure.summary_key_descriptions
    assert descriptions and all(isinstance(text, str) and text for text in descriptions.values())
    assert set(measure.study_reads) <= set(descriptions)  # the study reads declared, described keys only
    for part in ("consumer", "space_values"):  # the contract's methods, each the measure's own
        assert getattr(type(measure), part) is not getattr(PreferenceMeasure, part), part
    if measure is not PROBE_MEASURE:
        assert isinstance(measure, TowerIntervention) and measure.report_section
        fields = {field.name: field for field in dataclasses.fields(score.ScoringArguments)}
        assert fields[measure.option].default is True and measure.option in score.SETTINGS_FIELDS


def test_measure_names_are_unique_and_the_probes_come_first():
    names = [measure.name for measure in MEASURES]
    assert len(set(names)) == len(names)
    assert MEASURES[0] is PROBE_MEASURE and PROBE_FREE_MEASURES == MEASURES[1:]
    assert driver.SUMMARY_FIELDS == PROBE_MEASURE.study_reads


def test_the_per_token_table_has_the_columns_of_every_measure_given():
    rng = np.random.default_rng(0)
    token_ids = rng.integers(0, 6, 200)

    def result():
        accumulator = PreferenceAccumulator(num_towers=2)
        accumulator.update(token_ids, -rng.gamma(2.0, 1.0, (2, token_ids.size)))  # log-probabilities, < 0
        return accumulator.compute(min_count=5)

    probes = result()
    measured = {measure.name: result() for measure in PROBE_FREE_MEASURES}
    table = report.per_token_table(probes, [f"t{i}" for i in probes.token_ids], measured)
    for name, measure_result in measured.items():
        np.testing.assert_array_equal(table[f"{name}_preference_nats_tower0"], measure_result.preference_nats[0])
        np.testing.assert_array_equal(table[f"{name}_significant"], measure_result.significant)
        np.testing.assert_array_equal(table[f"{name}_p_value"], measure_result.p_value)
