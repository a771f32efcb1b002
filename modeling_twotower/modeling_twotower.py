"""PyTorch two-tower language model (He & Toyoizumi, "Spontaneous Emerging Preference in Two-tower Language Model").

All towers run together: every per-tower weight is stacked along a leading tower dimension, every matmul is
a batched matmul over towers, and attention folds the towers into the head dimension, so one attention call
(and one cache slot per depth) covers every tower's heads. Towers never exchange information before the
fusion head. The batched layers are in `batched_layers.py`, the LSTM towers in `lstm_towers.py`, the probes in
`probes.py`.
"""

from collections.abc import Callable
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.deprecation import deprecate_kwarg

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear, TwoTowerBlockLinear
from .configuration_twotower import TwoTowerConfig
from .lstm_towers import TwoTowerELMoTowers, TwoTowerLSTMTowers
from .probes import TwoTowerProbes


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
    """

    tower_hidden_states: torch.FloatTensor | None = None


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # query [batch, towers * heads, q_len, head_dim]; key, value [batch, towers * heads, kv_len, head_dim]
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # an SDPA-style mask: True = attend
        attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(attn_weights.dtype).min)
    elif attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class TwoTowerAttention(nn.Module):
    """Causal self-attention of every tower at one depth, the towers folded into the head dimension."""

    def __init__(self, config: TwoTowerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_towers = config.num_towers
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = not config.bidirectional
        self.q_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.k_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.v_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.o_proj = TwoTowerBlockLinear(
            config.num_towers, config.hidden_size, config.hidden_size, writes_residual=True
        )

    def _to_heads(self, states: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> [batch, towers * heads, seq, head_dim], tower-major head order
        num_towers, batch, seq, _ = states.shape
        states = states.view(num_towers, batch, seq, -1, self.head_dim).permute(1, 0, 3, 2, 4)
        return states.reshape(batch, -1, seq, self.head_dim)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False, **kwargs):
        num_towers, batch, seq, hidden = hidden_states.shape
        query = self._to_heads(self.q_proj(hidden_states))
        key = self._to_heads(self.k_proj(hidden_states))
        value = self._to_heads(self.v_proj(hidden_states))
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)

        # Attention weights exist only on the eager path; interpretability users ask for them explicitly.
        implementation = "eager" if output_attentions else self.config._attn_implementation
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        # [batch, seq, towers * heads, head_dim] -> [towers, batch, seq, hidden]
        attn_output = attn_output.reshape(batch, seq, num_towers, hidden).permute(2, 0, 1, 3)
        return self.o_proj(attn_output), attn_weights


class TwoTowerMLP(nn.Module):
    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.up_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.intermediate_size)
        self.down_proj = TwoTowerBlockLinear(
            config.num_towers, config.intermediate_size, config.hidden_size, writes_residual=True
        )
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        return self.down_proj(self.act_fn(self.up_proj(hidden_states)))


class TwoTowerDecoderLayer(GradientCheckpointingLayer):
    """Pre-LN transformer block at one depth of every tower; hidden states [towers, batch, seq, hidden]."""

    def __init__(self, config: TwoTowerConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        self.self_attn = TwoTowerAttention(config, layer_idx)
        self.post_attention_layernorm = TwoTowerBatchedLayerNorm(
            config.num_towers, config.hidden_size, config.layer_norm_eps
        )
        self.mlp = TwoTowerMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False, **kwargs):
        # Self Attention
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, attn_weights = self.self_attn(hidden_states, attention_mask, cache, output_attentions)
        hidden_states = residual + self.dropout(hidden_states)

        # Fully Connected
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = residual + self.dropout(hidden_states)
        return hidden_states, attn_weights


def _torch_default_linear_(weight: torch.Tensor, bias: torch.Tensor, in_features: int):
    # nn.Linear's own initialisation (kaiming_uniform with a = sqrt(5)) is U(+-1/sqrt(fan_in)), for the bias too
    bound = 1 / math.sqrt(in_features)
    init.uniform_(weight, -bound, bound)
    init.uniform_(bias, -bound, bound)


class TwoTowerPreTrainedModel(PreTrainedModel):
    config: TwoTowerConfig
    config_class = TwoTowerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TwoTowerDecoderLayer", "TwoTowerLSTMTowers", "TwoTowerELMoTowers"]
    _supports_sdpa = True
    _supports_attention_backend = True

    def _init_weights(self, module):
        if self.config.initialization == "reference":
            self._init_reference_weights(module)
            return
        super()._init_weights(module)  # nn.Linear (incl. the decoder's output bias), nn.Embedding, *LayerNorm, LSTM
        if isinstance(module, TwoTowerBatchedLinear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, TwoTowerBatchedLayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def _init_reference_weights(self, module):
        """The reference code's initialisation of each weight kind (the table in TwoTowerConfig's docstring)."""
        std = self.config.initializer_range
        is_decoder = module is getattr(self, "lm_head", None)  # its weight is the tied embedding
        if isinstance(module, nn.Embedding) or is_decoder:
            if self.config.layout == "gpt":  # GPT-2's _init_weights
                init.normal_(module.weight, mean=0.0, std=std)
            else:  # the reference's pt_emb / position_embeddings: .uniform_(-0.02, 0.02)
                init.uniform_(module.weight, -std, std)
        if is_decoder:
            init.zeros_(module.bias)  # the output bias
        elif isinstance(module, nn.Embedding):
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.Linear):
            _torch_default_linear_(module.weight, module.bias, module.in_features)
        elif isinstance(module, TwoTowerBlockLinear):
            # DeepSpeed's kernel and GPT-2 alike: N(0, std), the residual writers scaled by 1/sqrt(2 L)
            depth_scale = 1 / math.sqrt(2 * self.config.num_hidden_layers) if module.writes_residual else 1.0
            init.normal_(module.weight, mean=0.0, std=std * depth_scale)
            init.zeros_(module.bias)
        elif isinstance(module, TwoTowerBatchedLinear):  # the per-tower projections and the probes: plain nn.Linear
            _torch_default_linear_(module.weight, module.bias, module.weight.shape[1])
        elif isinstance(module, nn.LSTM):
            for param in module.parameters():  # nn.LSTM's own initialisation
                init.uniform_(param, -1 / math.sqrt(module.hidden_size), 1 / math.sqrt(module.hidden_size))
        elif isinstance(module, (nn.LayerNorm, TwoTowerBatchedLayerNorm)):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class TwoTowerModel(TwoTowerPreTrainedModel):
    """
    Shared embedding, each tower's stack, and the normalized concatenation of the towers, laid out as the
    config's `layout` says (the reference code's BERT, GPT or ELMo variant; see TwoTowerConfig).
    """

    def __init__(self, config: TwoTowerConfig):
        if config.bidirectional is None:
            config.bidirectional = config.layout == "elmo"
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.dropout = nn.Dropout(config.hidden_dropout)
        if config.layout == "elmo":
            # No positions: direction norms, shifting and the per-tower projections live in the ELMo towers.
            self.elmo_towers = TwoTowerELMoTowers(config)
        else:
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.embedding_size)
            if config.layout == "bert":  # gpt: no embedding norm, no projection
                self.embed_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
                self.tower_proj = TwoTowerBatchedLinear(config.num_towers, config.embedding_size, config.hidden_size)
            if config.tower_type == "lstm":
                self.lstm_towers = TwoTowerLSTMTowers(config)
            else:
                self.layers = nn.ModuleList(
                    [TwoTowerDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
                )
        if config.layout == "gpt":  # each tower's final LayerNorm (GPT-2's ln_f)
            self.tower_norm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        if config.cooperative:
            self.fusion_norm = nn.LayerNorm(config.fused_hidden_size, eps=config.layer_norm_eps)
        else:
            # The control shares nothing after the embedding, not even normalization statistics.
            self.fusion_norm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def _check_inputs(self, input_ids, inputs_embeds, past_seen_tokens, use_cache, output_attentions):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
        _check_input_shape(input_ids, inputs_embeds)
        if self.config.tower_type == "lstm" and (use_cache or output_attentions):
            option = "use_cache" if use_cache else "output_attentions"
            raise ValueError(
                f"`{option}=True` does not apply to LSTM towers (no attention, no key/value cache); drop it."
            )
        if self.config.bidirectional and use_cache:
            raise ValueError("`use_cache=True` needs causal towers; a bidirectional (masked) model has no cache.")
        seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if past_seen_tokens + seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence length {past_seen_tokens + seq_len} (cached {past_seen_tokens} + new {seq_len}) exceeds "
                f"max_position_embeddings={self.config.max_position_embeddings}; truncate the input "
                f"(e.g. tokenizer(..., truncation=True, max_length={self.config.max_position_embeddings}))."
            )
        # A data-dependent check cannot be traced; compiled graphs rely on the eager runs having checked.
        if input_ids is not None and not torch.compiler.is_compiling():
            vocab_size = self.config.vocab_size
            if bool(((input_ids < 0) | (input_ids >= vocab_size)).any()):
                bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0].item()
                raise ValueError(
                    f"Token id {bad} is outside [0, {vocab_size}); the tokenizer does not match this model "
                    f"(resize it with `model.resize_token_embeddings(len(tokenizer))`)."
                )

    def _tower_inputs(self, inputs_embeds, position_ids):
        """The embedding [batch, seq, embedding_size] and, from it, each tower's input [towers, batch, seq, hidden]."""
        embeddings = inputs_embeds + self.embed_positions(position_ids)
        per_tower = (self.config.num_towers, *embeddings.shape)
        if self.config.layout == "gpt":
            # GPT-2's embedding goes to every tower as it is; each tower (a GPT2Model in the reference) draws its
            # own dropout mask
            return embeddings, self.dropout(embeddings.expand(per_tower))
        embeddings = self.dropout(self.embed_norm(embeddings))
        return embeddings, self.tower_proj(embeddings.expand(per_tower))

    def _attention_mask(self, inputs_embeds, attention_mask, cache, position_ids, output_attentions):
        # Attention weights come from the eager path, which needs the mask SDPA would skip.
        if self.config.bidirectional:
            return create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                allow_is_bidirectional_skip=not output_attentions,
            )
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
            allow_is_causal_skip=not output_attentions,
        )

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        return_dict: bool | None = None,
        **kwargs,
    ) -> TwoTowerModelOutputWithPast | tuple:
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        self._check_inputs(input_ids, inputs_embeds, past_seen_tokens, use_cache, output_attentions)

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [batch, seq, embedding_size]
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)  # one slot per depth: towers are folded into heads
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)

        if self.config.layout == "elmo":
            # the reference shifts [PAD] (id 0) in front of each direction's sequence
            start_id = 0 if self.config.pad_token_id is None else self.config.pad_token_id
            embeddings = inputs_embeds
            hidden_states = self.elmo_towers(inputs_embeds, self.embed_tokens.weight[start_id])
        else:
            embeddings, hidden_states = self._tower_inputs(inputs_embeds, position_ids)
        all_hidden_states = (embeddings,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        if self.config.tower_type == "lstm":
            if self.config.layout == "bert":
                hidden_states = self.lstm_towers(hidden_states)
            if output_hidden_states:
                all_hidden_states += (_concat_towers(hidden_states),)
        else:
            mask = self._attention_mask(inputs_embeds, attention_mask, cache, position_ids, output_attentions)
            for layer in self.layers:
                hidden_states, attn_weights = layer(
                    hidden_states, attention_mask=mask, cache=cache, output_attentions=output_attentions
                )
                if output_hidden_states:
                    all_hidden_states += (_concat_towers(hidden_states),)
                if output_attentions:
                    all_attentions += (attn_weights,)

        if self.config.layout == "gpt":
            hidden_states = self.tower_norm(hidden_states)
        if self.config.cooperative:
            fused_hidden_states = self.fusion_norm(_concat_towers(hidden_states))
        else:
            fused_hidden_states = _concat_towers(self.fusion_norm(hidden_states))
        if self.config.layout == "elmo":  # the reference's ELMo drops out the fused features too
            fused_hidden_states = self.dropout(fused_hidden_states)
        output = TwoTowerModelOutputWithPast(
            last_hidden_state=fused_hidden_states,
            cache=cache if use_cache else None,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            tower_hidden_states=hidden_states if output_tower_hidden_states else None,
        )
        return output if return_dict else output.to_tuple()


def _check_input_shape(input_ids, inputs_embeds):
    # one clear error before any work, instead of an IndexError or an empty reduction deep inside the towers
    if input_ids is not None and input_ids.dim() != 2:
        raise ValueError(
            f"`input_ids` has shape {tuple(input_ids.shape)}; pass token ids of shape [batch, seq] (one sequence: "
            f"`input_ids[None]`; more dimensions: `input_ids.view(-1, input_ids.shape[-1])`)."
        )
    if inputs_embeds is not None and inputs_embeds.dim() != 3:
        raise ValueError(
            f"`inputs_embeds` has shape {tuple(inputs_embeds.shape)}; pass embeddings of shape "
            f"[batch, seq, embedding_size]."
        )
    inputs = input_ids if input_ids is not None else inputs_embeds
    if inputs is not None and inputs.shape[0] * inputs.shape[1] == 0:
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        raise ValueError(
            f"`{name}` has shape {tuple(inputs.shape)}, no tokens; pass at least one sequence of at least one token."
        )


def _check_label_values(labels: torch.LongTensor, vocab_size: int):
    # A data-dependent check cannot be traced; compiled graphs rely on the eager runs having checked.
    if torch.compiler.is_compiling():
        return
    bad = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        raise ValueError(
            f"`labels` holds {labels[bad][0].item()}, neither a token id in [0, {vocab_size}) nor -100 (ignored); "
            f"pass this model's token ids, with -100 where nothing is predicted (a tokenizer larger than the model: "
            f"`model.resize_token_embeddings(len(tokenizer))`)."
        )


def _concat_towers(hidden_states: torch.Tensor) -> torch.Tensor:
    # [towers, batch, seq, hidden] -> [batch, seq, towers * hidden], tower 0 first
    num_towers, batch, seq, hidden = hidden_states.shape
    return hidden_states.permute(1, 2, 0, 3).reshape(batch, seq, num_towers * hidden)


def _keep_positions(states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    # `logits_to_keep` of GenerationMixin along the sequence axis (-2): 0 keeps all, n the last n, a tensor indexes
    if isinstance(logits_to_keep, torch.Tensor):
        return states[..., logits_to_keep, :]
    return states[..., -logits_to_keep:, :] if logits_to_keep > 0 else states


class TwoTowerLMHeadModel(TwoTowerPreTrainedModel):
    """
    What the causal and masked two-tower LMs share: the towers, the head that turns them into logits, the
    probes, and resizing. Cooperative (the paper): concatenation -> LayerNorm -> Linear + GELU -> LayerNorm ->
    decoder tied to the shared embedding, plus an output bias. Control (`cooperative=False`): each tower has
    its own LM head (probe-shaped, untied) and its own loss, the losses summed; the logits are the towers'
    equal-weight mixture.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    towers_bidirectional = False  # what the objective needs of the towers

    def __init__(self, config: TwoTowerConfig):
        if config.layout == "elmo" and not self.towers_bidirectional:
            raise ValueError(
                f"{type(self).__name__} cannot have layout='elmo', the reference's forward + backward ELMo (a masked-"
                f"family model): use TwoTowerForMaskedLM, or layout='bert' with tower_type='lstm' for a causal LSTM LM."
            )
        if config.bidirectional is None:
            config.bidirectional = self.towers_bidirectional
        if config.bidirectional != self.towers_bidirectional:
            wanted = "TwoTowerForMaskedLM" if config.bidirectional else "TwoTowerForCausalLM"
            raise ValueError(
                f"{type(self).__name__} needs bidirectional={self.towers_bidirectional} towers but the config has "
                f"bidirectional={config.bidirectional}; use {wanted}, or leave `bidirectional` unset."
            )
        super().__init__(config)
        self.model = TwoTowerModel(config)
        if config.cooperative:
            # Down to the embedding's width (the same width by default), which the tied decoder needs.
            self.fusion_dense = nn.Linear(config.fused_hidden_size, config.embedding_size)
            self.fusion_act = ACT2FN[config.hidden_act]
            self.fusion_output_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
            self.lm_head = nn.Linear(config.embedding_size, config.vocab_size, bias=True)  # bias: output bias
        else:
            self.tower_lm_heads = TwoTowerProbes(config)
        self.probes = TwoTowerProbes(config, config.probe_replicas, config.probe_type)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head if self.config.cooperative else None

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def _split_towers(self, fused_hidden_states: torch.Tensor) -> torch.Tensor:
        # [batch, seq, towers * hidden] -> [towers, batch, seq, hidden]
        batch, seq, _ = fused_hidden_states.shape
        return fused_hidden_states.view(batch, seq, self.config.num_towers, -1).permute(2, 0, 1, 3)

    def _fused_logits(self, fused_hidden_states: torch.Tensor) -> torch.Tensor:
        fused_hidden_states = self.fusion_output_norm(self.fusion_act(self.fusion_dense(fused_hidden_states)))
        return self.lm_head(fused_hidden_states)

    def _control_tower_logprobs(self, features: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> each tower's own log-probabilities [towers, batch, seq, vocab]
        return self.tower_lm_heads.logits(features).float().log_softmax(-1)

    def _control_mixture(self, tower_logprobs: torch.Tensor) -> torch.Tensor:
        # the towers' equal-weight mixture, as log-probabilities [batch, seq, vocab]
        return torch.logsumexp(tower_logprobs, dim=0) - math.log(self.config.num_towers)

    def logits_from_probe_features(self, features: torch.Tensor) -> torch.Tensor:
        """
        The joint model's logits [batch, seq, vocab] from `probe_features`' output: one pass of the towers then
        serves the joint model and every probe set trained on it (scoring, probe-phase validation).
        """
        if self.config.cooperative:
            return self._fused_logits(_concat_towers(features))
        return self._control_mixture(self._control_tower_logprobs(features))

    def _control_loss(self, tower_logprobs, target_ids, num_items_in_batch=None):
        """Sum over towers of each tower's own token-mean cross-entropy (independent-towers control)."""
        ignored = target_ids.eq(-100)
        targets = target_ids.masked_fill(ignored, 0).expand(tower_logprobs.shape[0], -1, -1).unsqueeze(-1)
        gold_logprobs = tower_logprobs.gather(-1, targets).squeeze(-1).masked_fill(ignored, 0.0)
        num_items = num_items_in_batch if num_items_in_batch is not None else (~ignored).sum()
        return -gold_logprobs.sum() / num_items

    def _lm_forward(self, input_ids, labels, target_ids, logits_to_keep, model_kwargs, loss_kwargs):
        """Run the towers, the head and the loss; `target_ids` are the labels aligned with each position."""
        _check_input_shape(input_ids, model_kwargs.get("inputs_embeds"))
        reference = input_ids if input_ids is not None else model_kwargs.get("inputs_embeds")
        if labels is not None and reference is not None and labels.shape != reference.shape[:2]:
            raise ValueError(
                f"`labels` has shape {tuple(labels.shape)} but the inputs have shape {tuple(reference.shape[:2])}; "
                f"pass labels aligned with input_ids."
            )
        if labels is not None:
            _check_label_values(labels, self.config.vocab_size)
        outputs = self.model(input_ids=input_ids, return_dict=True, **model_kwargs)
        loss = None
        if self.config.cooperative:
            logits = self._fused_logits(_keep_positions(outputs.last_hidden_state, logits_to_keep))
            if labels is not None:
                loss = self.loss_function(
                    logits=logits, labels=labels, vocab_size=self.config.vocab_size, **loss_kwargs
                )
        else:
            # One vocabulary projection serves the loss (every position) and the mixture logits (the kept ones).
            hidden_states = outputs.last_hidden_state
            if labels is None:
                hidden_states = _keep_positions(hidden_states, logits_to_keep)
            tower_logprobs = self._control_tower_logprobs(self._split_towers(hidden_states))
            if labels is not None:
                loss = self._control_loss(tower_logprobs, target_ids(labels), loss_kwargs.get("num_items_in_batch"))
                tower_logprobs = _keep_positions(tower_logprobs, logits_to_keep)
            logits = self._control_mixture(tower_logprobs)
        return TwoTowerCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            tower_hidden_states=outputs.tower_hidden_states,
        )

    def probe_features(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Each tower's slice of the normalized concatenation, [num_towers, batch, seq, hidden]: the probes' input."""
        fused = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self._split_towers(fused)

    def _per_tower(self, gold_logprobs: torch.Tensor, all_replicas: bool) -> torch.Tensor:
        # [probes, ...] -> [towers, replicas, ...], or the replica mean [towers, ...]
        per_tower = gold_logprobs.view(self.config.num_towers, self.probes.num_replicas, *gold_logprobs.shape[1:])
        return per_tower if all_replicas else per_tower.mean(dim=1)

    def _checked_probe_features(self, input_ids, attention_mask, features):
        if features is None:
            return self.probe_features(input_ids, attention_mask)
        expected = (self.config.num_towers, *input_ids.shape, self.config.hidden_size)
        if tuple(features.shape) != expected:
            raise ValueError(
                f"`features` has shape {tuple(features.shape)}, expected {expected}: pass "
                f"`probe_features(input_ids)` of a model with this config, computed on these input_ids."
            )
        return features

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
                self.tower_lm_heads.decoder = self._resized_decoder(self.tower_lm_heads.decoder)
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

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> TwoTowerCausalLMOutputWithPast | tuple:
        r"""
        labels (`torch.LongTensor` of shape `[batch, seq]`, *optional*):
            Next-token targets, shifted inside the model (pass `labels=input_ids`); -100 is ignored. With
            `num_items_in_batch` the loss is the sum over tokens divided by it (gradient accumulation).
        output_tower_hidden_states (`bool`, *optional*):
            Also return each tower's final hidden states, [num_towers, batch, seq, hidden].

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
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        model_kwargs = dict(
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_tower_hidden_states=output_tower_hidden_states,
        )
        output = self._lm_forward(input_ids, labels, _next_token_targets, logits_to_keep, model_kwargs, kwargs)
        return output if return_dict else output.to_tuple()

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
        Each tower's probe log-probability of the next token, [num_towers, batch, seq - 1], float32.

        Entry [i, b, t] is log p_probe_i(labels[b, t + 1] | tokens <= t). `labels` default to `input_ids`;
        entries whose target is -100 (or padding, where `attention_mask` is 0) are 0.0. The vocabulary
        projection is chunked (see `TwoTowerProbes.forward`), so memory stays bounded on long inputs.
        `features`: `probe_features(input_ids, attention_mask)` if already computed (probe sets on one frozen
        model share it). With `config.probe_replicas` > 1 a tower's entry is the mean over its replicas;
        `all_replicas=True` returns every replica, [num_towers, probe_replicas, batch, seq - 1].
        """
        labels = input_ids if labels is None else labels
        if labels.shape != input_ids.shape:
            raise ValueError(f"`labels` has shape {tuple(labels.shape)}, expected {tuple(input_ids.shape)}.")
        targets = labels[:, 1:]
        if attention_mask is not None:
            targets = targets.masked_fill(attention_mask[:, 1:] == 0, -100)
        features = self._checked_probe_features(input_ids, attention_mask, features)[:, :, :-1]
        return self._per_tower(self.probes(features, targets, chunk_size=chunk_size), all_replicas)


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
        return_dict: bool | None = None,
        **kwargs,
    ) -> TwoTowerCausalLMOutputWithPast | tuple:
        r"""
        labels (`torch.LongTensor` of shape `[batch, seq]`, *optional*):
            The original token ids at masked positions and -100 elsewhere (transformers'
            `DataCollatorForLanguageModeling` makes them); with `num_items_in_batch` the loss is a sum over
            tokens divided by it.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        model_kwargs = dict(
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_tower_hidden_states=output_tower_hidden_states,
        )
        output = self._lm_forward(input_ids, labels, lambda labels: labels, 0, model_kwargs, kwargs)
        return output if return_dict else output.to_tuple()

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
        Each tower's probe log-probability of the original token at every labelled position, [num_towers,
        batch, seq].

        `input_ids` hold the masked sequence and `labels` the original ids at masked positions (-100
        elsewhere); unlabelled and padding positions give 0.0. `features`: `probe_features(input_ids,
        attention_mask)` if already computed (probe sets on one frozen model share it). With
        `config.probe_replicas` > 1 a tower's entry is the mean over its replicas; `all_replicas=True` returns
        every replica, [num_towers, probe_replicas, batch, seq].
        """
        if labels is None:
            raise ValueError(
                "A masked LM's probes score masked positions: pass `labels` (original ids where input_ids hold the "
                "mask token, -100 elsewhere)."
            )
        if labels.shape != input_ids.shape:
            raise ValueError(f"`labels` has shape {tuple(labels.shape)}, expected {tuple(input_ids.shape)}.")
        if attention_mask is not None:
            labels = labels.masked_fill(attention_mask == 0, -100)
        features = self._checked_probe_features(input_ids, attention_mask, features)
        return self._per_tower(self.probes(features, labels, chunk_size=chunk_size), all_replicas)

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
