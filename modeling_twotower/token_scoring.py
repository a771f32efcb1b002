"""
Which position predicts which target, and the probes' and the joint model's scores there: the part of the two-tower
LMs that scoring, the mean ablation, probe-phase validation and the Space share, so that nobody outside re-derives
the shift.

`TwoTowerTokenScoring` is mixed into the LM classes (modeling_twotower.py), which set `target_shift` (position t
predicts token t + target_shift: 1 for the causal LM, 0 for the masked LM) and provide `probes`, `probe_features`
and `joint_logits`.
"""

import torch
from torch.nn import functional as F

from .input_checks import check_label_values, check_probe_features


class TwoTowerTokenScoring:
    """Position alignment, and the probes' and the joint model's log-probabilities and ablation increases there."""

    def prediction_targets(self, labels: torch.LongTensor) -> torch.LongTensor:
        """The labels aligned with the positions that predict them, [batch, seq - target_shift]; -100: none."""
        return labels[:, self.target_shift :]

    def predicting_positions(self, states: torch.Tensor, seq_dim: int) -> torch.Tensor:
        """`states` (features, logits) at the positions aligned with `prediction_targets`, along `seq_dim`."""
        return states.narrow(seq_dim, 0, states.shape[seq_dim] - self.target_shift)

    def scored_features(self, features: torch.Tensor, labels: torch.LongTensor):
        """
        (features [num_towers, n, hidden], targets [n]) of the n positions that predict a labelled token (not -100),
        in row-major order, from `probe_features`' output [num_towers, batch, seq, hidden] and the labels [batch, seq].
        """
        targets = self.prediction_targets(labels)
        scored = targets != -100
        return self.predicting_positions(features, seq_dim=2)[:, scored], targets[scored]

    def probe_logprobs(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        chunk_size: int | None = None,
        features: torch.Tensor | None = None,
        all_replicas: bool = False,
    ) -> torch.Tensor:
        """
        Each tower's probe log-probability of every target, float32: [num_towers, batch, seq - 1] for the causal LM,
        where entry [i, b, t] is log p_probe_i(labels[b, t + 1] | tokens <= t) and `labels` default to `input_ids`;
        [num_towers, batch, seq] for the masked LM, where `input_ids` hold the masked sequence and `labels` the
        original ids at masked positions (-100 elsewhere). Unlabelled and padding positions give 0.0. The
        vocabulary projection is chunked (see `TwoTowerProbes.forward`), so memory stays bounded on long inputs.
        `features`: `probe_features(input_ids, attention_mask)` if already computed (probe sets on one frozen model
        share it). With `config.probe_replicas` > 1 a tower's entry is the mean over its replicas;
        `all_replicas=True` returns every replica, [num_towers, probe_replicas, batch, seq - target_shift].
        """
        labels = self._checked_labels(input_ids, attention_mask, labels)
        features = self._checked_probe_features(input_ids, attention_mask, features)
        predicting = self.predicting_positions(features, seq_dim=2)
        logprobs = self.probes(predicting, self.prediction_targets(labels), chunk_size=chunk_size)
        return self.probes.per_tower(logprobs, all_replicas)

    def joint_logprobs(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """
        The joint model's log-probability of every target, float32, aligned as `probe_logprobs` is: [batch, seq - 1]
        for the causal LM (the next token; `labels` default to `input_ids`), [batch, seq] for the masked LM (the
        original id at each labelled position). Unlabelled and padding positions give 0.0. `features`:
        `probe_features(input_ids, attention_mask)` if already computed.
        """
        labels = self._checked_labels(input_ids, attention_mask, labels)
        features = self._checked_probe_features(input_ids, attention_mask, features)
        targets = self.prediction_targets(labels)
        logprobs = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
        logprobs[targets != -100] = -self._joint_nll(*self.scored_features(features, labels))
        return logprobs

    def ablation_increases(
        self, scored_features: torch.Tensor, scored_targets: torch.LongTensor, feature_means: torch.Tensor
    ) -> torch.Tensor:
        """
        Each tower's mean-ablation increase [num_towers, n]: the joint model's loss at each scored position (from
        `scored_features`) when that tower's features are replaced by its mean `feature_means` [num_towers, hidden]
        (e.g. over a text's scored positions), less its loss with every tower's own features.
        """
        joint = self._joint_nll(scored_features, scored_targets)
        increases = []
        for tower, mean in enumerate(feature_means):
            ablated = scored_features.clone()
            ablated[tower] = mean.to(ablated.dtype)
            increases.append(self._joint_nll(ablated, scored_targets) - joint)
        return torch.stack(increases)

    def _joint_nll(self, scored_features: torch.Tensor, scored_targets: torch.LongTensor) -> torch.Tensor:
        # the joint model's NLL [n] at scored positions, from their features [towers, n, hidden]
        logits = self.joint_logits(scored_features.unsqueeze(1))[0]  # [n, vocab]
        return F.cross_entropy(logits.float(), scored_targets, reduction="none")

    def _checked_labels(self, input_ids, attention_mask, labels):
        if labels is None and self.target_shift == 0:
            raise ValueError(
                "A masked LM scores masked positions: pass `labels` (original ids where input_ids hold the mask "
                "token, -100 elsewhere)."
            )
        labels = input_ids if labels is None else labels
        if labels.shape != input_ids.shape:
            raise ValueError(f"`labels` has shape {tuple(labels.shape)}, expected {tuple(input_ids.shape)}.")
        check_label_values(labels, self.config.vocab_size)
        return labels if attention_mask is None else labels.masked_fill(attention_mask == 0, -100)

    def _checked_probe_features(self, input_ids, attention_mask, features):
        if features is None:
            return self.probe_features(input_ids, attention_mask)
        check_probe_features(self.config, features, input_ids)
        return features
