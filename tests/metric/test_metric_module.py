"""The `evaluate` module in evaluation/tower_preference: offline load, compute/add_batch, doctests, Space files."""

import doctest
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")  # before evaluate reads its config

import evaluate  # noqa: E402

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM  # noqa: E402
from twotower.evaluation import compute_preference  # noqa: E402
from twotower.evaluation.scoring.ablation import MeanAblation  # noqa: E402


REPO_ROOT = Path(__file__).resolve().parents[2]
METRIC_DIR = REPO_ROOT / "evaluation" / "tower_preference"
CARD_SECTIONS = (
    "## Metric Description",
    "## How to Use",
    "### Inputs",
    "### Output Values",
    "#### Values from Popular Papers",
    "### Examples",
    "## Limitations and Bias",
    "## Citation",
    "## Further References",
)


@pytest.fixture
def tower_preference(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO_ROOT)  # the docstring examples load the module by its path from the repository root
    # a cache folder per test: a compute that raised keeps its cache-file lock, which would stall the next load
    return evaluate.load("evaluation/tower_preference", cache_dir=str(tmp_path))


def predictions(num_predictions=400, vocab_size=12, seed=0):
    """token ids [n] and per-prediction rows of two towers' log-probs [n, towers], as the metric takes them."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(0, vocab_size, num_predictions)
    gold_logprobs = -rng.uniform(0.5, 6.0, (num_predictions, 2))
    return token_ids.tolist(), gold_logprobs.tolist()


def test_load_copies_the_core_beside_the_script(tower_preference):
    # evaluate copies relatively imported sibling files into its module cache: the Space is self-contained
    module_file = Path(sys.modules[type(tower_preference).__module__].__file__)
    for core in ("preference_stats.py", "replica_preference.py", "moderation.py", "reliability.py", "comparisons.py"):
        assert (module_file.parent / core).read_text() == (METRIC_DIR / core).read_text()


def test_compute_equals_the_core(tower_preference):
    token_ids, gold_logprobs = predictions()
    results = tower_preference.compute(
        token_ids=token_ids, gold_logprobs=gold_logprobs, min_count=5, top_k=4, alpha=0.1
    )
    expected = compute_preference(token_ids, np.asarray(gold_logprobs).T, min_count=5, top_k=4, alpha=0.1)
    assert results == expected.to_dict()
    assert results["num_predictions"] == 400 and len(results["token_ids"]) == results["num_token_types"]


def test_centered_compute_equals_the_core(tower_preference):
    token_ids, gold_logprobs = predictions(seed=2)
    gold_logprobs = np.asarray(gold_logprobs) - [0.0, 0.5]  # [n, towers]: tower 1 worse overall
    results = tower_preference.compute(
        token_ids=token_ids, gold_logprobs=gold_logprobs.tolist(), min_count=5, center=True
    )
    expected = compute_preference(token_ids, gold_logprobs.T, min_count=5, center=True)
    assert results == expected.to_dict()
    mean_difference = gold_logprobs[:, 0].mean() - gold_logprobs[:, 1].mean()
    assert results["centered"] and results["global_offset_nats"][0] == pytest.approx(mean_difference, abs=1e-12)
    raw = compute_preference(token_ids, gold_logprobs.T, min_count=5)
    assert results["preference_nats"] != raw.preference_nats.tolist()


def test_add_batch_equals_one_compute(tower_preference):
    token_ids, gold_logprobs = predictions(seed=1)
    for start in range(0, len(token_ids), 150):
        batch = slice(start, start + 150)
        tower_preference.add_batch(token_ids=token_ids[batch], gold_logprobs=gold_logprobs[batch])
    batched = tower_preference.compute(min_count=5)
    assert batched == tower_preference.compute(token_ids=token_ids, gold_logprobs=gold_logprobs, min_count=5)


def replica_predictions(num_predictions=600, vocab_size=15, seed=3):
    """token ids [n] and per-prediction rows of 3 probes of each of two towers [n, probes] (tower-major)."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(0, vocab_size, num_predictions)
    probe_bias = rng.normal(0.0, 0.3, (6, vocab_size))  # [probes, types]
    gold_logprobs = -rng.uniform(2.0, 6.0, num_predictions) + probe_bias[:, token_ids] - 0.5  # [probes, n]
    return token_ids.tolist(), np.minimum(gold_logprobs, 0.0).T.tolist()


@pytest.mark.parametrize("probe_runs", [None, [0, 1, 2, 0, 1, 2]], ids=["unpaired", "paired"])
def test_replica_compute_equals_the_core(tower_preference, probe_runs):
    token_ids, gold_logprobs = replica_predictions()
    probe_towers = [0, 0, 0, 1, 1, 1]
    options = dict(min_count=5, top_k=4, center=True, probe_towers=probe_towers, probe_runs=probe_runs)
    for start in range(0, len(token_ids), 250):  # batch by batch, as in an evaluation loop
        batch = slice(start, start + 250)
        tower_preference.add_batch(token_ids=token_ids[batch], gold_logprobs=gold_logprobs[batch])
    results = tower_preference.compute(**options)
    expected = compute_preference(token_ids, np.asarray(gold_logprobs).T, **options)
    assert results == expected.to_dict()
    assert results["test"] == "replica" and results["paired"] == (probe_runs is not None)
    assert results["probe_runs"] == probe_runs and np.shape(results["probe_mean_logprob"]) == (6, 15)
    assert -1.0 < results["reliability"] <= 1.0 and len(results["reliability_ci"]) == 2


def test_compute_without_probe_towers_has_no_replica_keys(tower_preference):
    token_ids, gold_logprobs = predictions(seed=3)
    results = tower_preference.compute(token_ids=token_ids, gold_logprobs=gold_logprobs, min_count=5)
    assert not {"test", "reliability", "occurrence_p_value", "probe_mean_logprob"} & results.keys()


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0, -2.0], [-1.0]]), "one log-probability per tower"),
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0], [-1.0]]), "at least 2 towers"),
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0, 0.2], [-1.0, -1.0]]), "must be log-probabilities"),
        (dict(token_ids=[1, -100], gold_logprobs=[[-1.0, -2.0], [-1.0, -1.0]]), "must be >= 0"),
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0, float("nan")], [-1.0, -1.0]]), "must be finite"),
        (dict(token_ids=[], gold_logprobs=[]), "token_ids is empty"),
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0] * 3] * 2, probe_towers=[0, 0, 1]), "at least 2 probe replicas"),
        (dict(token_ids=[1, 2], gold_logprobs=[[-1.0] * 4] * 2, probe_runs=[0, 1, 0, 1]), "needs probe_towers"),
    ],
    ids=["ragged", "one-tower", "positive", "negative-id", "nan", "empty", "one-replica", "runs-without-towers"],
)
def test_bad_input_raises_a_clear_error(tower_preference, inputs, message):
    with pytest.raises(ValueError, match=message):
        tower_preference.compute(**inputs)


GOLD = [[-1.0, -2.0], [-3.0, -1.0], [-1.2, -2.1], [-3.1, -0.8]]


@pytest.mark.parametrize(
    "token_ids, message",
    [
        ([1.5, 2, 1, 2], r"got 1.5 \(float\) at prediction 0"),  # the int64 feature truncated it to 1
        ([1, 2.0, 1, 2], r"got 2.0 \(float\) at prediction 1"),
        ([1, "2", 1, 2], r"got '2' \(str\) at prediction 1"),  # the feature read it as 2
        (["a", "b", "c", "d"], r"got 'a' \(str\) at prediction 0"),
        ([True, False, True, False], r"got True \(bool\) at prediction 0"),  # the feature read it as 1
        ([1, None, 1, 2], r"got None \(NoneType\) at prediction 1"),
        ([[1, 2], [3], [1], [2]], "flat list of integers"),
        ([[1], [2], [1], [2]], r"flat list of integers.*shape \(4, 1\)"),
        (np.array([1.0, 2.0, 1.0, 2.0]), r"got 1.0 \(float\) at prediction 0"),
    ],
    ids=["float", "integral-float", "digit-string", "string", "bool", "none", "ragged", "nested", "float-array"],
)
def test_non_integer_token_ids_are_refused(tower_preference, token_ids, message):
    with pytest.raises(ValueError, match=f"token_ids must be .*{message}"):
        tower_preference.compute(token_ids=token_ids, gold_logprobs=GOLD, min_count=2)


def test_one_prediction_at_a_time_is_checked_too(tower_preference):
    with pytest.raises(ValueError, match=r"got 2.5 \(float\) at prediction 0"):
        tower_preference.add(token_ids=2.5, gold_logprobs=GOLD[0])


def test_integer_token_ids_of_any_integer_type_are_accepted(tower_preference):
    expected = tower_preference.compute(token_ids=[11, 12, 11, 12], gold_logprobs=GOLD, min_count=2)
    for token_ids in (np.array([11, 12, 11, 12], dtype=np.int32), np.array([11, 12, 11, 12], dtype=np.uint16)):
        assert tower_preference.compute(token_ids=token_ids, gold_logprobs=GOLD, min_count=2) == expected
    assert expected["token_ids"] == [11, 12] and expected["count"] == [2, 2]


def test_text_log_probabilities_are_refused(tower_preference):
    with pytest.raises(ValueError, match="gold_logprobs must be numbers"):
        tower_preference.compute(token_ids=[1, 2, 1, 2], gold_logprobs=[["-1.0", "-2.0"]] * 4, min_count=2)


def test_untrained_probes_are_refused_and_trained_ones_scored(tower_preference, tmp_path):
    config = TwoTowerConfig.from_preset("tiny", vocab_size=64)
    inputs = dict(token_ids=[11, 12, 11, 12], gold_logprobs=GOLD, min_count=2)
    expected = tower_preference.compute(**inputs)
    for model_config in (config, config.to_dict()):
        with pytest.raises(ValueError, match="untrained probes.*--recipe tiny_probe --pretrained_model MODEL_DIR"):
            tower_preference.compute(**inputs, model_config=model_config)
    config.save_pretrained(tmp_path)  # a folder, as a pretrain run saves it (its training config says so too)
    (tmp_path / "training_config.yaml").write_text("phase: pretrain\n")
    with pytest.raises(ValueError, match=f"{tmp_path} has untrained probes.*--pretrained_model {tmp_path} "):
        tower_preference.compute(**inputs, model_config=str(tmp_path))
    (tmp_path / "training_config.yaml").write_text("phase: probe\n")  # saved by a probe phase before the record
    assert tower_preference.compute(**inputs, model_config=tmp_path) == expected
    config.probe_training_steps = 250  # what the probe phase records now
    assert tower_preference.compute(**inputs, model_config=config) == expected
    assert json.loads(config.to_json_string())["probe_training_steps"] == 250


def test_docstring_examples(tower_preference):
    module = sys.modules[type(tower_preference).__module__]
    failures, attempted = doctest.testmod(module, raise_on_error=False)
    assert attempted > 0 and failures == 0


def test_card_replica_examples_run(tower_preference):
    # the card's examples with probe replicas are doctests too: they must print what the card says
    card = (METRIC_DIR / "README.md").read_text()
    blocks = [block.split("```")[0] for block in card.split("```python\n")[1:]]
    examples = "".join(block for block in blocks if "probe_towers=[0, 0, 0, 1, 1, 1]" in block and ">>>" in block)
    test = doctest.DocTestParser().get_doctest(examples, {"tower_preference": tower_preference}, "card", None, 0)
    failures, attempted = doctest.DocTestRunner().run(test)
    assert attempted > 10 and failures == 0


def test_folder_is_an_evaluate_space():
    card = (METRIC_DIR / "README.md").read_text()
    _, header, body = card.split("---\n", 2)
    metadata = yaml.safe_load(header)
    assert metadata["sdk"] == "gradio" and metadata["app_file"] == "app.py"
    assert {"evaluate", "metric"} <= set(metadata["tags"])
    assert all(section in body for section in CARD_SECTIONS)
    requirements = (METRIC_DIR / "requirements.txt").read_text().split()
    assert all(package in requirements for package in ("numpy", "pyyaml")) and "evaluate>=0.4.6" in requirements
    # The Space runs the gradio of its sdk_version, pinned alike in requirements.txt, at or past the fix of every
    # advisory known against gradio (the latest: GHSA-j36p-7w88-g82j, fixed in 6.16.0).
    assert f"gradio=={metadata['sdk_version']}" in requirements
    assert tuple(int(part) for part in str(metadata["sdk_version"]).split(".")) >= (6, 16, 0)
    # evaluate's launch_gradio_widget builds gr.inputs.Dataframe, which gradio removed in 4.0: the app builds its own
    app = (METRIC_DIR / "app.py").read_text()
    assert "launch_gradio_widget" not in app and "gr.Interface(" in app


def test_the_metric_takes_ablation_increases_for_the_ablation_preference(tower_preference):
    # the mean-ablation preference through the metric: each tower's loss increase in place of a log-probability,
    # less the largest at each prediction (<= 0), as evaluation/scoring/ablation.py feeds its accumulator
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=30, hidden_size=16, num_attention_heads=2,
                                        intermediate_size=37, max_position_embeddings=16)  # fmt: skip
    model = TwoTowerForCausalLM(config).eval()
    features, targets = torch.randn(2, 300, 16), torch.randint(0, 30, (300,))
    ablation = MeanAblation(features.mean(dim=1), vocab_size=30)
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(model.joint_logits(features.unsqueeze(1))[0], targets, reduction="none")
        ablation.update(model, features, targets)
        increases = []
        for tower in (0, 1):
            ablated = features.clone()
            ablated[tower] = features[tower].mean(dim=0)
            logits = model.lm_head.joint_logits(ablated.unsqueeze(1))[0]
            increases.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none") - nll)
    increases = torch.stack(increases).double().numpy()  # [towers, n]
    shifted = (increases - increases.max(axis=0)).T.tolist()  # [n, towers], as the metric takes them
    results = tower_preference.compute(token_ids=targets.tolist(), gold_logprobs=shifted, min_count=5)
    expected = ablation.accumulator.compute(min_count=5).to_dict()
    np.testing.assert_allclose(results["preference_nats"], expected["preference_nats"], rtol=1e-5, atol=1e-6)
    assert results["significant"] == expected["significant"]
