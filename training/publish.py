"""
Publish a trained two-tower model on the Hugging Face Hub: stage a repository folder, then upload it.

The staged folder holds the safetensors weights, config.json with `auto_map`, the modeling code files, the
tokenizer, the generation config, the resolved training config(s), the scoring report (under `evaluation/`), and
a README.md model card rendered from the repository's top-level `model_card.md` template (read from the
checkout; pass --template elsewhere). The upload goes through huggingface_hub (create_repo, create_branch,
upload_folder); the token comes from its standard resolution (HF_TOKEN, then `hf auth login`) and is never printed.

Stage and list what would be uploaded:
    python -m twotower.training.publish --model_dir outputs/tiny-probe/model --report_dir outputs/tiny-report \
        --repo_id user/twotower-tiny --output_dir outputs/hub/twotower-tiny --hardware "2 CPU cores" --dry-run

Upload (to a private repository, on a branch):
    python -m twotower.training.publish --model_dir outputs/tiny-probe/model --report_dir outputs/tiny-report \
        --repo_id user/twotower-tiny --output_dir outputs/hub/twotower-tiny --private --revision v0.1
"""

import argparse
import json
import os
import re
import shutil
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import SafetensorError, safe_open
from transformers import AutoTokenizer

from .arguments import RESOLVED_CONFIG_NAME
from .atomic import disk_full_error, fresh_staging_folder, is_disk_full, replace_folder
from .cli import run
from .errors import TwoTowerUserError
from .hub import push_to_hub
from .objectives import AUTO_CLASSES, needs_masking, objective_of
from .tokenizer import LOADING_FLAGS

MODEL_CARD_TEMPLATE = Path(__file__).resolve().parents[1] / "model_card.md"
PRETRAIN_CONFIG_NAME = "training_config_pretrain.yaml"  # the joint phase's config, staged beside the final one
REPORT_DIR_IN_REPO = "evaluation"
REPORT_SUMMARY_NAME = "preference.json"
REPORT_SUFFIXES = (".json", ".png", ".md", ".csv", ".parquet")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # refused: loading them runs code
PLOT_CAPTIONS = {  # the plots of evaluation/report.py; any other PNG of the report is captioned by its name
    "logprob_scatter": "Mean log-probability of each token type under each tower's probe",
    "preference_histogram": "Distribution of the preference over token types",
    "preference_vs_frequency": "Preference against the token type's frequency",
}
TOP_TOKENS_IN_CARD = 10
# An absolute path inside text (`/home/me/...`, `~/...`): not part of a relative path, a URL or a fraction.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])~?/[^\s`'\"(),;<>|]+")
TAGS = ["twotower", "two-tower", "tower-preference", "custom_code"]
PIPELINE_TAGS = {"causal": "text-generation", "masked": "fill-mask"}
TASK_NAMES = {"causal": "Causal language modeling", "masked": "Masked language modeling"}
PHASE_DESCRIPTIONS = {
    "pretrain": "the joint model (the paper's phase 1): every weight trained on {loss}.",
    "probe": "the joint model frozen; probes (one or more replicas per tower) trained on each tower's features "
    "alone (the paper's phases 2 and 3, run together on features the frozen towers computed once).",
}


# Reading the model folder


def _read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _weight_files(model_dir: Path) -> list[Path]:
    pickles = sorted(path.name for path in model_dir.iterdir() if path.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise TwoTowerUserError(
            f"{model_dir} holds pickled files {pickles}; the Hub repository ships safetensors only. Re-save the "
            f"model with save_pretrained (training does) and remove them."
        )
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(
            f"{model_dir} has no *.safetensors weights; pass the `model` folder a training run saved."
        )
    return weights


def check_model_folder(model_dir: Path) -> dict:
    """The folder's config.json, after checking it holds everything a Hub repository of the model needs."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"--model_dir {str(model_dir)!r} has no config.json; pass the `model` folder a training run saved "
            f"(OUTPUT_DIR/model)."
        )
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if "auto_map" not in config:
        raise TwoTowerUserError(
            f"{config_file} has no `auto_map`, so the Hub could not load it as custom code; save the model after "
            f"`import modeling_twotower` (training does)."
        )
    code_files = {reference.split(".")[0] + ".py" for reference in config["auto_map"].values()}
    required = [*sorted(code_files), "tokenizer_config.json", RESOLVED_CONFIG_NAME]
    missing = [name for name in required if not (model_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir} lacks {missing}; pass the `model` folder a training run saved.")
    check_weight_files(_weight_files(model_dir))
    return config


def check_weight_files(weight_files: list[Path]) -> None:
    """Every safetensors file reads whole and holds only finite numbers; an error names the file (and tensor)."""
    for path in weight_files:
        try:
            with safe_open(path, framework="pt") as weights:
                for name in weights.keys():
                    tensor = weights.get_tensor(name)
                    if tensor.is_floating_point() and not tensor.isfinite().all():
                        raise TwoTowerUserError(
                            f"{path} holds non-finite weights (NaN or infinity) in `{name}`: the training run diverged "
                            "or the file was damaged; use an earlier checkpoint, or train again (e.g. with a lower "
                            "learning rate)."
                        )
        except SafetensorError as error:
            raise TwoTowerUserError(
                f"{path} is not a readable safetensors file ({error}): it is damaged or cut short; copy or download "
                "it again, or save the model again."
            ) from error


def count_parameters(weight_files: list[Path]) -> tuple[int, int]:
    """(joint model, probes) parameter counts, read from the safetensors headers (tied weights are stored once)."""
    joint, probes = 0, 0
    for path in weight_files:
        with safe_open(path, framework="pt") as weights:
            for name in weights.keys():
                numel = 1
                for size in weights.get_slice(name).get_shape():
                    numel *= size
                if name.startswith("probes."):
                    probes += numel
                else:
                    joint += numel
    return joint, probes


def find_pretrain_config(training_config: dict) -> Path | None:
    """The joint phase's resolved config: the pretrained model folder's, when the final phase trained probes."""
    if training_config.get("phase") != "probe" or not training_config.get("pretrained_model"):
        return None
    path = Path(training_config["pretrained_model"]) / RESOLVED_CONFIG_NAME
    return path if path.is_file() else None


# What the card says


def _short_path(path: str) -> str:
    """The last two parts of a data path: enough to name it, without the author's home folder."""
    parts = [part for part in Path(path).parts if part not in (Path(path).anchor, "~")]
    return "/".join(parts[-2:]) or "."


def portable(value):
    """`value` (dicts, lists, strings) with every absolute local path, also inside text, cut to its last two parts."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item) for item in value]
    if isinstance(value, str):
        if os.path.isabs(value) or value.startswith("~"):
            return _short_path(value)
        return ABSOLUTE_PATH.sub(lambda match: _short_path(match.group()), value)
    return value


def describe_data(training_config: dict) -> str:
    if training_config.get("train_file"):
        text = f"local text `{_short_path(training_config['train_file'])}`"
        if training_config.get("validation_file"):
            text += f" (validation `{_short_path(training_config['validation_file'])}`)"
    else:
        text = f"the Hub dataset `{training_config['dataset_name']}`"
        if training_config.get("dataset_config_name"):
            text += f" (`{training_config['dataset_config_name']}`)"
    text += f", blocks of {training_config['block_size']} tokens"
    if training_config.get("max_train_blocks"):
        text += f", the first {training_config['max_train_blocks']:,} training blocks"
    return text


def describe_tokenizer(training_config: dict) -> str:
    if training_config.get("tokenizer_name_or_path"):
        return f"`{_short_path(training_config['tokenizer_name_or_path'])}`"
    if training_config.get("phase") == "probe":
        return "the pretrained model's"
    return f"byte-level BPE of {training_config['tokenizer_vocab_size']:,} tokens trained on the training text"


def describe_length(training_config: dict) -> str:
    if training_config.get("max_train_steps"):
        return f"{training_config['max_train_steps']:,} optimizer steps"
    epochs = training_config["num_train_epochs"]
    return f"{epochs} epoch{'s' if epochs != 1 else ''}"


def describe_family(model_config: dict) -> dict:
    """What kind of two-tower model this is: objective, towers, cooperation, and the names the card uses for them."""
    objective, tower_type = objective_of(model_config), model_config.get("tower_type", "transformer")
    cooperative = model_config.get("cooperative", True)
    if objective == "causal":
        loss = "the next-token loss"
    elif tower_type == "lstm":
        loss = "the loss of every token given its left and right context"
    else:
        loss = "the masked-LM loss (15% of the tokens selected; 80% [MASK], 10% random, 10% unchanged)"
    loss += " of the fused logits" if cooperative else ", each tower through its own LM head, the towers' losses summed"
    towers = {
        ("causal", "transformer"): "causal transformer (GPT-style)",
        ("masked", "transformer"): "bidirectional transformer (BERT-style)",
        ("causal", "lstm"): "forward LSTM",
        ("masked", "lstm"): "forward + backward LSTM (ELMo-style)",
    }[objective, tower_type]
    tags = [*TAGS, "causal-lm" if objective == "causal" else "masked-lm"]
    tags += ["lstm"] if tower_type == "lstm" else []
    tags += [] if cooperative else ["independent-towers-control"]
    return {
        "objective": objective,
        "kind": "causal language model" if objective == "causal" else "masked language model",
        "towers": towers,
        "tower_type": tower_type,
        "masking": needs_masking(objective, tower_type),
        "cooperative": cooperative,
        "loss": loss,
        "auto_class": AUTO_CLASSES[objective].__name__,
        "pipeline_tag": PIPELINE_TAGS[objective],
        "tags": tags,
    }


def describe_phase(training_config: dict, family: dict) -> dict:
    """One phase of the training recipe, as the rows of the card's table."""
    config = training_config
    return {
        "name": config["phase"],
        "description": PHASE_DESCRIPTIONS[config["phase"]].format(loss=family["loss"]),
        "data": describe_data(config),
        "tokenizer": describe_tokenizer(config),
        "length": describe_length(config),
        "batch": f"{config['per_device_train_batch_size']} sequences of {config['block_size']} tokens per device x "
        f"{config['gradient_accumulation_steps']} accumulation step(s) per optimizer step, times the number of "
        f"processes",
        "optimizer": f"AdamW, learning rate {config['learning_rate']:g}, betas ({config['adam_beta1']:g}, "
        f"{config['adam_beta2']:g}), eps {config['adam_epsilon']:g}, weight decay {config['weight_decay']:g} "
        f"({WEIGHT_DECAY_SPARED[config.get('weight_decay_exclude', 'norms_and_biases')]}), gradient clipping "
        f"{config['max_grad_norm']:g}",
        "schedule": f"{config['lr_scheduler_type']}, {config['num_warmup_steps']:,} warm-up steps",
        "precision": config.get("mixed_precision") or "the launcher's setting (fp32 unless `accelerate` set one)",
        "seed": config["seed"],
    }


# What each `weight_decay_exclude` choice leaves undecayed, as the card words it (older configs: norms_and_biases).
WEIGHT_DECAY_SPARED = {
    "norms_and_biases": "not on norms and biases",
    "tower_norms_and_biases": "not on biases and the towers' LayerNorms",
    "none": "on every parameter",
}


def describe_architecture(model_config: dict, weight_files: list[Path], tokenizer) -> dict:
    num_parameters, num_probe_parameters = count_parameters(weight_files)
    names = ("num_towers", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    fused_hidden_size = model_config["num_towers"] * model_config["hidden_size"]
    return {
        **{name: model_config[name] for name in (*names, "vocab_size", "max_position_embeddings")},
        "layout": model_config.get("layout", "bert"),  # older configs: the bert layout
        "initialization": model_config.get("initialization", "normal"),
        "lstm_hidden_size": model_config.get("lstm_hidden_size"),
        "fused_hidden_size": fused_hidden_size,
        "embedding_size": model_config.get("embedding_size") or fused_hidden_size,  # older configs: the fused width
        "tokenizer_size": len(tokenizer),
        "num_parameters": num_parameters,
        "num_probe_parameters": num_probe_parameters,
        "probe_replicas": model_config.get("probe_replicas", 1),  # older configs: one probe per tower
        "probe_type": model_config.get("probe_type", "mlp"),
        "dtype": model_config.get("dtype", "float32"),
    }


def _token_text(tokenizer, token_id: int) -> str:
    """A token as a markdown code span that shows its spaces and newlines (JSON string syntax)."""
    text = json.dumps(tokenizer.decode([token_id]), ensure_ascii=False).replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _percentages(shares: list) -> str:
    return ", ".join(
        f"tower {tower_idx}: {'n/a' if share is None else f'{share:.1%}'}" for tower_idx, share in enumerate(shares)
    )


def _optional(value, fmt: str) -> str:
    return "undefined (too few token types)" if value is None else format(value, fmt)


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """The preference summary as (quantity, value) rows of the card's table; replica-level figures first."""
    significant = (
        f"{summary['num_significant']:,} of {summary['num_eligible_types']:,} "
        f"({_optional(summary['significant_share'], '.1%')})"
    )
    rows = []
    if summary.get("test") == "replica":
        low, high = summary["reliability_ci"]
        rows += [
            (
                f"Reliability (tower share of the per-type preference variance; {len(summary['probe_towers'])} "
                f"probes, 95% CI over token types)",
                f"{_optional(summary['reliability'], '.3f')} ({_optional(low, '.3f')} to {_optional(high, '.3f')})",
            ),
            (f"Preferences beyond probe noise (replica-level test, BH FDR {summary['alpha']:g})", significant),
            (
                "Two-tower difference / same-tower floor (mean per type, nats)",
                f"{_optional(summary['two_tower_difference_nats'], '.3f')} / "
                f"{_optional(summary['same_tower_floor_nats'], '.3f')}",
            ),
        ]
        significant = (
            f"{summary['occurrence_num_significant']:,} of {summary['num_eligible_types']:,} "
            f"({_optional(summary['occurrence_significant_share'], '.1%')})"
        )
    return rows + [
        ("Predictions scored", f"{summary['num_predictions']:,}"),
        (
            "Token types seen (at least min_count times)",
            f"{summary['num_token_types']:,} ({summary['num_eligible_types']:,})",
        ),
        ("Token types preferring each tower", _percentages(summary["type_share_preferring"])),
        ("Token occurrences whose type prefers each tower", _percentages(summary["occurrence_share_preferring"])),
        ("Mean preference of the preferred tower", f"{_optional(summary['mean_abs_preference_nats'], '.3f')} nats"),
        (
            f"Significant over occurrences (Benjamini-Hochberg, FDR {summary['alpha']:g}; blind to probe noise)",
            significant,
        ),
        ("Split-half consistency (Pearson r between halves)", _optional(summary["split_half_consistency"], ".3f")),
        (
            "Bimodality coefficient (Sarle; above 5/9 = 0.556 suggests two modes)",
            _optional(summary["bimodality_coefficient"], ".3f"),
        ),
    ]


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
    return {
        "data": describe_report_data(report.get("data", {})),
        "joint_perplexity": report["perplexity"]["joint"],
        "probe_perplexities": report["perplexity"]["probes"],
        "min_count": summary["min_count"],
        "summary_rows": summary_rows(summary),
        "top_tokens": [tokens[:TOP_TOKENS_IN_CARD] for tokens in top_tokens],
        "plots": plots,
        "folder": REPORT_DIR_IN_REPO,
    }


def describe_report_data(data: dict) -> str:
    """The scored text, from the report's `data` entry (the scoring command's data options)."""
    split = data.get("split", "validation")
    if data.get("train_file"):
        if split == "validation" and data.get("validation_file"):
            text = f"local text `{_short_path(data['validation_file'])}`"
        elif split == "validation":
            text = f"the blocks held out of local text `{_short_path(data['train_file'])}`"
        else:
            text = f"the training blocks of local text `{_short_path(data['train_file'])}`"
    else:
        config_name = f" (`{data['dataset_config_name']}`)" if data.get("dataset_config_name") else ""
        text = f"the Hub dataset `{data.get('dataset_name')}`{config_name}, split `{split}`"
    if data.get("num_blocks") and data.get("block_size"):
        text += f", {data['num_blocks']:,} blocks of {data['block_size']} tokens"
    return text


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
    template_path: str | os.PathLike = MODEL_CARD_TEMPLATE,
) -> ModelCard:
    """The model card (YAML metadata + markdown) of a saved model folder and, optionally, its scoring report."""
    model_dir = Path(model_dir)
    if not Path(template_path).is_file():
        raise FileNotFoundError(
            f"Model card template {template_path} not found; it is read from the twotower checkout (its top-level "
            f"model_card.md): run from an editable install or pass --template."
        )
    model_config = check_model_folder(model_dir)
    family = describe_family(model_config)
    training_config = _read_yaml(model_dir / RESOLVED_CONFIG_NAME)
    pretrain_config_path = find_pretrain_config(training_config)
    phase_configs = [_read_yaml(pretrain_config_path)] if pretrain_config_path else []
    phase_configs.append(training_config)
    joint_config = next((config for config in phase_configs if config["phase"] == "pretrain"), None)
    data_config = joint_config or training_config
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    report, evaluation, results = None, None, None
    if report_dir is not None:
        report_dir = Path(report_dir)
        if not (report_dir / REPORT_SUMMARY_NAME).is_file():
            raise FileNotFoundError(
                f"--report_dir {str(report_dir)!r} has no {REPORT_SUMMARY_NAME}; pass the output folder of "
                f"`python -m twotower.evaluation.score`."
            )
        report = json.loads((report_dir / REPORT_SUMMARY_NAME).read_text(encoding="utf-8"))
        evaluation = describe_evaluation(report, report_dir, tokenizer)

    local_data = bool(data_config.get("train_file"))
    if dataset_id is None:
        dataset_id = Path(data_config["train_file"]).parent.name if local_data else data_config["dataset_name"]
    if report is not None:
        split = report.get("data", {}).get("split", "validation")
        dataset_config = None if local_data else data_config.get("dataset_config_name")
        results = eval_results(report, dataset_id, dataset_id, dataset_config, split, family["objective"])

    model_name = repo_id.split("/")[-1]
    card_data = ModelCardData(
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
    if hardware is None:
        hardware = "not recorded by the training run"
        hardware += " (trained with `--cpu`)" if training_config.get("cpu") else ""
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_name=model_name,
        repo_id=repo_id,
        revision=revision,
        architecture=describe_architecture(model_config, _weight_files(model_dir), tokenizer),
        has_probes=any(config["phase"] == "probe" for config in phase_configs),
        family=family,
        phases=[describe_phase(config, family) for config in phase_configs],
        has_pretrain_config=pretrain_config_path is not None,
        joint_training_length=describe_length(joint_config) if joint_config else "an unrecorded number of steps",
        hardware=hardware,
        evaluation=evaluation,
    )


# Staging and uploading


def stage_model_repo(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    repo_id: str,
    report_dir: str | os.PathLike | None = None,
    **card_options,
) -> Path:
    """
    Write the Hub repository folder of a saved model into output_dir (atomically) and return it: the model
    folder's files, the joint phase's training config, the report under `evaluation/`, and README.md (the
    model card; `card_options` are render_model_card's keyword arguments).
    """
    model_dir, output_dir = Path(model_dir).resolve(), Path(output_dir).resolve()
    if output_dir == model_dir or model_dir.is_relative_to(output_dir):
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} would replace the model folder; stage somewhere else."
        )
    card = render_model_card(model_dir, repo_id, report_dir, **card_options)

    max_length = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"]
    tmp = fresh_staging_folder(output_dir)
    try:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and path.name != "README.md" and not path.name.startswith("."):
                stage_file(path, tmp / path.name, max_length)
        pretrain_config = find_pretrain_config(_read_yaml(model_dir / RESOLVED_CONFIG_NAME))
        if pretrain_config is not None:
            stage_file(pretrain_config, tmp / PRETRAIN_CONFIG_NAME, max_length)
        if report_dir is not None:
            (tmp / REPORT_DIR_IN_REPO).mkdir()
            for path in sorted(Path(report_dir).iterdir()):
                if path.is_file() and path.suffix in REPORT_SUFFIXES:
                    stage_file(path, tmp / REPORT_DIR_IN_REPO / path.name, max_length, report=True)
        card.save(tmp / "README.md")
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(error):
            raise disk_full_error(output_dir, tmp) from error
        raise
    replace_folder(tmp, output_dir)
    return output_dir


def stage_file(source: Path, target: Path, max_length: int, report: bool = False) -> None:
    """
    Copy one file into a staged repository, as it may leave the machine: training configs and a report's JSON and
    markdown with their local paths cut short (see `portable`), tokenizer_config.json without loading flags and
    with the model's positions as its model_max_length. Everything else (weights, code, vocabularies, tables) byte
    for byte: their strings are tokens, not paths.
    """
    if source.suffix == ".yaml":
        target.write_text(yaml.safe_dump(portable(_read_yaml(source)), sort_keys=False), encoding="utf-8")
    elif source.name == "tokenizer_config.json":
        config = {key: value for key, value in _read_json(source).items() if key not in LOADING_FLAGS}
        target.write_text(json.dumps({**config, "model_max_length": max_length}, indent=2) + "\n", encoding="utf-8")
    elif report and source.suffix == ".json":
        target.write_text(json.dumps(portable(_read_json(source)), indent=2) + "\n", encoding="utf-8")
    elif report and source.suffix == ".md":
        target.write_text(portable(source.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        shutil.copyfile(source, target)


def describe_folder(folder: Path) -> str:
    """One line per file (path in the repository and size), and the total: what an upload would send."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    lines = [f"{path.stat().st_size:>12,}  {path.relative_to(folder).as_posix()}" for path in files]
    lines.append(f"{sum(path.stat().st_size for path in files):>12,}  bytes in {len(files)} files")
    return "\n".join(lines)


def publish_model(
    model_dir: str | os.PathLike,
    repo_id: str,
    output_dir: str | os.PathLike,
    report_dir: str | os.PathLike | None = None,
    *,
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload two-tower model",
    dry_run: bool = False,
    **card_options,
) -> dict:
    """Stage the model repository, then upload it unless `dry_run`; returns {"folder", "files", "commit_url"}."""
    if repo_id.count("/") != 1:
        raise TwoTowerUserError(f"--repo_id {repo_id!r} must be `user/name` (or `organization/name`).")
    folder = stage_model_repo(model_dir, output_dir, repo_id, report_dir, revision=revision, **card_options)
    files = describe_folder(folder)
    commit_url = None
    if not dry_run:
        commit_url = push_to_hub(folder, repo_id, private=private, revision=revision, commit_message=commit_message)
    return {"folder": str(folder), "files": files, "commit_url": commit_url}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="the `model` folder a training run saved")
    parser.add_argument("--repo_id", required=True, help="user/name of the Hub model repository")
    parser.add_argument("--output_dir", required=True, help="where the repository folder is staged")
    parser.add_argument("--report_dir", help="output folder of `python -m twotower.evaluation.score`")
    parser.add_argument("--license", default="apache-2.0", help="a Hub license id")
    parser.add_argument("--language", default="en")
    parser.add_argument("--dataset_id", help="Hub id of the training dataset; default: the training config's")
    parser.add_argument("--hardware", help='what it was trained on, for the card, e.g. "8x A100 80GB"')
    parser.add_argument("--template", default=str(MODEL_CARD_TEMPLATE), help="model card template (jinja2)")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--revision", default="main", help="branch to upload to (created if missing)")
    parser.add_argument("--commit_message", default="Upload two-tower model")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="stage and list only")
    args = parser.parse_args(argv)
    result = publish_model(
        args.model_dir, args.repo_id, args.output_dir, args.report_dir,
        private=args.private, revision=args.revision, commit_message=args.commit_message, dry_run=args.dry_run,
        license=args.license, language=args.language, dataset_id=args.dataset_id, hardware=args.hardware,
        template_path=args.template,
    )  # fmt: skip
    print(f"Staged {result['folder']}:\n{result['files']}")
    if args.dry_run:
        print(f"Dry run: nothing uploaded (would upload to {args.repo_id}@{args.revision}).")
    else:
        print(f"Uploaded to {result['commit_url']}")
    return result


if __name__ == "__main__":
    run(main)
