"""The model card of a saved model folder: the facts it states, gathered for the top-level `model_card.md` template.

The card's prose lives in the template (rendered by huggingface_hub's ModelCard.from_template); this module only
prepares the values it reads: the model's family and architecture, each training phase's config, and the scoring
report's figures.
"""

import importlib.resources
import json
import os
import re
from pathlib import Path

import pandas as pd
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from modeling_twotower import TwoTowerConfig
from modeling_twotower.towers import tower_stack_class
from transformers import AutoTokenizer

from ..scoring.report_agreement import agreement_of
from ..scoring.report_files import PER_TOKEN_CSV, PREFERENCE_JSON, REPORT_MD

from twotower.training.arguments import RESOLVED_CONFIG_NAME
from .model_folder import check_model_folder, count_parameters, find_pretrain_config, portable, read_yaml
from .model_folder import safetensors_files, short_path
from twotower.training.data.objectives import AUTO_CLASSES, needs_masking, objective_of
from twotower.training.utils.markdown_escape import code_span, markdown_text, markdown_url

MODEL_CARD_NAME = "model_card.md"
REPORT_DIR_IN_REPO = "evaluation"
PRETRAIN_CONFIG_NAME = "training_config_pretrain.yaml"  # the joint phase's config, staged beside the final one
PLOT_CAPTIONS = {  # by the report's plot names (report_files.PLOTS, REPLICA_PLOTS); any other PNG: its file name
    "logprob_scatter": "Mean log-probability of each token type under each tower's probe",
    "preference_histogram": "Distribution of the preference over token types",
    "preference_vs_frequency": "Preference against the token type's frequency",
    "preference_vs_floor": "Difference between two towers' probes against the same-tower floor, per token type",
}
TOP_TOKENS_IN_CARD = 10
DEFAULT_LICENSE = "apache-2.0"  # publish's --license when none is given; the card says it was not chosen
# A style in a tower kind's name that is also a layout of the reference code: kept on the card only for that layout
# ("causal transformer (GPT-style)" would call the bert layout's towers GPT's)
LAYOUT_STYLES = {"GPT-style": "gpt", "BERT-style": "bert", "ELMo-style": "elmo"}
RERUN_FOLDER = "rerun"  # where the card's rerun commands write, inside the downloaded repository
# `-I` leaves the working folder off sys.path: in the downloaded repository, its modeling_twotower.py (the Hub's
# custom code) would shadow the installed package
RERUN_COMMAND = "python -I -m twotower.training.train"
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
        "towers": card_tower_name(towers.card_names[bidirectional], config.layout),
        "tower_architecture": towers.card_architecture(config, bidirectional),
        "tower_sizes": [(label, getattr(config, field)) for label, field in towers.card_size_rows],
        "tower_limitation": towers.card_limitations.get(bidirectional),
        "masking": needs_masking(objective, towers),
        "cooperative": cooperative,
        "auto_class": AUTO_CLASSES[objective].__name__,
        "pipeline_tag": PIPELINE_TAGS[objective],
        "tags": tags,
    }


def card_tower_name(name: str, layout: str) -> str:
    """A tower kind's name (its `card_names`) for a model of `layout`: without a style that names another layout."""
    style = re.search(r" \(([\w-]+-style)\)$", name)
    if style and LAYOUT_STYLES.get(style[1], layout) != layout:
        return name[: style.start()]
    return name


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


def top_tokens(summary: dict, significant: pd.Series, tokenizer) -> list[dict]:
    """Per tower, its TOP_TOKENS_IN_CARD most preferred types as (token, nats), split by the per-type test of the
    report (`significant`, by token id): {"beyond": [...], "within": [...]}, each strongest first."""
    towers = []
    for token_ids, preferences in zip(summary["top_token_ids"], summary["top_preference_nats"]):
        shown = list(zip(token_ids, preferences))[:TOP_TOKENS_IN_CARD]
        tokens = {"beyond": [], "within": []}
        for token_id, nats in shown:
            tokens["beyond" if significant[token_id] else "within"].append((_token_text(tokenizer, token_id), nats))
        towers.append(tokens)
    return towers


def probes_against_joint(joint: float, probes: list[float]) -> dict:
    """The towers whose probe has a perplexity below, equal to and above the joint model's."""
    sides = {"below": [], "equal to": [], "above": []}
    for tower, perplexity in enumerate(probes):
        sides["below" if perplexity < joint else "above" if perplexity > joint else "equal to"].append(tower)
    return sides


def describe_evaluation(report: dict, report_dir: Path, tokenizer) -> dict:
    """The card's evaluation section from a scoring report folder (preference.json, the per-token table's
    per-type test, and the PNG plots)."""
    summary = report["summary"]
    table = pd.read_csv(report_dir / PER_TOKEN_CSV, usecols=["token_id", "significant"])
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
    perplexity = report["perplexity"]
    return {
        "data": {"split": "validation", **data},
        "joint_perplexity": perplexity["joint"],
        "probe_perplexities": perplexity["probes"],
        "probes_against_joint": probes_against_joint(perplexity["joint"], perplexity["probes"]),
        "has_ablation": "ablation" in report,
        **agreement_of(report),
        "summary": summary,
        "top_tokens": top_tokens(summary, table.set_index("token_id")["significant"], tokenizer),
        "plots": plots,
        "report": f"{REPORT_DIR_IN_REPO}/{REPORT_MD}" if (report_dir / REPORT_MD).is_file() else None,
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
    """The card's YAML metadata. Datasets are named by Hub id only: `dataset_id`, else the training config's Hub
    dataset; local text has none, so its card lists no dataset and no model-index (which needs one)."""
    local_data = bool(data_config.get("train_file"))
    if dataset_id is None and not local_data:
        dataset_id = data_config["dataset_name"]
    results = None
    if report is not None and dataset_id is not None:
        split = report.get("data", {}).get("split", "validation")
        dataset_config = None if local_data else data_config.get("dataset_config_name")
        results = eval_results(report, dataset_id, dataset_id, dataset_config, split, family["objective"])
    return ModelCardData(
        language=language,
        license=license,
        library_name="transformers",
        pipeline_tag=family["pipeline_tag"],
        tags=family["tags"],
        datasets=None if dataset_id is None else [dataset_id],
        metrics=["perplexity"],
        model_name=model_name,
        eval_results=results,
    )


def rerun_commands(phase_configs: list[dict]) -> list[str]:
    """The commands that rerun the run in the downloaded repository, each phase from its staged config: the joint
    phase (when its config is staged), then the final one; probes train on the rerun's joint model, or, without the
    joint phase's config, on this repository's."""
    recipes = [PRETRAIN_CONFIG_NAME, RESOLVED_CONFIG_NAME][-len(phase_configs):]
    commands, pretrained = [], "."
    for config, recipe in zip(phase_configs, recipes):
        output_dir = f"{RERUN_FOLDER}/{config['phase']}"
        probes_on = f" --pretrained_model {pretrained}" if config["phase"] == "probe" else ""
        commands.append(f"{RERUN_COMMAND} --recipe {recipe}{probes_on} --output_dir {output_dir}")
        pretrained = f"{output_dir}/model"
    return commands


def rerun_data(phase_configs: list[dict]) -> list[str]:
    """The local text files the rerun reads, as the staged configs name them (relative to the repository)."""
    paths = [portable(config.get(key)) for config in phase_configs for key in ("train_file", "validation_file")]
    return list(dict.fromkeys(path for path in paths if path))


def render_model_card(
    model_dir: str | os.PathLike,
    repo_id: str,
    report_dir: str | os.PathLike | None = None,
    *,
    license: str | None = None,
    language: str = "en",
    dataset_id: str | None = None,
    hardware: str | None = None,
    revision: str = "main",
    template_path: str | os.PathLike | None = None,
) -> ModelCard:
    """The model card (YAML metadata + markdown) of a saved model folder and, optionally, its scoring report; a
    license of None is DEFAULT_LICENSE, and the card says it was not chosen."""
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
        language=language, license=license or DEFAULT_LICENSE, dataset_id=dataset_id,
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
        rerun_commands=rerun_commands(phase_configs),
        rerun_data=rerun_data(phase_configs),
        rerun_folder=RERUN_FOLDER,
        joint_config=joint_config,
        license=license or DEFAULT_LICENSE,
        license_chosen=license is not None,
        hardware=hardware,
        trained_on_cpu=bool(training_config.get("cpu")),
        evaluation=None if report is None else describe_evaluation(report, Path(report_dir), tokenizer),
        **CARD_FUNCTIONS,
    )
