"""
Convert a two-tower model folder saved with earlier parameter names to today's names, into a new folder.

    python scripts/convert_checkpoint.py OLD_MODEL_DIR NEW_MODEL_DIR

Earlier versions kept the LM heads' layers on the LM model itself (`fusion_dense`, `fusion_output_norm`, the tied
decoder as `lm_head.weight`, the control's heads as `tower_lm_heads`) and the base model's parts as names inside it
(`embed_positions`, `layers`, `lstm_towers`, ...) before `embeddings`, `towers` and `fusion` were modules. The
weights (`model.safetensors`, or the shards its index names) are read and written as safetensors, renamed and
otherwise unchanged; every other file is copied. The input folder is never written; the output folder must not
exist yet, and appears only once complete.
"""

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

from safetensors import safe_open
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


def new_name(key: str) -> str:
    """Today's name of a parameter saved as `key`."""
    for old, new in RENAMES:
        key = re.sub(f"^{re.escape(old)}", new, key)
    return key


def weight_files(folder: Path) -> list[str]:
    """The folder's weight files: model.safetensors, or the shards its index names."""
    if (folder / INDEX_NAME).is_file():
        return sorted(set(json.loads((folder / INDEX_NAME).read_text(encoding="utf-8"))["weight_map"].values()))
    if (folder / WEIGHTS_NAME).is_file():
        return [WEIGHTS_NAME]
    raise FileNotFoundError(f"{folder} holds neither {WEIGHTS_NAME} nor {INDEX_NAME}; pass a saved model folder.")


def convert_weights(source: Path, target: Path) -> int:
    """Write `source` (a safetensors file) renamed to `target`; returns the number of renamed tensors."""
    with safe_open(source, framework="pt") as weights:
        metadata = weights.metadata()
        tensors = {new_name(key): weights.get_tensor(key) for key in weights.keys()}
        renamed = sum(new_name(key) != key for key in weights.keys())
    save_file(tensors, target, metadata=metadata)
    return renamed


def convert_folder(old_dir, new_dir) -> int:
    """Convert the model folder `old_dir` into `new_dir` (which must not exist); returns the renamed tensors."""
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    if not (old_dir / "config.json").is_file():
        raise FileNotFoundError(f"{old_dir} has no config.json; pass a saved two-tower model folder.")
    if new_dir.exists():
        raise FileExistsError(f"{new_dir} exists; give a new folder for the converted model (nothing is replaced).")
    files = weight_files(old_dir)
    new_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{new_dir.name}.", dir=new_dir.parent))
    try:
        renamed = 0
        for path in sorted(old_dir.iterdir()):
            if path.name in files:
                renamed += convert_weights(path, staging / path.name)
            elif path.name == INDEX_NAME:
                index = json.loads(path.read_text(encoding="utf-8"))
                index["weight_map"] = {new_name(key): file for key, file in index["weight_map"].items()}
                (staging / INDEX_NAME).write_text(json.dumps(index, indent=2), encoding="utf-8")
            elif path.is_file():
                shutil.copy2(path, staging / path.name)
            else:
                shutil.copytree(path, staging / path.name)
        staging.rename(new_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return renamed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("old_model_dir", help="a model folder saved with earlier parameter names")
    parser.add_argument("new_model_dir", help="where the converted folder is written (must not exist)")
    args = parser.parse_args()
    try:
        renamed = convert_folder(args.old_model_dir, args.new_model_dir)
    except (FileNotFoundError, FileExistsError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Converted {args.old_model_dir} -> {args.new_model_dir}: {renamed} tensors renamed.")


if __name__ == "__main__":
    main()
