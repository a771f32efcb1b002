"""Check and read a saved model folder: its required files, safetensors weights, configs and parameter counts."""

import json
import math
import os
import re
from pathlib import Path

import yaml

from modeling_twotower.checkpoint_checks import read_weight_shapes
from twotower.training.arguments import RESOLVED_CONFIG_NAME
from twotower.training.loading import check_weight_files
from twotower.training.utils.errors import TwoTowerUserError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # refused: loading them runs code
# An absolute path inside text (`/home/me/...`, `~/...`): not part of a relative path, a URL or a fraction.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])~?/[^\s`'\"(),;<>|]+")


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def short_path(path: str) -> str:
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
            return short_path(value)
        return ABSOLUTE_PATH.sub(lambda match: short_path(match.group()), value)
    return value


def local_paths(value) -> set[str]:
    """Every absolute local path `portable` cuts in `value`: whole strings, and paths inside text."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return {path for item in value for path in local_paths(item)}
    if not isinstance(value, str):
        return set()
    if os.path.isabs(value) or value.startswith("~"):
        return {value}
    return set(ABSOLUTE_PATH.findall(value))


def safetensors_files(model_dir: Path) -> list[Path]:
    """The folder's safetensors files; pickled weights are refused."""
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


def model_config_file(model_dir: Path) -> Path:
    """The folder's config.json; a folder without one is not a saved model."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"--model_dir {str(model_dir)!r} has no config.json; pass the `model` folder a training run saved "
            f"(OUTPUT_DIR/model)."
        )
    return config_file


def check_model_folder(model_dir: Path) -> dict:
    """The folder's config.json, after checking it holds everything a Hub repository of the model needs."""
    config_file = model_config_file(model_dir)
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
    check_weight_files(safetensors_files(model_dir))
    return config


def count_parameters(weight_files: list[Path]) -> tuple[int, int]:
    """(joint model, probes) parameter counts, read from the safetensors headers (tied weights are stored once)."""
    counts = {name: math.prod(shape) for name, (shape, _) in read_weight_shapes(weight_files).items()}
    probes = sum(count for name, count in counts.items() if name.startswith("probes."))
    return sum(counts.values()) - probes, probes


def find_pretrain_config(training_config: dict) -> Path | None:
    """The joint phase's resolved config: the pretrained model folder's, when the final phase trained probes."""
    if training_config.get("phase") != "probe" or not training_config.get("pretrained_model"):
        return None
    path = Path(training_config["pretrained_model"]) / RESOLVED_CONFIG_NAME
    return path if path.is_file() else None
