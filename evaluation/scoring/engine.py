"""
The scoring engine: one pass of the towers per batch of blocks feeds the joint model's negative log-likelihood, the
gold log-probabilities of any number of probe sets trained on that frozen model, and each set's preference
accumulator.
"""

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from twotower.training.data.objectives import needs_masking, objective_of

from ..tower_preference.measures import PROBE_FREE_MEASURES, probe_free_measure
from ..tower_preference.preference_stats import PreferenceAccumulator
from ..tower_preference.replica_preference import ReplicaPreferenceAccumulator


DEFAULT_MASK_PASSES = round(1 / 0.15)  # as many passes as a 15% masking needs to cover every token: 7


def scoring_passes(input_ids, objective, towers, mask_passes, mask_token_id, scorable=None):
    """
    (inputs, labels) of each pass over a batch [batch, seq]; together the passes score every token exactly once.

    causal: one pass, every next token (labels = input_ids, shifted inside the model). masked with transformer
    towers: pass k replaces the positions p with p % mask_passes == k by the mask token (no 80/10/10: the score
    of a token must not depend on a random draw) and labels them. ELMo-style LSTM towers: one unmasked pass.
    `scorable` [batch, seq] (sentence-pair blocks): the positions that may be scored or masked; None for all.
    `towers`: the model's stack (`model.model.towers`), which says whether it sees the token it predicts.
    """
    if not needs_masking(objective, towers):
        yield input_ids, input_ids if scorable is None else input_ids.masked_fill(~scorable, -100)
        return
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    for index in range(mask_passes):
        masked = (position % mask_passes == index).expand_as(input_ids)  # [batch, seq]
        if scorable is not None:
            masked = masked & scorable
        yield input_ids.masked_fill(masked, mask_token_id), input_ids.masked_fill(~masked, -100)


def preference_accumulator(config, pair_replicas=True):
    """
    The accumulator of a model's probes: with one probe per tower the occurrence-level statistics; with replicas
    the replica-level ones, pairing replica r of every tower (trained on one data order) unless told not to.
    """
    if config.probe_replicas == 1:
        return PreferenceAccumulator(num_towers=config.num_towers, vocab_size=config.vocab_size)
    probe_towers = np.repeat(np.arange(config.num_towers), config.probe_replicas).tolist()
    probe_runs = np.tile(np.arange(config.probe_replicas), config.num_towers).tolist() if pair_replicas else None
    return ReplicaPreferenceAccumulator(probe_towers, probe_runs, vocab_size=config.vocab_size)


@dataclass
class ScoredPass:
    """One scoring pass over a batch of blocks, as every consumer of `score_blocks` sees it."""

    scored: torch.Tensor  # [batch, seq - shift] bool: the predicting positions of this pass
    shift: int  # position t predicts token t + shift
    token_ids: np.ndarray  # [n] the scored tokens, row by row
    joint_nll: torch.Tensor  # [n] the joint model's NLL of each
    probe_gold: list  # one [probes, n] float32 array of gold log-probabilities per probe set, tower-major
    features: torch.Tensor | None = None  # [towers, batch, seq, hidden]: `probe_features` of the pass's inputs
    labels: torch.Tensor | None = None  # [batch, seq]: the pass's labels, -100 where not scored
    increases: dict = field(default_factory=dict)  # probe-free measure name -> [towers, n] its increases, once fed

    @property
    def ablation_increases(self) -> np.ndarray | None:
        """[towers, n]: the joint NLL's rise with each tower mean-ablated, where the mean ablation was measured."""
        return self.increases.get("ablation")


class PassConsumer(Protocol):
    """What `score_blocks` feeds: each batch as it starts, then each of its scoring passes."""

    def begin_batch(self, batch: dict) -> None: ...

    def update_pass(self, scored_pass: ScoredPass) -> None: ...


@dataclass
class BlockScores:
    """What `score_blocks` summed: scored positions, the joint model's NLL, each probe set's NLL and accumulator."""

    accumulators: list  # one per probe set, fed every scored position
    probe_nll_sums: list  # one [probes] float64 array per probe set, tower-major as in `TwoTowerProbes`
    joint_nll_sum: float = 0.0
    num_targets: int = 0
    measures: dict = field(default_factory=dict)  # probe-free measure name -> its consumer (InterventionScores)

    @property
    def ablation(self):
        """The mean ablation's consumer (tower_preference/mean_ablation.py: MeanAblation), when it was measured."""
        return self.measures.get("ablation")

    @property
    def joint_mean_nll(self) -> float:
        return self.joint_nll_sum / self.num_targets

    def probe_mean_nll(self, probe_set: int = 0) -> list[float]:
        """Token-weighted mean NLL of every probe of one probe set, tower-major."""
        return (self.probe_nll_sums[probe_set] / self.num_targets).tolist()

    def begin_batch(self, batch) -> None:
        pass

    def update_pass(self, scored_pass: ScoredPass) -> None:
        self.joint_nll_sum += scored_pass.joint_nll.sum().item()
        self.num_targets += scored_pass.token_ids.shape[0]
        for nll_sum, accumulator, gold in zip(self.probe_nll_sums, self.accumulators, scored_pass.probe_gold):
            nll_sum -= gold.astype(np.float64).sum(axis=1)
            accumulator.update(scored_pass.token_ids, gold)


class ScoredPassages:
    """
    The first `max_blocks` blocks as scored: their token ids and every probe's gold log-probability at each token,
    recorded inside `score_blocks`' one pass over the model: the token view's passages (tower_preference.token_view).
    """

    def __init__(self, max_blocks: int, probe_set: int = 0):
        self.max_blocks = max_blocks
        self.probe_set = probe_set  # whose probes are recorded, of score_blocks' probe_models
        self.input_ids = []  # one [seq] int64 array per block
        self.attention_mask = []  # one [seq] bool array per block: False on the padding of sentence-pair blocks
        self.gold_logprobs = []  # one [probes, seq] float32 array per block, NaN where no token was scored
        self._rows = 0  # rows of the current batch that are recorded
        self._batch_gold = None  # [probes, rows, seq] of the current batch, filled pass by pass

    def begin_batch(self, batch):
        """Start a batch: keep its first rows while fewer than max_blocks blocks are kept."""
        self._rows = min(self.max_blocks - len(self.input_ids), batch["input_ids"].shape[0])
        self._batch_gold = None
        input_ids = batch["input_ids"][: self._rows].cpu().numpy()  # [rows, seq]
        attention_mask = batch.get("attention_mask")
        kept = np.ones(input_ids.shape, bool) if attention_mask is None else attention_mask[: self._rows].cpu().numpy()
        self.input_ids += list(input_ids)
        self.attention_mask += list(kept.astype(bool))

    def update_pass(self, scored_pass: ScoredPass):
        """One scoring pass over the current batch: its recorded probe set's log-probabilities at the scored tokens."""
        if self._rows == 0:
            return
        scored, gold, shift = scored_pass.scored, scored_pass.probe_gold[self.probe_set], scored_pass.shift
        predicted = F.pad(scored[: self._rows], (shift, 0), value=False).cpu().numpy()  # [rows, seq]: tokens scored
        if self._batch_gold is None:
            self._batch_gold = np.full((gold.shape[0], *predicted.shape), np.nan, np.float32)
            self.gold_logprobs += list(self._batch_gold.transpose(1, 0, 2))  # views: [probes, seq] per block
        # the first rows' positions come first in `gold`, which lists the scored positions row by row
        self._batch_gold[:, predicted] = gold[:, : predicted.sum()]


def _gold_logprobs(probe_model, inputs, labels, features, scored, chunk_size) -> np.ndarray:
    """One probe set's gold log-probabilities at the scored positions, [probes, n] float32, tower-major."""
    gold = probe_model.probe_logprobs(inputs, labels=labels, chunk_size=chunk_size, features=features, all_replicas=True)
    return gold.flatten(0, 1)[:, scored].cpu().numpy()


def _batch_passes(batch, device, model, mask_passes, mask_token_id):
    """(inputs, labels, attention_mask) of each scoring pass of `model` over one batch, on `device`."""
    input_ids = batch["input_ids"].to(device)  # [batch, seq]
    attention_mask, scorable = batch.get("attention_mask"), None  # sentence-pair blocks: padding, never scored
    if attention_mask is not None:
        attention_mask, scorable = attention_mask.to(device), batch["labels"].to(device) != -100
    objective, towers = objective_of(model), model.model.towers
    for inputs, labels in scoring_passes(input_ids, objective, towers, mask_passes, mask_token_id, scorable):
        yield inputs, labels, attention_mask


def _score_pass(model, probe_models, inputs, labels, attention_mask, probe_chunk_size) -> ScoredPass:
    """One pass of the towers over a batch, and from it the joint model's NLL and every probe set's gold
    log-probabilities at the scored positions."""
    targets = model.prediction_targets(labels)  # [batch, seq - shift]
    scored = targets != -100  # a masking pass scores 1 in mask_passes positions: only those
    features = model.probe_features(inputs, attention_mask)  # [towers, batch, seq, hidden]
    nll = -model.joint_logprobs(inputs, attention_mask, labels, features=features)[scored]  # [n]
    gold = [_gold_logprobs(probe_model, inputs, labels, features, scored, probe_chunk_size)
            for probe_model in probe_models]
    return ScoredPass(scored, model.target_shift, targets[scored].cpu().numpy(), nll, gold, features, labels)


@torch.inference_mode()
def score_blocks(
    model,
    dataloader,
    probe_models=None,
    accumulators=None,
    consumers=(),
    ablation=False,
    measures=(),
    probe_chunk_size=None,
    mask_passes=DEFAULT_MASK_PASSES,
    mask_token_id=None,
    pair_replicas=True,
    disable_tqdm=False,
) -> BlockScores:
    """
    Run the towers of `model` once per scoring pass of every batch of blocks, and feed from that one pass the joint
    model's NLL and, for each probe set (`probe_models`: models whose probes were trained on this frozen model;
    default `[model]`), its gold log-probabilities into its NLL sums and its accumulator (`accumulators`, default
    `preference_accumulator` of each; anything with `update(token_ids [n], gold_logprobs [probes, n])`), then every
    scoring pass into each of `consumers` (PassConsumer: e.g. ScoredPassages, cross_fitting.CrossFittedPreference).
    `measures`: the names of registered probe-free measures (tower_preference/measures.py) to measure in the same
    pass: each one's consumer is fed every pass before the others, leaves its increases on the pass
    (`ScoredPass.increases`) and is kept in `BlockScores.measures`; `ablation` adds the mean ablation ("ablation",
    whose consumer first takes each tower's mean feature in a pass of its own).
    """
    probe_models = [model] if probe_models is None else list(probe_models)
    if accumulators is None:
        accumulators = [preference_accumulator(probe_model.config, pair_replicas) for probe_model in probe_models]
    scores = BlockScores(accumulators, [np.zeros(probe_model.config.num_probes) for probe_model in probe_models])
    device = next(model.parameters()).device

    def passes():  # every scoring pass of the text, for a measure that takes a first pass of its own
        return (each for batch in tqdm(dataloader, desc="Tower means", disable=disable_tqdm)
                for each in _batch_passes(batch, device, model, mask_passes, mask_token_id))

    requested = [probe_free_measure(name) for name in {*measures, *(["ablation"] if ablation else [])}]
    scores.measures = {measure.name: measure.consumer(model, passes)
                       for measure in PROBE_FREE_MEASURES if measure in requested}  # in the registry's order
    consumers = [*scores.measures.values(), scores, *consumers]
    for batch in tqdm(dataloader, desc="Scoring", disable=disable_tqdm):
        for consumer in consumers:
            consumer.begin_batch(batch)
        for inputs, labels, attention_mask in _batch_passes(batch, device, model, mask_passes, mask_token_id):
            scored_pass = _score_pass(model, probe_models, inputs, labels, attention_mask, probe_chunk_size)
            for consumer in consumers:
                consumer.update_pass(scored_pass)
    return scores
