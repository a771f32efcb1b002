"""PyTorch two-tower language model (He & Toyoizumi, "Spontaneous Emerging Preference in Two-tower Language Model").

All towers run together: every per-tower weight is stacked along a leading tower dimension and every matmul is
a batched matmul over towers. Towers never exchange information before the LM head. This module assembles the
parts, each in a module of its own: the embedding (`embeddings.py`), the towers' stack (`towers.py`: one module
per tower kind, `towers_*.py`, each a `TowerStack` that states its facts, on the batched layers of
`batched_layers.py`), their join (`fusion.py`), the LM heads (`heads.py`), the probes (`probes.py`), position alignment and the joint model's scores (`token_scoring.py`), the checks of
user inputs (`input_checks.py`) and of saved weights (`checkpoint_checks.py`), and the reference code's
initialisation (`reference_initialization.py`).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.versions import require_version

# The Hub custom code runs on whatever transformers a downloader has. Before 5.24, transformers' masks, outputs and
# generation name the cache `past_key_values`, not `cache`, and a forward fails deep inside them: say so on import,
# before the modules below. The same floor as setup.py's (tests/repository/test_version_ranges.py).
MIN_TRANSFORMERS_VERSION = "5.24"
require_version(
    f"transformers>={MIN_TRANSFORMERS_VERSION}", "The two-tower model's code needs it: pip install -U transformers"
)

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear, split_towers
from .checkpoint_checks import check_weights_fit_config, loaded_weight_files, warn_non_finite_weights
from .configuration_twotower import TwoTowerConfig
from .embeddings import tower_embeddings
from .fusion import tower_fusion
from .heads import TwoTowerFusionHead, TwoTowerIndependentHeads, TwoTowerTowerHeads
from .input_checks import check_labels, check_inputs, check_skip_logits, warn_if_no_target
from .probes import TwoTowerProbes
from .reference_initialization import init_reference_weights
from .token_scoring import TwoTowerTokenScoring
from .tower_stack import KindInitialized
from .towers import tower_stack, tower_stack_class


@dataclass
class TwoTowerModelOutputWithPast(BaseModelOutputWithPast):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `[batch, seq, num_towers * hidden]`):
        The normalized concatenation of the towers' last hidden states; probe `i` reads slice `i`.
    tower_hidden_states (`torch.FloatTensor` of shape `[num_towers, batch, seq, hidden]`, *optional*):
        Each tower's own final hidden states before fusion, returned with `output_tower_hidden_states=True`.
    """

    tower_hidden_states: torch.FloatTensor | None = None


@dataclass
class TwoTowerCausalLMOutputWithPast(CausalLMOutputWithPast):
    r"""
    tower_hidden_states (`torch.FloatTensor` of shape `[num_towers, batch, seq, hidden]`, *optional*):
        Each tower's own final hidden states before fusion, returned with `output_tower_hidden_states=True`.
    tower_loss (`torch.FloatTensor` of shape `()`, *optional*):
        With `config.tower_heads` and labels: the summed loss of the towers' own heads, included in `loss` (the
        joint model's loss is `loss - tower_loss`).
    """

    tower_hidden_states: torch.FloatTensor | None = None
    tower_loss: torch.FloatTensor | None = None


class TwoTowerPreTrainedModel(PreTrainedModel):
    config: TwoTowerConfig
    config_class = TwoTowerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, key_mapping: dict[str, str] | None = None, **kwargs):
        cls._check_local_checkpoint(pretrained_model_name_or_path, kwargs, key_mapping or {})
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, key_mapping=key_mapping, **kwargs)
        warn_non_finite_weights(loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path)
        return loaded

    @classmethod
    def _check_local_checkpoint(cls, pretrained_model_name_or_path, kwargs: dict, key_mapping: dict[str, str]):
        """
        A local folder's safetensors weights against the config `from_pretrained` will build the model from, before
        any weight is read: a damaged file or an edited config is one error naming the file and the field, not a
        SafetensorError or transformers' size-mismatch report (unless the caller passed `ignore_mismatched_sizes`).
        """
        folder = _local_folder(pretrained_model_name_or_path, kwargs)
        if folder is None or kwargs.get("ignore_mismatched_sizes"):
            return
        config = kwargs.get("config")
        if not isinstance(config, PretrainedConfig):  # read as from_pretrained reads it, with the same overrides
            other_kwargs = {key: value for key, value in kwargs.items() if key != "config"}
            config, _ = cls.config_class.from_pretrained(
                config or pretrained_model_name_or_path, return_unused_kwargs=True, **other_kwargs
            )
        check_weights_fit_config(cls, config, loaded_weight_files(folder), key_mapping)

    def _init_weights(self, module):
        if isinstance(module, KindInitialized):  # after its children: what a tower kind draws its own way
            module.init_kind_weights(self.config)
        if self.config.initialization == "reference":
            init_reference_weights(module, self.config, self.get_output_embeddings(), tower_stack_class(self.config))
            return
        super()._init_weights(module)  # nn.Linear (incl. the decoder's output bias), nn.Embedding, *LayerNorm, LSTM
        if isinstance(module, TwoTowerBatchedLinear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, TwoTowerBatchedLayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

class TwoTowerModel(TwoTowerPreTrainedModel):
    """
    The shared token embedding, what each tower reads of it (`embeddings.py`), the towers' stack (`towers.py`) and
    their join (`fusion.py`), each chosen once for the config's layout (the reference code's BERT, GPT or ELMo
    variant; see TwoTowerConfig).
    `bidirectional`: the towers' attention (None: the config's, else bidirectional for the ELMo layout only); the LM
    classes pass what their objective needs.
    """

    def __init__(self, config: TwoTowerConfig, bidirectional: bool | None = None):
        super().__init__(config)
        if bidirectional is None:  # the config's, else causal unless the stack has no causal towers (the ELMo layout)
            only_bidirectional = False not in tower_stack_class(config).directions
            bidirectional = only_bidirectional if config.bidirectional is None else config.bidirectional
        self.bidirectional = bidirectional
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.embeddings = tower_embeddings(config)
        self.towers = tower_stack(config, bidirectional)
        self.fusion = tower_fusion(config)
        self.gradient_checkpointing = False
        # Only the stack this model holds: device_map and FSDP's wrap policy refuse a class name the model lacks.
        self._no_split_modules = [self.towers.no_split_module]
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_tower_hidden_states: bool = False,
        **kwargs,
    ) -> TwoTowerModelOutputWithPast:
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        check_inputs(
            self.config, self.towers, self.bidirectional, input_ids, inputs_embeds, attention_mask, position_ids,
            past_seen_tokens, use_cache, output_attentions,
        )

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [batch, seq, embedding_size]
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)  # one slot per depth: towers are folded into heads
        given_position_ids = position_ids  # only given positions can restart inside a row (packed sequences)
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)

        embeddings, tower_inputs = self.embeddings(inputs_embeds, position_ids, self.embed_tokens)
        # read by position: a hook (an nnsight intervention) may put a plain tuple where the TowerStackOutput was
        tower_states, tower_layer_states, tower_attentions = self.towers(
            tower_inputs, inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=given_position_ids,
            cache=cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        # joint_gradient=False: the fusion and what reads it train on the towers' outputs, the towers not on them
        fusion_inputs = tower_states.detach() if self.training and not self.config.joint_gradient else tower_states
        return TwoTowerModelOutputWithPast(
            last_hidden_state=self.fusion(fusion_inputs),
            cache=cache if use_cache else None,
            hidden_states=(embeddings, *tower_layer_states) if output_hidden_states else None,
            attentions=tower_attentions,
            tower_hidden_states=tower_states if output_tower_hidden_states else None,
        )


class TwoTowerLMHeadModel(TwoTowerTokenScoring, TwoTowerPreTrainedModel):
    """
    What the causal and masked two-tower LMs share: the towers, the LM head (`heads.py`: the paper's fusion head, or
    with `cooperative=False` the independent-towers control's per-tower heads), the probes, and resizing.
    """

    _tied_weights_keys = {"lm_head.decoder.weight": "model.embed_tokens.weight"}
    towers_bidirectional = False  # what the objective needs of the towers
    target_shift = 0  # position t predicts token t + target_shift: the one place that says so

    def __init__(self, config: TwoTowerConfig):
        stack = tower_stack_class(config)
        if self.towers_bidirectional not in stack.directions:
            raise ValueError(
                f"{type(self).__name__} cannot have layout={config.layout!r}, whose {config.tower_type} towers are "
                f"{stack.card_names[stack.directions[0]]} only: use "
                f"{'TwoTowerForMaskedLM' if stack.directions[0] else 'TwoTowerForCausalLM'}, or another layout of "
                f"tower_type={config.tower_type!r}."
            )
        if config.bidirectional not in (None, self.towers_bidirectional):
            wanted = "TwoTowerForMaskedLM" if config.bidirectional else "TwoTowerForCausalLM"
            raise ValueError(
                f"{type(self).__name__} needs bidirectional={self.towers_bidirectional} towers but the config has "
                f"bidirectional={config.bidirectional}; use {wanted}, or leave `bidirectional` unset."
            )
        super().__init__(config)
        self.model = TwoTowerModel(config, bidirectional=self.towers_bidirectional)
        self.lm_head = TwoTowerFusionHead(config) if config.cooperative else TwoTowerIndependentHeads(config)
        self.tower_heads = TwoTowerTowerHeads(config) if config.tower_heads else None
        self.probes = TwoTowerProbes(config, config.probe_replicas, config.probe_type)
        self.post_init()

    def get_output_embeddings(self):
        # the control's per-tower decoders are untied: nothing to resize with the embedding
        return self.lm_head.decoder if self.config.cooperative else None

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def lm_output(self, outputs, logits, loss, target_ids, num_items_in_batch, output_tower_hidden_states: bool):
        """
        The LM output: the head's logits and loss with what the base model returned; with `config.tower_heads` and
        targets (`target_ids` [batch, seq], -100 for none), the towers' own loss added to the joint one.
        """
        tower_states, tower_loss = outputs.tower_hidden_states, None
        if self.tower_heads is not None and target_ids is not None:
            counted = target_ids.ne(-100)  # the heads' vocabulary projection on the predicting positions only
            tower_loss = self.tower_heads(tower_states[:, counted], target_ids[counted], num_items_in_batch)
            loss = loss + tower_loss
        return TwoTowerCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            tower_hidden_states=tower_states if output_tower_hidden_states else None,
            tower_loss=tower_loss,
        )

    def _checked_model_outputs(self, labels, skip_logits: bool, output_tower_hidden_states: bool, **model_inputs):
        # a forward's pass of the base model, after the checks of its labels; with the towers' own states where the
        # caller or the tower heads' loss needs them
        check_labels(self.config, model_inputs.get("input_ids"), model_inputs.get("inputs_embeds"), labels)
        check_skip_logits(skip_logits, labels)
        needs_tower_states = output_tower_hidden_states or (self.tower_heads is not None and labels is not None)
        return self.model(**model_inputs, output_tower_hidden_states=needs_tower_states, return_dict=True)

    def joint_logits(self, features: torch.Tensor) -> torch.Tensor:
        """
        The joint model's logits [batch, seq, vocab] from the towers' features (`probe_features`' output): one pass
        of the towers then serves the joint model and every probe set trained on it (scoring, probe-phase
        validation).
        """
        return self.lm_head.joint_logits(features)

    def probe_features(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Each tower's slice of the normalized concatenation, [num_towers, batch, seq, hidden]: the probes' input."""
        fused = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return split_towers(fused, self.config.num_towers)

    def reset_probes(self, probe_replicas: int | None = None, probe_type: str | None = None) -> TwoTowerProbes:
        """
        New, untrained probes drawn from the current random state: `probe_replicas` per tower of `probe_type`
        (None keeps the config's). The config follows, so a saved model reloads with these probes.
        """
        probe_replicas = self.config.probe_replicas if probe_replicas is None else probe_replicas
        probe_type = self.config.probe_type if probe_type is None else probe_type
        # a config checks the values before any weight is replaced
        type(self.config)(**{**self.config.to_dict(), "probe_replicas": probe_replicas, "probe_type": probe_type})
        self.config.probe_replicas, self.config.probe_type = probe_replicas, probe_type
        reference = self.model.embed_tokens.weight
        probes = TwoTowerProbes(self.config, probe_replicas, probe_type).to(reference.device, reference.dtype)
        probes.apply(self._init_weights)
        self.probes = probes
        return probes

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the shared embedding, the tied decoder and its output bias, and every probe-shaped head."""
        old_vocab_size = self.config.vocab_size
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.vocab_size != old_vocab_size:
            self.probes.decoder = self._resized_decoder(self.probes.decoder)
            if not self.config.cooperative:
                self.lm_head.decoder = self._resized_decoder(self.lm_head.decoder)
        return embeddings

    def _resized_decoder(self, decoder: TwoTowerBatchedLinear) -> TwoTowerBatchedLinear:
        num_probes, in_features, _ = decoder.weight.shape
        resized = TwoTowerBatchedLinear(num_probes, in_features, self.config.vocab_size)
        resized.to(device=decoder.weight.device, dtype=decoder.weight.dtype)
        self._init_weights(resized)
        kept = min(decoder.weight.shape[-1], self.config.vocab_size)
        with torch.no_grad():
            resized.weight[:, :, :kept] = decoder.weight[:, :, :kept]
            resized.bias[:, :kept] = decoder.bias[:, :kept]
        return resized


class TwoTowerForCausalLM(TwoTowerLMHeadModel, GenerationMixin):
    """
    The two-tower causal LM: causal transformer towers (layout bert, or the reference's GPT layout), or this
    package's forward LSTM towers. `probes` hold one probe per tower, untrained until the probe phase;
    `probe_logprobs` is what the preference measurement reads.
    """

    towers_bidirectional = False
    target_shift = 1

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_tower_hidden_states: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
        skip_logits: bool = False,
        **kwargs,
    ) -> TwoTowerCausalLMOutputWithPast:
        r"""
        labels (`torch.LongTensor` of shape `[batch, seq]`, *optional*):
            Next-token targets, shifted inside the model (pass `labels=input_ids`); -100 is ignored. With
            `num_items_in_batch` the loss is the sum over tokens divided by it (gradient accumulation).
        output_tower_hidden_states (`bool`, *optional*):
            Also return each tower's final hidden states, [num_towers, batch, seq, hidden].
        skip_logits (`bool`, *optional*, defaults to `False`):
            With `labels`: return the loss and no logits (`logits` is None). The loss is computed piece by piece
            from the decoder's input (Liger Kernel's fused linear cross-entropy), so the [batch, seq, vocab]
            logits never exist: the training command's step, faster and lighter; equal to the default loss to
            float tolerance.

        Example:

        ```python
        >>> import torch
        >>> from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
        >>> model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=128)).eval()
        >>> input_ids = torch.tensor([[5, 17, 42, 8]])
        >>> output = model(input_ids, labels=input_ids, output_tower_hidden_states=True)
        >>> output.logits.shape, output.tower_hidden_states.shape
        (torch.Size([1, 4, 128]), torch.Size([2, 1, 4, 64]))
        ```
        """
        outputs = self._checked_model_outputs(
            labels, skip_logits, output_tower_hidden_states, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        target_ids = None if labels is None else _next_token_targets(labels)
        num_items_in_batch = kwargs.get("num_items_in_batch")
        if target_ids is not None:
            warn_if_no_target(target_ids, num_items_in_batch)
        logits, loss = self.lm_head(
            outputs.last_hidden_state, target_ids, logits_to_keep, num_items_in_batch, skip_logits
        )
        return self.lm_output(outputs, logits, loss, target_ids, num_items_in_batch, output_tower_hidden_states)


def _local_folder(pretrained_model_name_or_path, from_pretrained_kwargs: dict) -> Path | None:
    """The local folder `from_pretrained` reads safetensors weights from, or None (a Hub name, a state dict, GGUF)."""
    if pretrained_model_name_or_path is None or from_pretrained_kwargs.get("gguf_file") is not None:
        return None
    folder = Path(pretrained_model_name_or_path) / from_pretrained_kwargs.get("subfolder", "")
    return folder if folder.is_dir() else None


def _next_token_targets(labels: torch.LongTensor) -> torch.LongTensor:
    # position t predicts labels[t + 1]; the last position predicts nothing
    return F.pad(labels[:, 1:], (0, 1), value=-100)


class TwoTowerForMaskedLM(TwoTowerLMHeadModel):
    """
    The two-tower masked LM (the paper's main, BERT-style model): bidirectional transformer towers, or forward +
    backward LSTM towers (the reference's ELMo layout, or this package's) where position t reads its left and
    right context only. Labels are the original ids at the positions to predict (-100 elsewhere), not shifted.
    """

    towers_bidirectional = True

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_tower_hidden_states: bool = False,
        skip_logits: bool = False,
        **kwargs,
    ) -> TwoTowerCausalLMOutputWithPast:
        r"""
        labels (`torch.LongTensor` of shape `[batch, seq]`, *optional*):
            The original token ids at masked positions and -100 elsewhere (transformers'
            `DataCollatorForLanguageModeling` makes them); with `num_items_in_batch` the loss is a sum over
            tokens divided by it. With `config.sparse_prediction` the logits are those of the labelled positions
            only, `[labelled positions, vocab]` in row-major order, and the loss is unchanged.
        skip_logits (`bool`, *optional*, defaults to `False`):
            With `labels`: the loss alone, as in `TwoTowerForCausalLM.forward`.
        """
        outputs = self._checked_model_outputs(
            labels, skip_logits, output_tower_hidden_states, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, inputs_embeds=inputs_embeds, use_cache=False,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        hidden_states, head_labels = outputs.last_hidden_state, labels
        num_items_in_batch = kwargs.get("num_items_in_batch")
        if labels is not None:
            warn_if_no_target(labels, num_items_in_batch)
        if self.config.sparse_prediction and labels is not None:
            # ModernBERT's sparse prediction: the head's vocabulary projection, the bulk of a small model's compute,
            # runs on the labelled positions only (15% of them in BERT-style masking); the loss is the same
            labelled = labels != -100
            hidden_states, head_labels = hidden_states[labelled].unsqueeze(0), labels[labelled].unsqueeze(0)
        logits, loss = self.lm_head(hidden_states, head_labels, 0, num_items_in_batch, skip_logits)
        if self.config.sparse_prediction and logits is not None and labels is not None:
            logits = logits[0]  # [labelled positions, vocab]
        return self.lm_output(outputs, logits, loss, labels, num_items_in_batch, output_tower_hidden_states)

    def generate(self, *args, **kwargs):
        raise TypeError(
            "TwoTowerForMaskedLM is a masked LM and cannot generate text; fill masks from `model(...).logits`, or "
            "train a TwoTowerForCausalLM to generate."
        )


__all__ = [
    "TwoTowerPreTrainedModel",
    "TwoTowerModel",
    "TwoTowerLMHeadModel",
    "TwoTowerForCausalLM",
    "TwoTowerForMaskedLM",
    "TwoTowerProbes",
]
