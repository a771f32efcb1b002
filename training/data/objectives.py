"""What the objective changes: the model class, how blocks become batches (masking), and what each position predicts.

`causal`: TwoTowerForCausalLM, position t predicts token t + 1 (labels = input_ids, shifted inside the model).
`masked`: TwoTowerForMaskedLM. Transformer towers see their own token, so 15% of the tokens are selected and
replaced 80/10/10 ([MASK] / random / unchanged) by transformers' masking collator, and only those are predicted.
ELMo-style bidirectional LSTM towers never read token t when predicting it, so every token is predicted unmasked.
"""

import hashlib

import numpy as np
import torch
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, DataCollatorForLanguageModeling

from .blocks import collate_blocks

OBJECTIVES = ("causal", "masked")
ARCHITECTURES = {"causal": "TwoTowerForCausalLM", "masked": "TwoTowerForMaskedLM"}
AUTO_CLASSES = {"causal": AutoModelForCausalLM, "masked": AutoModelForMaskedLM}
MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}


def objective_of(model_or_config) -> str:
    """
    `causal` or `masked`, for a two-tower model (its class) or config (or config.json dict): from the class it was
    saved by (`architectures`), else from `bidirectional` (masked LMs have bidirectional towers).
    """
    class_names = {cls.__name__ for cls in type(model_or_config).__mro__}  # also the Hub code's classes
    for objective, architecture in ARCHITECTURES.items():
        if architecture in class_names:
            return objective
    model_config = getattr(model_or_config, "config", model_or_config)
    fields = model_config if isinstance(model_config, dict) else model_config.to_dict()
    for objective, architecture in ARCHITECTURES.items():
        if architecture in (fields.get("architectures") or []):
            return objective
    if fields.get("bidirectional") is not None:
        return "masked" if fields["bidirectional"] else "causal"
    raise ValueError(
        f"The config names architectures {fields.get('architectures')!r}, none of {sorted(ARCHITECTURES.values())}, "
        f"and no `bidirectional`; pass a model folder saved by the twotower training command."
    )


def needs_masking(objective: str, towers) -> bool:
    """Whether a masked model must hide the tokens it predicts: its stack `towers` (a TowerStack, or its class,
    `model.model.towers` or `tower_stack_class(config)`) sees them (transformers) or not (ELMo-style pairs)."""
    return objective == "masked" and towers.sees_predicted_token


def target_shift(objective: str) -> int:
    """How far ahead position t predicts: 1 for a causal LM (token t + 1), 0 for a masked LM (token t itself)."""
    return MODEL_CLASSES[objective].target_shift  # the model's alignment, for code that holds no model


def prediction_targets(labels: torch.LongTensor, objective: str) -> torch.LongTensor:
    """The labels aligned with the positions that predict them: [batch, seq - shift]; -100 predicts nothing."""
    return labels[:, target_shift(objective) :]


def predicting_positions(states: torch.Tensor, objective: str, seq_dim: int) -> torch.Tensor:
    """`states` (logits or features) at the positions aligned with `prediction_targets` along `seq_dim`."""
    return states.narrow(seq_dim, 0, states.shape[seq_dim] - target_shift(objective))


class SeededMaskingCollator(DataCollatorForLanguageModeling):
    """
    transformers' masking collator (mlm_probability selection, 80/10/10 replacement) with masks that depend only
    on the seed, the epoch and the block itself: not on the batch, the process or how many batches came before.
    So a run resumed mid-epoch, and a run on N processes, mask every block exactly as one uninterrupted process.
    """

    def __init__(self, tokenizer, mlm_probability: float, seed: int):
        super().__init__(tokenizer=tokenizer, mlm=True, mlm_probability=mlm_probability)
        self.masking_seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """New masks every epoch (dynamic masking), the same ones for every process and every resumption."""
        self.epoch = epoch

    def _block_generator(self, input_ids: torch.LongTensor) -> torch.Generator:
        key = np.array([self.masking_seed, self.epoch], dtype=np.int64).tobytes() + input_ids.numpy().tobytes()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)
        return torch.Generator().manual_seed(seed)

    def torch_call(self, examples: list[dict]) -> dict:
        input_ids = torch.stack([example["input_ids"] for example in examples])  # [batch, block_size]
        masked_ids, labels = [], []
        for block in input_ids:
            self.generator = self._block_generator(block)  # torch_mask_tokens draws every choice from it
            block_ids, block_labels = self.torch_mask_tokens(block.clone().unsqueeze(0))
            masked_ids.append(block_ids)
            labels.append(block_labels)
        batch = {"input_ids": torch.cat(masked_ids), "labels": torch.cat(labels)}
        if "attention_mask" in examples[0]:  # sentence-pair blocks: padding is never selected (a special token)
            batch["attention_mask"] = torch.stack([example["attention_mask"] for example in examples])
        return batch


def check_tokenizer_for_objective(tokenizer, objective: str, towers) -> None:
    if needs_masking(objective, towers) and tokenizer.mask_token is None:
        raise ValueError(
            f"The masked objective with transformer towers needs a tokenizer with a mask token, and "
            f"{type(tokenizer).__name__} ({len(tokenizer)} tokens) has none. Use a BERT WordPiece vocabulary "
            f"(--tokenizer_name_or_path .../bert-base-uncased) or let the run train its BPE (it adds <mask>)."
        )


def make_collators(objective: str, towers, tokenizer, mlm_probability: float, seed: int):
    """(train collator, validation collator). Validation masks stay fixed (epoch 0), so evaluations compare."""
    if not needs_masking(objective, towers):
        return collate_blocks, collate_blocks
    check_tokenizer_for_objective(tokenizer, objective, towers)
    return (
        SeededMaskingCollator(tokenizer, mlm_probability, seed),
        SeededMaskingCollator(tokenizer, mlm_probability, seed),
    )
