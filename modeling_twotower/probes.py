"""The probes: per-tower heads trained on the frozen model's features, which the preference measurement reads."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.activations import ACT2FN

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear
from .configuration_twotower import TwoTowerConfig
from .linear_cross_entropy import linear_cross_entropy

# Budget for one chunk of probe logits, [towers, positions, vocab] in float32 (256 MiB).
PROBE_LOGITS_CHUNK_BYTES = 256 * 2**20


class TwoTowerProbes(nn.Module):
    """
    Probes that each read one tower's slice of the normalized concatenation, all batched along a probe dimension.

    `num_replicas` probes per tower, tower-major: probe `t * num_replicas + r` is replica r of tower t, each with
    its own initial weights, so that the preference can be tested against the spread between probes of one
    tower. `probe_type` "mlp" is the paper's probe (Linear to `config.probe_hidden_size`, GELU, LayerNorm, Linear
    to the vocabulary; not tied); "linear" is softmax regression on the slice (the vocabulary projection alone),
    a convex problem with one optimum. Probes are trained in the probe phase on a frozen model and are what the
    preference measurement reads.
    """

    def __init__(self, config: TwoTowerConfig, num_replicas: int = 1, probe_type: str = "mlp"):
        super().__init__()
        self.num_towers = config.num_towers
        self.num_replicas = num_replicas
        self.probe_type = probe_type
        num_probes = config.num_towers * num_replicas
        decoder_in_features = config.hidden_size
        if probe_type == "mlp":
            decoder_in_features = config.probe_hidden_size
            self.dense = TwoTowerBatchedLinear(num_probes, config.hidden_size, decoder_in_features)
            self.act_fn = ACT2FN[config.hidden_act]
            self.norm = TwoTowerBatchedLayerNorm(num_probes, decoder_in_features, config.layer_norm_eps)
        self.decoder = TwoTowerBatchedLinear(num_probes, decoder_in_features, config.vocab_size)

    @property
    def num_probes(self) -> int:
        return self.num_towers * self.num_replicas

    def per_probe(self, features: torch.Tensor) -> torch.Tensor:
        """[towers, ...] -> [probes, ...]: each tower's features for each of its replicas (a view when possible)."""
        if features.shape[0] == self.num_probes:
            return features
        if features.shape[0] != self.num_towers:
            raise ValueError(
                f"`features` has {features.shape[0]} rows; expected {self.num_towers} (one per tower) or "
                f"{self.num_probes} (one per probe)."
            )
        if self.num_replicas == 1:
            return features
        expanded = features.unsqueeze(1).expand(self.num_towers, self.num_replicas, *features.shape[1:])
        return expanded.reshape(self.num_probes, *features.shape[1:])

    def per_tower(self, gold_logprobs: torch.Tensor, all_replicas: bool = False) -> torch.Tensor:
        """[probes, ...] -> [towers, replicas, ...], or with `all_replicas=False` the replica mean [towers, ...]."""
        per_tower = gold_logprobs.view(self.num_towers, self.num_replicas, *gold_logprobs.shape[1:])
        return per_tower if all_replicas else per_tower.mean(dim=1)

    def transform(self, features: torch.Tensor) -> torch.Tensor:
        # [probes, ..., hidden] -> [probes, ..., hidden], the input of the vocabulary projection
        if self.probe_type == "linear":
            return features
        return self.norm(self.act_fn(self.dense(features)))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Full logits [probes, ..., vocab] from [towers or probes, ..., hidden]; for a few positions only."""
        return self.decoder(self.transform(self.per_probe(features)))

    def forward(
        self, features: torch.Tensor, target_ids: torch.LongTensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        """
        Each probe's log-probability of `target_ids`.

        Args:
            features: [towers, batch, seq, hidden], from `probe_features` of the LM classes (or [probes, ...]).
            target_ids: [batch, seq], aligned with `features`; -100 marks positions to skip (they give 0.0).
            chunk_size: positions per chunk of the vocabulary projection (see `score_positions`). Only positions
                whose target is not -100 are projected.

        Returns:
            gold log-probabilities [probes, batch, seq], float32, probes tower-major.
        """
        _, batch, seq, hidden = features.shape
        if target_ids.shape != (batch, seq):
            raise ValueError(f"`target_ids` has shape {tuple(target_ids.shape)}, expected {(batch, seq)}.")
        features = features.reshape(features.shape[0], batch * seq, hidden)
        targets = target_ids.reshape(-1)
        # Only scored positions reach the vocabulary projection (a masked LM scores ~15% of them).
        scored = (targets != -100).nonzero().squeeze(-1)
        every_position = scored.numel() == targets.numel()  # causal LMs: nothing to gather
        if not every_position:
            features, targets = features.index_select(1, scored), targets.index_select(0, scored)
        gold_logprobs = self.score_positions(features, targets, chunk_size)
        if not every_position:
            gold_logprobs = gold_logprobs.new_zeros(self.num_probes, batch * seq).index_copy(1, scored, gold_logprobs)
        return gold_logprobs.view(self.num_probes, batch, seq)

    def score_positions(
        self, features: torch.Tensor, targets: torch.LongTensor, chunk_size: int | None = None
    ) -> torch.Tensor:
        """
        Gold log-probabilities [probes, n] of scored positions: features [towers or probes, n, hidden], targets
        [n] (shared by every probe) or [probes, n] (each probe its own positions, e.g. its own data order).

        The vocabulary projection runs in chunks of `chunk_size` positions, by default chosen so that one chunk
        of [probes, chunk, vocab] float32 logits stays under 256 MiB: [probes, n, vocab] logits never exist at
        once, and under autograd chunks (when there are several) are recomputed in backward instead of kept.
        """
        transformed = self.transform(self.per_probe(features))
        targets = targets.expand(self.num_probes, -1)
        num_positions = targets.shape[1]
        if chunk_size is None:
            chunk_size = max(1, PROBE_LOGITS_CHUNK_BYTES // (4 * self.num_probes * self.decoder.weight.shape[-1]))
        # Under autograd, chunks are recomputed in backward rather than kept; one chunk is kept, since backward
        # starts with it (nothing runs after the probes) and recomputing it would not lower the peak.
        recompute = num_positions > chunk_size and torch.is_grad_enabled()
        recompute = recompute and (transformed.requires_grad or self.decoder.weight.requires_grad)
        chunks = [transformed.new_zeros(self.num_probes, 0, dtype=torch.float32)]  # a batch may score nothing
        for start in range(0, num_positions, chunk_size):
            args = (transformed[:, start : start + chunk_size], targets[:, start : start + chunk_size])
            if recompute:
                chunks.append(checkpoint(self._gold_logprobs, *args, use_reentrant=False))
            else:
                chunks.append(self._gold_logprobs(*args))
        return torch.cat(chunks, dim=1)

    def summed_loss(self, features: torch.Tensor, targets: torch.LongTensor, num_items) -> torch.Tensor:
        """
        The probe phase's loss: over probes, each probe's summed NLL of `targets` divided by `num_items`, from
        features [towers or probes, n, hidden] and targets [n] or [probes, n]. Equal to
        `-score_positions(features, targets).sum() / num_items` to float tolerance, without the logits: each
        probe's decoder and loss run by `linear_cross_entropy`, gradients with the loss.
        """
        transformed = self.transform(self.per_probe(features))
        targets = targets.expand(self.num_probes, -1)
        weight, bias = self.decoder.weight, self.decoder.bias  # [probes, hidden, vocab], [probes, vocab]
        losses = [
            linear_cross_entropy(transformed[probe], weight[probe].t(), bias[probe], targets[probe], num_items)
            for probe in range(self.num_probes)
        ]
        return torch.stack(losses).sum()

    def _gold_logprobs(self, transformed: torch.Tensor, targets: torch.LongTensor) -> torch.Tensor:
        # [probes, chunk, hidden] -> [probes, chunk, vocab] -> [probes, chunk]; one fused log-softmax kernel
        # (forward and backward) is faster than gold logit minus logsumexp, which makes several passes
        logprobs = self.decoder(transformed).float().log_softmax(dim=-1)
        return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


__all__ = ["TwoTowerProbes"]
