"""The report folder of a model with probe replicas: the leading "Tower or probe?" section, its plot, the table."""

import json
import re

import numpy as np
import pytest

from twotower.evaluation import compute_preference
from twotower.evaluation.scoring import report


MIN_COUNT = 5
NUM_TYPES = 80
PROBE_TOWERS, PROBE_RUNS = [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]
PERPLEXITY = {"joint": 12.5, "probes": [20.0, 21.0], "probe_replicas": [[19.5, 20.0, 20.5], [20.75, 21.0, 21.25]]}


def replica_predictions(seed, tower_nats):
    """Token ids [n] and log-probs [probes, n]: 3 probes per tower, each with its own per-type error, and a
    per-type tower effect of random sign and size tower_nats (0: probe noise alone)."""
    rng = np.random.default_rng(seed)
    token_ids = np.repeat(np.arange(NUM_TYPES), rng.integers(10, 30, NUM_TYPES))
    difficulty = -rng.uniform(4.0, 8.0, NUM_TYPES)[token_ids] + rng.normal(0.0, 1.0, token_ids.shape[0])
    effect = rng.choice([-tower_nats, tower_nats], NUM_TYPES) / 2  # tower 0 gains it, tower 1 loses it
    per_type = np.where(np.array(PROBE_TOWERS)[:, None] == 0, effect, -effect) + rng.normal(0.0, 0.2, (6, NUM_TYPES))
    gold_logprobs = difficulty + per_type[:, token_ids] + rng.normal(0.0, 0.3, (6, token_ids.shape[0]))
    return token_ids, gold_logprobs


def write(output_dir, result, perplexity=PERPLEXITY):
    metadata = {
        "model": {"path": "planted"},
        "data": {"description": "planted predictions", "num_blocks": 1, "block_size": 32},
        "settings": {},
        "perplexity": perplexity,
    }
    report.write_report(output_dir, metadata, result, [f"tok{token_id}" for token_id in result.token_ids])
    return (output_dir / report.REPORT_MD).read_text()


@pytest.fixture(scope="module")
def replica_report(tmp_path_factory):
    token_ids, gold_logprobs = replica_predictions(0, tower_nats=0.8)
    result = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, top_k=3, probe_towers=PROBE_TOWERS, probe_runs=PROBE_RUNS
    )
    output_dir = tmp_path_factory.mktemp("replica")
    return {"result": result, "output_dir": output_dir, "markdown": write(output_dir, result)}


def unpadded(markdown):
    """Markdown with the padding of table cells removed: `| a    | b |` reads `| a | b |`."""
    return re.sub(r" +\|", " |", markdown)


def section(markdown, heading):
    """The text of a report.md section, from its heading to the next one."""
    return markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_tower_or_probe_leads_with_the_summary_numbers(replica_report):
    markdown, summary = replica_report["markdown"], replica_report["result"].summary
    headings = re.findall(r"^## (.+)$", markdown, flags=re.MULTILINE)
    occurrence_heading = "Occurrence-level statistics (they do not account for probe noise)"
    assert headings[:4] == ["Perplexity", "Tower or probe?", "Preference", occurrence_heading]
    leading = section(markdown, "Tower or probe?")
    low, high = summary["reliability_ci"]
    assert f": {summary['reliability']:.3f}, 95% CI {low:.3f} to {high:.3f};" in leading
    assert f"it would be {summary['reliability_single_probe']:.3f}" in leading
    assert (
        f"{summary['num_significant']} of {summary['num_eligible_types']} eligible types "
        f"({summary['significant_share']:.3f})" in leading
    )
    assert (
        f"two-tower difference {summary['two_tower_difference_nats']:.3f} nats against a same-tower floor of "
        f"{summary['same_tower_floor_nats']:.3f} nats" in leading
    )
    assert summary["reliability"] > report.RELIABLE_PREFERENCE and "reproducibly decodable from the towers" in leading
    assert f"]({report.REPLICA_PLOTS['preference_vs_floor']})" in leading
    # the occurrence-level significance sits under its own heading, with the occurrence-level numbers
    occurrence = section(markdown, headings[3])
    assert f"{summary['occurrence_num_significant']} types ({summary['occurrence_significant_share']:.3f}" in occurrence
    assert "split-half consistency" in occurrence and "split-half" not in section(markdown, "Preference")


def test_perplexity_of_every_replica(replica_report):
    table = section(replica_report["markdown"], "Perplexity")
    assert "| probes of tower 0 | 20.00 | 19.50, 20.00, 20.50 |" in unpadded(table)
    assert "| probes of tower 1 | 21.00 | 20.75, 21.00, 21.25 |" in unpadded(table)


def test_floor_plot_and_summary_are_written(replica_report):
    output_dir = replica_report["output_dir"]
    for name in [*report.PLOTS.values(), *report.REPLICA_PLOTS.values()]:
        assert (output_dir / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    written = json.loads((output_dir / report.PREFERENCE_JSON).read_text())
    assert written["summary"] == json.loads(json.dumps(replica_report["result"].summary))
    assert written["perplexity"] == PERPLEXITY


def test_per_token_table_round_trips(replica_report):
    result = replica_report["result"]
    _, table = report.load_report(replica_report["output_dir"])

    # probe columns do not count as tower columns
    np.testing.assert_allclose(report.tower_columns(table, "mean_logprob"), result.mean_logprob, rtol=1e-12)
    np.testing.assert_allclose(report.tower_columns(table, "standard_error"), result.standard_error, rtol=1e-12)
    probe_mean = report.numbered_columns(table, "probe_mean_logprob_probe")
    np.testing.assert_allclose(probe_mean, result.probe_mean_logprob, rtol=1e-12)
    np.testing.assert_allclose(table["occurrence_p_value"], result.occurrence_p_value, rtol=1e-12)
    np.testing.assert_array_equal(table["occurrence_significant"], result.occurrence_significant)
    for column in ("two_tower_difference", "same_tower_difference"):
        expected = getattr(result, f"{column}_per_type_nats")
        np.testing.assert_allclose(table[f"{column}_nats"], expected, rtol=1e-12)
    np.testing.assert_allclose(table["p_value"], result.p_value, rtol=1e-12)
    token_ids, preference, tokens = report.eligible_preferences(table)
    np.testing.assert_allclose(preference, result.preference_nats[:, result.eligible], rtol=1e-12)
    assert tokens == [f"tok{token_id}" for token_id in token_ids]


def test_probe_noise_alone_reads_as_probe_noise(tmp_path):
    token_ids, gold_logprobs = replica_predictions(1, tower_nats=0.0)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=PROBE_TOWERS)
    low, _ = result.summary["reliability_ci"]
    assert low <= 0.0 and result.summary["num_significant"] == 0
    leading = section(write(tmp_path, result), "Tower or probe?")
    assert "independent replicas" in leading and "the per-type preference below is probe noise" in leading
    assert f"0 of {result.summary['num_eligible_types']} eligible types" in leading


def test_a_reliable_preference_with_two_runs_explains_why_no_type_passes(tmp_path):
    # two paired runs: a real but small effect is reliable over types, while each type has 1 residual df
    token_ids, gold_logprobs = replica_predictions(2, tower_nats=0.3)  # this seed's prior has finite df
    two_runs = [0, 1, 3, 4]  # runs 0 and 1 of both towers
    result = compute_preference(
        token_ids, gold_logprobs[two_runs], min_count=MIN_COUNT, probe_towers=[0, 0, 1, 1], probe_runs=[0, 1, 0, 1]
    )
    summary = result.summary
    assert summary["residual_df"] == 1 and summary["reliability_ci"][0] > 0.0 and summary["num_significant"] == 0
    leading = section(write(tmp_path, result, {"joint": 12.5, "probes": [20.0, 21.0]}), "Tower or probe?")
    assert "No single type passes the per-type test" in leading
    assert f"1 degree(s) of freedom (and {summary['prior_df']:.1f} borrowed from the other types)" in leading


def test_one_probe_per_tower_keeps_the_plain_report(tmp_path):
    token_ids, gold_logprobs = replica_predictions(2, tower_nats=0.8)
    tower_mean = np.stack([gold_logprobs[:3].mean(axis=0), gold_logprobs[3:].mean(axis=0)])
    result = compute_preference(token_ids, tower_mean, min_count=MIN_COUNT)
    markdown = write(tmp_path, result, {"joint": 12.5, "probes": [20.0, 21.0]})

    assert "Tower or probe?" not in markdown and "Occurrence-level" not in markdown
    assert "| probe of tower 0 | 20.00 |" in unpadded(markdown)
    assert "split-half consistency" in section(markdown, "Preference")
    assert not (tmp_path / report.REPLICA_PLOTS["preference_vs_floor"]).exists()
    _, table = report.load_report(tmp_path)
    assert "occurrence_p_value" not in table.columns
    np.testing.assert_allclose(report.tower_columns(table, "mean_logprob"), result.mean_logprob, rtol=1e-12)
