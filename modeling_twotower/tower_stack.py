"""
What every kind of tower stack declares about itself (`TowerStack`), so that the model, the training command and
scoring read a fact from the stack instead of testing `config.tower_type`. One module per kind (`towers_*.py`);
`towers.py` picks the config's.
"""

import torch
from torch import nn

from .batched_layers import TowerStackOutput, concat_towers


class TowerStack(nn.Module):
    """
    A stack of every tower's layers: hidden states [towers, batch, seq, hidden] in, a `TowerStackOutput` out. The
    class attributes are the kind's facts; each kind sets those that differ from these defaults.
    """

    tower_type: str  # the config's `tower_type` of this kind
    kind_name: str  # the kind in messages ("LSTM towers")
    no_split_module: str  # the unit device maps and FSDP keep whole
    has_cache = False  # holds a cache for generation (else generation recomputes the prefix at every step)
    has_attention = False  # returns attention weights (`output_attentions`)
    # Bidirectional, position t reads token t itself, so the masked objective must hide what it predicts (BERT);
    # False for forward + backward pairs, whose position t reads only the tokens before and after it (ELMo).
    sees_predicted_token = False
    accepts_packed_rows = False  # reads position_ids restarting inside a row as separate sequences
    card_names: dict[bool, str]  # the towers on the model card, by bidirectional (each kind names its own)
    card_tags = ()  # the kind's Hub tags

    def extra_flops_per_token(self, block_size: int) -> int:
        """Training FLOPs per token (forward + backward) that no weight's matmul accounts for, e.g. attention scores
        over a context of `block_size`; the weights' share is counted from the built model (training/throughput)."""
        return 0


class KindInitialized:
    """
    A layer of a tower kind that draws some of its weights its own way: the model calls `init_kind_weights` after
    transformers' defaults for the layer's children. Only for a module with parameters of its own (transformers skips
    the initialisation of a custom-code module that has none).
    """

    def init_kind_weights(self, config) -> None:
        raise NotImplementedError


def stack_output(hidden_states: torch.Tensor, output_hidden_states: bool) -> TowerStackOutput:
    """The output of a stack with no attention and one hidden state: its output."""
    return TowerStackOutput(hidden_states, (concat_towers(hidden_states),) if output_hidden_states else (), None)


__all__ = ["KindInitialized", "TowerStack", "TowerStackOutput", "stack_output"]
