"""
Parameter names of earlier versions, renamed as their weights load, so that every saved model and checkpoint keeps
loading: `LEGACY_KEY_MAPPING` for `from_pretrained` (its `key_mapping`), `rename_legacy_keys` for `load_state_dict`
(training checkpoints, which accelerate restores). Read at load time only, not registered as the model type's
conversion mapping: transformers would reverse that on save and expects every saved key to go through it.
"""

import re

# Before the LM heads were modules of their own: the fusion head's layers and the tied decoder sat on the LM model
# itself, and the control's per-tower heads were called tower_lm_heads.
HEAD_KEY_MAPPING = {
    "^fusion_dense": "lm_head.dense",
    "^fusion_output_norm": "lm_head.norm",
    "^lm_head.weight": "lm_head.decoder.weight",
    "^lm_head.bias": "lm_head.decoder.bias",
    "^tower_lm_heads": "lm_head",
}
# Before the base model held what the towers read of the embedding, their stack and their fusion as modules
# (embeddings.py, towers.py, fusion.py), as names inside the base model; the token embedding kept its name
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
BASE_MODEL_PREFIX = "model."  # TwoTowerPreTrainedModel.base_model_prefix: the base model inside an LM model
# a base model saved alone, and inside an LM model
LEGACY_KEY_MAPPING = {
    **HEAD_KEY_MAPPING,
    **{f"^{re.escape(old)}": new for old, new in BASE_MODEL_RENAMES.items()},
    **{f"^{re.escape(BASE_MODEL_PREFIX + old)}": BASE_MODEL_PREFIX + new for old, new in BASE_MODEL_RENAMES.items()},
}


def rename_legacy_keys(module, state_dict: dict, prefix: str, *args) -> None:
    """A load_state_dict pre-hook of the base model: its earlier versions' names, in place, to today's."""
    for key in [key for key in state_dict if key.startswith(prefix)]:
        name = key[len(prefix) :]
        old = next((old for old in BASE_MODEL_RENAMES if name.startswith(old)), None)
        if old is not None:
            state_dict[prefix + BASE_MODEL_RENAMES[old] + name[len(old) :]] = state_dict.pop(key)


__all__ = ["LEGACY_KEY_MAPPING", "rename_legacy_keys"]
