"""Reading a saved two-tower model folder, for the probe phase and for scoring, with one clear error per problem."""

from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig

from modeling_twotower import TwoTowerCheckpointError, TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.checkpoint_checks import check_weights_fit_config, loaded_weight_files

from .arguments import RESOLVED_CONFIG_NAME
from .utils.errors import TwoTowerUserError
from .data.objectives import objective_of

MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}
# the metric folder (evaluation/tower_preference) words the same refusal for itself: `evaluate.load` copies it alone
PROBE_PHASE_COMMAND = (
    "python -m twotower.training.train --recipe tiny_probe --pretrained_model {model} --output_dir OUTPUT_DIR"
)


def read_training_config(model_dir) -> dict | None:
    """The training_config.yaml saved beside a model by the training command, or None if the folder has none."""
    path = Path(model_dir) / RESOLVED_CONFIG_NAME
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise TwoTowerUserError(
            f"{model_dir} holds a damaged config ({' '.join(str(error).split())}); save or download the model again."
        ) from error


def load_two_tower_config(model_dir, option: str = "--model_dir", saved_by: str = "probe") -> TwoTowerConfig:
    """
    The TwoTowerConfig of a model folder, checked against the folder's weights before any long work; a clear error
    for a missing, damaged or other kind of config, a damaged weights file, or weights of other sizes than the
    config's. `option` (the flag that named the folder) and `saved_by` (the phase whose run saves such a folder) word
    the error.
    """
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(
            f"{option} {str(model_dir)!r} has no config.json; pass the `model` folder that a {saved_by} run saved "
            "(OUTPUT_DIR/model)."
        )
    try:
        # the package loads its own classes and never runs a folder's code, so never asks whether to (a [y/N] prompt)
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    except OSError as error:  # config.json is not JSON
        raise TwoTowerUserError(
            f"{model_dir} holds a damaged config ({' '.join(str(error).split())}); save or download the model again."
        ) from error
    except ValueError as error:  # no model_type, or one transformers does not know
        raise TwoTowerUserError(
            f"{option} {str(model_dir)!r} holds no model transformers knows, not a two-tower model (model_type "
            f"{TwoTowerConfig.model_type!r}); pass a folder that a {saved_by} run saved (OUTPUT_DIR/model)."
        ) from error
    if not isinstance(config, TwoTowerConfig):
        raise TwoTowerUserError(
            f"{option} {str(model_dir)!r} holds a {config.model_type!r} model, not a two-tower model (model_type "
            f"{TwoTowerConfig.model_type!r}); pass a folder that a {saved_by} run saved (OUTPUT_DIR/model)."
        )
    try:
        check_weights_fit_config(MODEL_CLASSES[objective_of(config)], config, loaded_weight_files(model_dir))
    except TwoTowerCheckpointError as error:
        raise TwoTowerUserError(str(error)) from error
    return config


def _check_probes_trained(config: TwoTowerConfig, model_dir) -> None:
    """A probe phase trained the probes: it records `probe_training_steps`; before that record, `phase: probe`."""
    if config.probe_training_steps or (read_training_config(model_dir) or {}).get("phase") == "probe":
        return
    raise TwoTowerUserError(
        f"{model_dir} has untrained probes (no probe phase recorded: `probe_training_steps` is unset in its config), "
        f"so a preference would only measure their random initial weights. Train them first, e.g. "
        f"`{PROBE_PHASE_COMMAND.format(model=model_dir)}`, and score OUTPUT_DIR/model."
    )


def load_two_tower(model_dir, dtype: torch.dtype = torch.float32, option: str = "--model_dir", trained_probes=True):
    """
    The two-tower model of a folder, in eval mode. Refused with one clear error: no or another kind of model, probes
    that no probe phase trained (when `trained_probes`), a damaged or non-finite weights file (named), or weights
    that overflow in `dtype`.
    """
    config = load_two_tower_config(model_dir, option, saved_by="probe" if trained_probes else "pretrain")
    if trained_probes:
        _check_probes_trained(config, model_dir)
    check_weight_files(loaded_weight_files(model_dir))
    model = MODEL_CLASSES[objective_of(config)].from_pretrained(model_dir, dtype=dtype).eval()
    overflowed = next((name for name, tensor in model.state_dict().items() if not tensor.isfinite().all()), None)
    if overflowed is not None:  # the files are finite: a cast to a narrower dtype overflowed
        raise TwoTowerUserError(
            f"`{overflowed}` of {model_dir} is not finite in {dtype} (its weights overflow that dtype); score with "
            "--dtype float32 or bfloat16."
        )
    return model


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
