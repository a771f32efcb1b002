"""
Convert a two-tower model folder saved with earlier parameter names to today's names, into a new folder.

    python scripts/convert_checkpoint.py OLD_MODEL_DIR NEW_MODEL_DIR

Earlier versions kept the LM heads' layers on the LM model itself (`fusion_dense`, `fusion_output_norm`, the tied
decoder as `lm_head.weight`, the control's heads as `tower_lm_heads`) and the base model's parts as names inside it
(`embed_positions`, `layers`, `lstm_towers`, ...) before `embeddings`, `towers` and `fusion` were modules. The
weights (`model.safetensors`, or the shards its index names) are read and written as safetensors, renamed and
otherwise unchanged; every other file is copied. The input folder is never written; the output folder must not
exist yet, must lie outside the input folder and in a folder that can be written, and appears only once complete.
Every problem (a damaged weights file or index, an output folder that cannot be) is one `error:` line naming it,
found before anything is written.
"""

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

# Before the LM heads were modules of their own (heads.py)
HEAD_RENAMES = {
    "fusion_dense": "lm_head.dense",
    "fusion_output_norm": "lm_head.norm",
    "lm_head.weight": "lm_head.decoder.weight",
    "lm_head.bias": "lm_head.decoder.bias",
    "tower_lm_heads": "lm_head",
}
# Before the base model held its embedding, towers' stack and fusion as modules; the token embedding kept its name
BASE_MODEL_RENAMES = {
    "embed_positions.": "embeddings.embed_positions.",
    "embed_norm.": "embeddings.embed_norm.",
    "tower_proj.": "embeddings.tower_proj.",
    "layers.": "towers.layers.",
    "tower_norm.": "towers.tower_norm.",
    "lstm_towers.": "towers.",
    "elmo_towers.": "towers.",
    "fusion_norm.": "fusion.norm.",
}
BASE_MODEL_PREFIX = "model."  # the base model inside an LM model
# Applied in this order, each at most once: a base model saved alone, and inside an LM model
RENAMES = [
    *HEAD_RENAMES.items(),
    *BASE_MODEL_RENAMES.items(),
    *((BASE_MODEL_PREFIX + old, BASE_MODEL_PREFIX + new) for old, new in BASE_MODEL_RENAMES.items()),
]
WEIGHTS_NAME, INDEX_NAME = "model.safetensors", "model.safetensors.index.json"


class ConversionError(ValueError):
    """A folder the script cannot convert, or cannot convert into: the message names it and the fix."""


def new_name(key: str) -> str:
    """Today's name of a parameter saved as `key`."""
    for old, new in RENAMES:
        key = re.sub(f"^{re.escape(old)}", new, key)
    return key


def read_index(path: Path) -> dict:
    """A weights index (model.safetensors.index.json): a JSON object whose `weight_map` maps names to files."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        if not all(isinstance(file, str) for file in index["weight_map"].values()):
            raise ValueError("a file name that is not a string")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConversionError(
            f"{path} is not a readable weights index ({type(error).__name__}: {error}); copy it again, or save the "
            "model again."
        ) from error
    return index


def weight_files(folder: Path) -> list[str]:
    """The folder's weight files: model.safetensors, or the shards its index names, each a readable safetensors."""
    if (folder / INDEX_NAME).is_file():
        files = sorted(set(read_index(folder / INDEX_NAME)["weight_map"].values()))
    elif (folder / WEIGHTS_NAME).is_file():
        files = [WEIGHTS_NAME]
    else:
        raise FileNotFoundError(f"{folder} holds neither {WEIGHTS_NAME} nor {INDEX_NAME}; pass a saved model folder.")
    for name in files:
        try:
            with safe_open(folder / name, framework="pt") as weights:
                weights.keys()
        except (SafetensorError, OSError) as error:
            raise ConversionError(
                f"{folder / name} is not a readable safetensors file ({error}): it is damaged, cut short or missing; "
                "copy it again, or save the model again."
            ) from error
    return files


def check_output_folder(old_dir: Path, new_dir: Path) -> None:
    """The converted folder can be written where asked: a new folder, outside the input, in a writable folder."""
    if new_dir.exists():
        raise FileExistsError(f"{new_dir} exists; give a new folder for the converted model (nothing is replaced).")
    if new_dir.resolve().is_relative_to(old_dir.resolve()):
        raise ConversionError(
            f"{new_dir} is inside the input folder {old_dir}, which is never written (the converted folder would be "
            "copied into itself); give a folder outside it."
        )
    existing = next(folder for folder in (new_dir.parent, *new_dir.parent.parents) if folder.exists())
    try:  # a file in the path, a read-only folder or mount: tried where the new folders would be made
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ConversionError(
            f"{new_dir} cannot be written: {existing} is not a folder one can write to ({error.strerror or error}); "
            "give a folder elsewhere."
        ) from error


def convert_weights(source: Path, target: Path) -> int:
    """Write `source` (a safetensors file) renamed to `target`; returns the number of renamed tensors."""
    try:
        with safe_open(source, framework="pt") as weights:
            metadata = weights.metadata()
            tensors = {new_name(key): weights.get_tensor(key) for key in weights.keys()}
            renamed = sum(new_name(key) != key for key in weights.keys())
    except SafetensorError as error:  # a header that reads, over tensors cut short
        raise ConversionError(
            f"{source} is not a readable safetensors file ({error}): it is damaged or cut short; copy it again, or "
            "save the model again."
        ) from error
    save_file(tensors, target, metadata=metadata)
    return renamed


def convert_folder(old_dir, new_dir) -> int:
    """Convert the model folder `old_dir` into `new_dir` (which must not exist); returns the renamed tensors."""
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    if not (old_dir / "config.json").is_file():
        raise FileNotFoundError(f"{old_dir} has no config.json; pass a saved two-tower model folder.")
    files = weight_files(old_dir)
    check_output_folder(old_dir, new_dir)
    new_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{new_dir.name}.", dir=new_dir.parent))
    try:
        renamed = 0
        for path in sorted(old_dir.iterdir()):
            if path.name in files:
                renamed += convert_weights(path, staging / path.name)
            elif path.name == INDEX_NAME:
                index = read_index(path)
                index["weight_map"] = {new_name(key): file for key, file in index["weight_map"].items()}
                (staging / INDEX_NAME).write_text(json.dumps(index, indent=2), encoding="utf-8")
            elif path.is_file():
                shutil.copy2(path, staging / path.name)
            else:
                shutil.copytree(path, staging / path.name)
        staging.rename(new_dir)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):  # a full disk, a folder changed under the script
            raise ConversionError(f"Writing {new_dir} failed ({error}); its partial copy was removed.") from error
        raise
    return renamed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("old_model_dir", help="a model folder saved with earlier parameter names")
    parser.add_argument("new_model_dir", help="where the converted folder is written (must not exist)")
    args = parser.parse_args()
    try:
        renamed = convert_folder(args.old_model_dir, args.new_model_dir)
    except (FileNotFoundError, FileExistsError, ConversionError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Converted {args.old_model_dir} -> {args.new_model_dir}: {renamed} tensors renamed.")


if __name__ == "__main__":
    main()
