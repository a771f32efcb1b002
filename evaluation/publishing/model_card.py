"""The model card of a saved model folder: the facts it states, gathered for the top-level `model_card.md` template.

The card's prose lives in the template (rendered by huggingface_hub's ModelCard.from_template); this module only
prepares the values it reads: the model's family and architecture, each training phase's config, and the scoring
report's figures.
"""

import importlib.resources
import json
import os
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from modeling_twotower import TwoTowerConfig
from modeling_twotower.towers import tower_stack_class
from transformers import AutoTokenizer

from ..scoring.report_files import PREFERENCE_JSON

from twotower.training.arguments import RESOLVED_CONFIG_NAME
from .model_folder import check_model_folder, count_parameters, find_pretrain_config, read_yaml, safetensors_files
from .model_folder import short_path
from twotower.training.data.objectives import AUTO_CLASSES, needs_masking, objective_of
from twotower.training.utils.markdown_escape import code_span, markdown_text, markdown_url

MODEL_CARD_NAME = "model_card.md"
REPORT_DIR_IN_REPO = "evaluation"
PLOT_CAPTIONS = {  # by the report's plot names (report_files.PLOTS, REPLICA_PLOTS); any other PNG: its file name
    "logprob_scatter": "Mean log-probability of each token type under each tower's probe",
    "preference_histogram": "Distribution of the preference over token types",
    "preference_vs_frequency": "Preference against the token type's frequency",
    "preference_vs_floor": "Difference between two towers' probes against the same-tower floor, per token type",
}
TOP_TOKENS_IN_CARD = 10
TAGS = ["twotower", "two-tower", "tower-preference", "custom_code"]
PIPELINE_TAGS = {"causal": "text-generation", "masked": "fill-mask"}
TASK_NAMES = {"causal": "Causal language modeling", "masked": "Masked language modeling"}
DATA_PATH_KEYS = ("train_file", "validation_file", "tokenizer_name_or_path")  # named in the card by short_path

# what the template calls on user data (file names, dataset and model names, free text, tokens): shown as written
CARD_FUNCTIONS = {"code": code_span, "text": markdown_text, "url": markdown_url}


def model_card_template() -> Path:
    """The model card template: the copy a wheel ships in this package, else the repository's top-level file."""
    # setup.py's build step copies the top-level model_card.md into the built package, so an installed wheel
    # publishes without the source tree; a source checkout or an editable install has only the original, at the
    # repository root beside this package's folder.
    packaged = importlib.resources.files("twotower.evaluation.publishing") / MODEL_CARD_NAME
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / MODEL_CARD_NAME


def describe_family(model_config: dict) -> dict:
    """What kind of two-tower model this is: objective, towers (in their kind's own words: tower_stack.py),
    cooperation, and its Hub names and tags."""
    objective, config = objective_of(model_config), TwoTowerConfig.from_dict(model_config)
    towers, cooperative, bidirectional = tower_stack_class(config), config.cooperative, objective == "masked"
    tags = [*TAGS, "causal-lm" if objective == "causal" else "masked-lm", *towers.card_tags]
    tags += [] if cooperative else ["independent-towers-control"]
    return {
        "objective": objective,
        "kind": "causal language model" if objective == "causal" else "masked language model",
        "towers": towers.card_names[bidirectional],
        "tower_architecture": towers.card_architecture(config, bidirectional),
        "tower_sizes": [(label, getattr(config, field)) for label, field in towers.card_size_rows],
        "tower_limitation": towers.card_limitations.get(bidirectional),
        "masking": needs_masking(objective, towers),
        "cooperative": cooperative,
        "auto_class": AUTO_CLASSES[objective].__name__,
        "pipeline_tag": PIPELINE_TAGS[objective],
        "tags": tags,
    }


def phase_config(training_config: dict) -> dict:
    """One phase's resolved training config and records (`optimizer`) as the card reads them: data paths cut short."""
    config = dict(training_config)
    for key in DATA_PATH_KEYS:
        if config.get(key):
            config[key] = short_path(config[key])
    return config


def describe_architecture(model_config: dict, weight_files: list[Path], tokenizer) -> dict:
    num_parameters, num_probe_parameters = count_parameters(weight_files)
    names = ("num_towers", "hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")
    fused_hidden_size = model_config["num_towers"] * model_config["hidden_size"]
    return {
        **{name: model_config[name] for name in names},
        "layout": model_config["layout"],
        "initialization": model_config["initialization"],
        "fused_hidden_size": fused_hidden_size,
        "embedding_size": model_config["embedding_size"],
        "tokenizer_size": len(tokenizer),
        "num_parameters": num_parameters,
        "num_probe_parameters": num_probe_parameters,
        "probe_replicas": model_config["probe_replicas"],
        "probe_type": model_config["probe_type"],
        "dtype": model_config.get("dtype", "float32"),
    }


def _token_text(tokenizer, token_id: int) -> str:
    """A token as a markdown code span that shows its spaces and newlines (JSON string syntax)."""
    return code_span(json.dumps(tokenizer.decode([token_id]), ensure_ascii=False))


def describe_evaluation(report: dict, report_dir: Path, tokenizer) -> dict:
    """The card's evaluation section from a scoring report folder (preference.json and its PNG plots)."""
    summary = report["summary"]
    top_tokens = [
        [(_token_text(tokenizer, token_id), nats) for token_id, nats in zip(token_ids, preferences)]
        for token_ids, preferences in zip(summary["top_token_ids"], summary["top_preference_nats"])
    ]
    plots = [
        {
            "caption": PLOT_CAPTIONS.get(path.stem, path.stem.replace("_", " ")),
            "path": f"{REPORT_DIR_IN_REPO}/{path.name}",
        }
        for path in sorted(report_dir.glob("*.png"))
    ]
    data = dict(report.get("data", {}))
    for key in ("train_file", "validation_file"):
        if data.get(key):
            data[key] = short_path(data[key])
    return {
        "data": {"split": "validation", **data},
        "joint_perplexity": report["perplexity"]["joint"],
        "probe_perplexities": report["perplexity"]["probes"],
        "summary": summary,
        "top_tokens": [tokens[:TOP_TOKENS_IN_CARD] for tokens in top_tokens],
        "plots": plots,
        "folder": REPORT_DIR_IN_REPO,
    }


def eval_results(
    report: dict, dataset_id: str, dataset_name: str, dataset_config: str | None, split: str, objective: str = "causal"
):
    """model-index entries: the perplexity of the joint model and of each probe."""
    common = dict(
        task_type=PIPELINE_TAGS[objective],
        task_name=TASK_NAMES[objective],
        dataset_type=dataset_id,
        dataset_name=dataset_name,
        dataset_config=dataset_config,
        dataset_split=split,
        metric_type="perplexity",
    )
    perplexity = report["perplexity"]
    named_values = [("Perplexity (joint model)", perplexity["joint"])]
    named_values += [(f"Perplexity (probe of tower {idx})", value) for idx, value in enumerate(perplexity["probes"])]
    return [EvalResult(**common, metric_name=name, metric_value=round(value, 4)) for name, value in named_values]


def read_report(report_dir: str | os.PathLike) -> dict:
    """preference.json of a scoring report folder."""
    summary_file = Path(report_dir) / PREFERENCE_JSON
    if not summary_file.is_file():
        raise FileNotFoundError(
            f"--report_dir {str(report_dir)!r} has no {PREFERENCE_JSON}; pass the output folder of "
            f"`python -m twotower.evaluation.scoring.score`."
        )
    return json.loads(summary_file.read_text(encoding="utf-8"))


def card_data(
    family: dict, data_config: dict, report: dict | None, model_name: str, *, language: str, license: str,
    dataset_id: str | None,
) -> ModelCardData:
    """The card's YAML metadata; a dataset_id of None names the training data (its Hub id, or its folder)."""
    local_data = bool(data_config.get("train_file"))
    if dataset_id is None:
        dataset_id = Path(data_config["train_file"]).parent.name if local_data else data_config["dataset_name"]
    results = None
    if report is not None:
        split = report.get("data", {}).get("split", "validation")
        dataset_config = None if local_data else data_config.get("dataset_config_name")
        results = eval_results(report, dataset_id, dataset_id, dataset_config, split, family["objective"])
    return ModelCardData(
        language=language,
        license=license,
        library_name="transformers",
        pipeline_tag=family["pipeline_tag"],
        tags=family["tags"],
        datasets=[dataset_id],
        metrics=["perplexity"],
        model_name=model_name,
        eval_results=results,
    )


def render_model_card(
    model_dir: str | os.PathLike,
    repo_id: str,
    report_dir: str | os.PathLike | None = None,
    *,
    license: str = "apache-2.0",
    language: str = "en",
    dataset_id: str | None = None,
    hardware: str | None = None,
    revision: str = "main",
    template_path: str | os.PathLike | None = None,
) -> ModelCard:
    """The model card (YAML metadata + markdown) of a saved model folder and, optionally, its scoring report."""
    model_dir = Path(model_dir)
    template_path = model_card_template() if template_path is None else Path(template_path)
    if not template_path.is_file():
        raise FileNotFoundError(
            f"Model card template {template_path} not found; pass --template the path of a model card template "
            f"(the twotower repository's top-level model_card.md), or omit it to use the installed one."
        )
    model_config = check_model_folder(model_dir)
    family = describe_family(model_config)
    training_config = read_yaml(model_dir / RESOLVED_CONFIG_NAME)
    pretrain_config_path = find_pretrain_config(training_config)
    phase_configs = [read_yaml(pretrain_config_path)] if pretrain_config_path else []
    phase_configs.append(training_config)
    joint_config = next((config for config in phase_configs if config["phase"] == "pretrain"), None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    report = None if report_dir is None else read_report(report_dir)
    model_name = repo_id.split("/")[-1]
    metadata = card_data(
        family, joint_config or training_config, report, model_name,
        language=language, license=license, dataset_id=dataset_id,
    )  # fmt: skip
    return ModelCard.from_template(
        metadata,
        template_path=str(template_path),
        model_name=model_name,
        repo_id=repo_id,
        revision=revision,
        architecture=describe_architecture(model_config, safetensors_files(model_dir), tokenizer),
        has_probes=any(config["phase"] == "probe" for config in phase_configs),
        family=family,
        phases=[phase_config(config) for config in phase_configs],
        has_pretrain_config=pretrain_config_path is not None,
        joint_config=joint_config,
        hardware=hardware,
        trained_on_cpu=bool(training_config.get("cpu")),
        evaluation=None if report is None else describe_evaluation(report, Path(report_dir), tokenizer),
        **CARD_FUNCTIONS,
    )
