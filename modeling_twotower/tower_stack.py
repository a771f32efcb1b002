"""
What every kind of tower stack declares about itself (`TowerStack`), so that the config, the model, the training
command, scoring and the model card read a fact from the stack instead of testing `config.tower_type`. One module per
kind (`towers_*.py`); `towers.py` lists the kinds and picks the config's.
"""

import torch
from torch import nn

from .batched_layers import TowerStackOutput, concat_towers


class TowerStack(nn.Module):
    """
    A stack of every tower's layers: hidden states [towers, batch, seq, hidden] in, a `TowerStackOutput` out, built
    as `Stack(config, bidirectional)`. The class attributes are the kind's facts; each kind sets those that differ
    from these defaults (docs/development.md, "The tower-kind contract").
    """

    # Which configs build it
    tower_type: str  # the config's `tower_type` of this kind
    layouts: tuple[str, ...]  # the config's layouts it builds towers in (`stack_class` gives a layout's own stack)
    directions = (False, True)  # the towers it builds: causal (False) and bidirectional (True, the masked family)
    # config fields besides hidden_size that size its weights: the config refuses them for other kinds, and loading
    # names one edited in a saved config.json (checkpoint_checks.py)
    size_fields: tuple[str, ...] = ()
    kind_name: str  # the kind in messages ("LSTM towers")
    no_split_module: str  # the unit device maps and FSDP keep whole

    # What it does
    has_cache = False  # holds a cache for generation (else generation recomputes the prefix at every step)
    has_attention = False  # returns attention weights (`output_attentions`); `hidden_size` splits into heads
    # Bidirectional, position t reads token t itself, so the masked objective must hide what it predicts (BERT);
    # False for forward + backward pairs, whose position t reads only the tokens before and after it (ELMo).
    sees_predicted_token = False
    accepts_packed_rows = False  # reads position_ids restarting inside a row as separate sequences
    # initialization="reference": layer type -> its draw (module, config), for the kind's own layers; the layers
    # every kind shares (embeddings, Linear, batched Linear, LayerNorms) draw as reference_initialization.py says
    reference_initializers = {}

    # The model card's words (evaluation/publishing/model_card.py), by bidirectional
    card_names: dict[bool, str]  # the towers in a phrase: "{num_towers} {name} towers of identical shape"
    card_size_rows: tuple[tuple[str, str], ...] = ()  # (row label, config field) of its sizes in the card's table
    card_limitations: dict[bool, str] = {}  # a line under "Limitations and bias", where the kind needs one
    card_tags = ()  # the kind's Hub tags

    @classmethod
    def stack_class(cls, layout: str) -> type["TowerStack"]:
        """The stack of this kind in `layout` (one of `layouts`): this class, unless the layout has a stack of its
        own (the reference's ELMo layout)."""
        return cls

    @classmethod
    def card_architecture(cls, config, bidirectional: bool) -> str:
        """What each tower is, completing the card's sentence "...; each tower is ___." (config: a TwoTowerConfig)."""
        raise NotImplementedError

    def extra_flops_per_token(self, block_size: int) -> int:
        """Training FLOPs per token (forward + backward) that no weight's matmul accounts for, e.g. attention scores
        over a context of `block_size`; the weights' share is counted from the built model (training/throughput)."""
        return 0


class KindInitialized:
    """
    A layer of a tower kind that draws some of its weights its own way: the model calls `init_kind_weights` after the
    layer's children are drawn, by either initialisation. Only for a module with parameters of its own (transformers skips
    the initialisation of a custom-code module that has none).
    """

    def init_kind_weights(self, config) -> None:
        raise NotImplementedError


def stack_output(hidden_states: torch.Tensor, output_hidden_states: bool) -> TowerStackOutput:
    """The output of a stack with no attention and one hidden state: its output."""
    return TowerStackOutput(hidden_states, (concat_towers(hidden_states),) if output_hidden_states else (), None)


__all__ = ["KindInitialized", "TowerStack", "TowerStackOutput", "stack_output"]
