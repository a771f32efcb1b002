"""
The LM heads that turn the towers' normalized concatenation into next-token logits: the paper's fusion head, or
the independent-towers control's per-tower heads. A model holds one of them as `lm_head`, chosen by
`config.cooperative`; both are called the same way and return (logits, loss). A cooperative model with
`config.tower_heads` also holds `tower_heads`: each tower's own head and loss beside the fusion head.
"""

import math

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import fixed_cross_entropy

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear, concat_towers, split_towers
from .configuration_twotower import TwoTowerConfig
from .linear_cross_entropy import linear_cross_entropy


def keep_positions(states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    # `logits_to_keep` of GenerationMixin along the sequence axis (-2): 0 keeps all, n the last n, a tensor indexes
    if isinstance(logits_to_keep, torch.Tensor):
        return states[..., logits_to_keep, :]
    return states[..., -logits_to_keep:, :] if logits_to_keep > 0 else states


class TwoTowerLMHead(nn.Module):
    """
    How a model's `lm_head` is called, whichever it is: (logits, loss) of the base model's output. A head defines
    `logits` (of the kept positions, for generation) and `logits_and_loss` (of every position, given targets).
    """

    def forward(
        self,
        fused_hidden_states: torch.Tensor,
        target_ids: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: torch.Tensor | int | None = None,
        skip_logits: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """
        Logits [batch, kept positions, vocab] from fused_hidden_states [batch, seq, towers * hidden], and with
        `target_ids` (the label each position predicts, -100 for none) the loss: a token mean, or a sum divided by
        `num_items_in_batch`. `skip_logits` (with `target_ids`): the loss alone and no logits (None), a training
        step's fastest path.
        """
        if target_ids is None:  # the vocabulary projection of the kept positions only
            return self.logits(keep_positions(fused_hidden_states, logits_to_keep)), None
        logits, loss = self.logits_and_loss(fused_hidden_states, target_ids, num_items_in_batch, skip_logits)
        return (None if skip_logits else keep_positions(logits, logits_to_keep)), loss


class TwoTowerFusionHead(TwoTowerLMHead):
    """
    The paper's head, which joins the towers: the normalized concatenation (the base model's `fusion`) ->
    Linear + activation -> LayerNorm -> decoder tied to the shared embedding, plus an output bias. The Linear
    goes down to the embedding's width (the same width by default), which the tied decoder needs.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.dense = nn.Linear(config.fused_hidden_size, config.embedding_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size, bias=True)  # bias: the output bias

    def joint_logits(self, features: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> [batch, seq, vocab]
        return self.decoder(self.norm(self.act_fn(self.dense(concat_towers(features)))))

    def logits(self, fused_hidden_states: torch.Tensor) -> torch.Tensor:
        # [batch, seq, towers * hidden] -> [batch, seq, vocab]
        return self.decoder(self.norm(self.act_fn(self.dense(fused_hidden_states))))

    def logits_and_loss(self, fused_hidden_states, target_ids, num_items_in_batch, skip_logits: bool):
        """The logits and the token-mean cross-entropy; with `skip_logits`, the loss alone, from the decoder's input
        by `linear_cross_entropy`."""
        decoder_inputs = self.norm(self.act_fn(self.dense(fused_hidden_states)))
        if skip_logits:
            loss = linear_cross_entropy(
                decoder_inputs, self.decoder.weight, self.decoder.bias, target_ids, num_items_in_batch
            )
            return None, loss
        logits = self.decoder(decoder_inputs)
        # in float32, as transformers' own LM losses
        loss = fixed_cross_entropy(logits.float().view(-1, self.vocab_size), target_ids.reshape(-1), num_items_in_batch)
        return logits, loss


class TwoTowerIndependentHeads(TwoTowerLMHead):
    """
    The independent-towers control (`cooperative=False`): each tower has its own LM head (probe-shaped: Linear,
    activation, LayerNorm, decoder; untied) and its own loss, the losses summed. The logits are the towers'
    equal-weight mixture, as log-probabilities.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.num_towers = config.num_towers
        self.dense = TwoTowerBatchedLinear(config.num_towers, config.hidden_size, config.probe_hidden_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = TwoTowerBatchedLayerNorm(config.num_towers, config.probe_hidden_size, config.layer_norm_eps)
        self.decoder = TwoTowerBatchedLinear(config.num_towers, config.probe_hidden_size, config.vocab_size)

    def decoder_inputs(self, features: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> what each tower's decoder reads [towers, batch, seq, probe_hidden_size]
        return self.norm(self.act_fn(self.dense(features)))

    def tower_logprobs(self, features: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> each tower's own log-probabilities [towers, batch, seq, vocab]
        return self.decoder(self.decoder_inputs(features)).float().log_softmax(-1)

    def mixture(self, tower_logprobs: torch.Tensor) -> torch.Tensor:
        # the towers' equal-weight mixture, as log-probabilities [batch, seq, vocab]
        return torch.logsumexp(tower_logprobs, dim=0) - math.log(self.num_towers)

    def joint_logits(self, features: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> [batch, seq, vocab]
        return self.mixture(self.tower_logprobs(features))

    def loss(self, tower_logprobs, target_ids, num_items_in_batch=None):
        """Sum over towers of each tower's own token-mean cross-entropy."""
        ignored = target_ids.eq(-100)
        targets = target_ids.masked_fill(ignored, 0).expand(tower_logprobs.shape[0], -1, -1).unsqueeze(-1)
        gold_logprobs = tower_logprobs.gather(-1, targets).squeeze(-1).masked_fill(ignored, 0.0)
        num_items = num_items_in_batch if num_items_in_batch is not None else (~ignored).sum()
        return -gold_logprobs.sum() / num_items

    def logits(self, fused_hidden_states: torch.Tensor) -> torch.Tensor:
        # [batch, seq, towers * hidden] -> [batch, seq, vocab]
        return self.joint_logits(split_towers(fused_hidden_states, self.num_towers))

    def logits_and_loss(self, fused_hidden_states, target_ids, num_items_in_batch, skip_logits: bool):
        """The mixture's logits and the sum over towers of each tower's own loss, from one vocabulary projection."""
        tower_logprobs = self.tower_logprobs(split_towers(fused_hidden_states, self.num_towers))
        loss = self.loss(tower_logprobs, target_ids, num_items_in_batch)
        return (None if skip_logits else self.mixture(tower_logprobs)), loss


class TwoTowerTowerHeads(nn.Module):
    """
    Each tower's own LM head beside a cooperative model's fusion head (`config.tower_heads`): the tower's output
    through a LayerNorm of its own (no statistic shared between towers, unlike the fusion's), then the control's
    probe-shaped head. Its loss is the sum over towers of each tower's own token-mean cross-entropy, computed piece
    by piece without the logits (`linear_cross_entropy`); each tower's loss reaches that tower only.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.norm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        self.heads = TwoTowerIndependentHeads(config)

    def tower_logprobs(self, tower_hidden_states: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> each tower's own log-probabilities [towers, batch, seq, vocab]
        return self.heads.tower_logprobs(self.norm(tower_hidden_states))

    def forward(
        self,
        tower_hidden_states: torch.Tensor,
        target_ids: torch.LongTensor,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """The summed loss of the towers' own heads: tower_hidden_states [towers, batch, seq, hidden], target_ids
        [batch, seq] (-100 for none); each tower's loss is a token mean, or a sum divided by `num_items_in_batch`."""
        decoder_inputs = self.heads.decoder_inputs(self.norm(tower_hidden_states))
        decoder = self.heads.decoder  # weight [towers, in, vocab]: tower t's as a Linear weight is weight[t].T
        return sum(
            linear_cross_entropy(inputs, decoder.weight[tower].t(), decoder.bias[tower], target_ids, num_items_in_batch)
            for tower, inputs in enumerate(decoder_inputs)
        )


__all__ = ["TwoTowerLMHead", "TwoTowerFusionHead", "TwoTowerIndependentHeads", "TwoTowerTowerHeads", "keep_positions"]
