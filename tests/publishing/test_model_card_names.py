"""Names on the model card come from the run: the towers in the words of the model's own layout, and datasets by
Hub id only when they are on the Hub."""

import pytest

from modeling_twotower.towers import TOWER_KINDS
from twotower.evaluation.publishing.model_card import card_data, card_tower_name

LAYOUTS = sorted({layout for kind in TOWER_KINDS.values() for layout in kind.layouts})


def test_a_tower_name_on_the_card_names_no_layout_but_the_models():
    """Over every kind, layout and direction it builds: a "<layout>-style" left in the name is the model's own
    layout's, and nothing else of the kind's name is lost."""
    seen = set()
    for kind in TOWER_KINDS.values():
        for layout in kind.layouts:
            stack = kind.stack_class(layout)
            for bidirectional in stack.directions:
                full = stack.card_names[bidirectional]
                name = card_tower_name(full, layout)
                assert name in (full, full.rsplit(" (", 1)[0])  # whole, or less its last parenthesis
                assert [other for other in LAYOUTS if f"{other}-style" in name.lower() and other != layout] == []
                seen.add((kind.tower_type, layout, bidirectional, name))
    assert ("transformer", "bert", False, "causal transformer") in seen  # was "(GPT-style)"
    assert ("transformer", "gpt", False, "causal transformer (GPT-style)") in seen
    assert ("ssm", "bert", False, "causal selective state-space (Mamba-style)") in seen  # a kind's style, kept


FAMILY = {"objective": "causal", "pipeline_tag": "text-generation", "tags": ["twotower"]}
REPORT = {"perplexity": {"joint": 30.0, "probes": [35.0, 36.0]}, "data": {"split": "validation"}}


@pytest.mark.parametrize("data_config, dataset_id, expected", [
    ({"train_file": "/data/tiny-shakespeare/train.txt", "dataset_name": "wikitext"}, None, None),
    ({"train_file": None, "dataset_name": "wikitext", "dataset_config_name": "wikitext-2-raw-v1"}, None, "wikitext"),
    ({"train_file": "/data/wikitext-2/train.txt", "dataset_name": "wikitext"}, "Salesforce/wikitext",
     "Salesforce/wikitext"),
])  # fmt: skip
def test_datasets_are_named_by_hub_id_only(data_config, dataset_id, expected):
    """Local text (the main job's tiny-shakespeare) lists no dataset, and so no model-index; a Hub dataset, or one
    named with --dataset_id, is listed with the perplexities under its id."""
    metadata = card_data(FAMILY, data_config, REPORT, "tiny", language="en", license="mit",
                         dataset_id=dataset_id).to_dict()  # fmt: skip
    assert metadata.get("datasets") == (None if expected is None else [expected])
    if expected is None:
        assert "model-index" not in metadata
    else:
        results = metadata["model-index"][0]["results"]
        assert {result["dataset"]["type"] for result in results} == {expected}
        assert [metric["value"] for result in results for metric in result["metrics"]] == [30.0, 35.0, 36.0]
