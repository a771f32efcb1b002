"""The models the speed benchmark compares, built from one TwoTowerConfig, and the FLOPs each spends per token."""

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutput

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from modeling_twotower.linear_cross_entropy import linear_cross_entropy
from twotower.training.launch.throughput import config_flops_per_token as two_tower_flops_per_token

TWO_TOWER = "two-tower"
GPT2_EQUAL_FLOPS = "gpt2-equal-flops"
GPT2_SAME_LOSS = "gpt2-same-loss"  # the same GPT-2 trained through the two-tower model's loss
REFERENCE = "reference"
MODEL_NAMES = (TWO_TOWER, GPT2_EQUAL_FLOPS, GPT2_SAME_LOSS, REFERENCE)
TWO_TOWER_SSM = "two-tower-ssm"  # the optional row: the same model with state-space towers (tower_type ssm)
# the models that generate with a cache: the reference code and GPT-2 with the same loss have no `generate`, and the
# state-space towers keep no state cache
CACHED_DECODING = (TWO_TOWER, GPT2_EQUAL_FLOPS)


# GPT-2's name of each field it takes from one tower of the two-tower config
GPT2_FIELDS = {
    "vocab_size": "vocab_size",
    "n_positions": "max_position_embeddings",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "activation_function": "hidden_act",
    "resid_pdrop": "hidden_dropout",
    "embd_pdrop": "hidden_dropout",
    "attn_pdrop": "attention_dropout",
    "layer_norm_epsilon": "layer_norm_eps",
    "initializer_range": "initializer_range",
}


def gpt2_config(config: TwoTowerConfig, num_layers: int) -> GPT2Config:
    """GPT-2 with one tower's width, heads, MLP, context, vocabulary, activation and dropout, `num_layers` deep."""
    fields = {gpt2_name: getattr(config, name) for gpt2_name, name in GPT2_FIELDS.items()}
    # GPT-2's default ids (50256) lie outside small vocabularies; the benchmark needs none of them.
    return GPT2Config(n_layer=num_layers, bos_token_id=None, eos_token_id=None, **fields)


def equal_flops_gpt2(config: TwoTowerConfig) -> GPT2LMHeadModel:
    """Hugging Face GPT-2 of one tower's width and `num_towers * num_hidden_layers` deep (issue #7's baseline)."""
    return GPT2LMHeadModel(gpt2_config(config, config.num_towers * config.num_hidden_layers))


class GPT2WithTheSameLoss(nn.Module):
    """
    The equal-FLOP GPT-2's stack (`GPT2Model`) trained through the two-tower model's own loss: its last hidden state
    goes through `linear_cross_entropy` (no logits kept, gradients computed with the loss) with a decoder tied to the
    token embedding plus an output bias, as the two-tower model's fusion head decodes. Against it the two-tower
    model's ratio measures what its towers cost, the loss being the same.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.transformer = GPT2Model(gpt2_config(config, config.num_towers * config.num_hidden_layers))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def set_attn_implementation(self, attn_implementation: str):
        self.transformer.set_attn_implementation(attn_implementation)

    def activation_checkpointing_enable(self):
        self.transformer.activation_checkpointing_enable()

    def forward(
        self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None, use_cache: bool = False
    ) -> CausalLMOutput:
        """The loss alone with `labels` (each position predicts the next label, the last none), else the logits."""
        hidden_states = self.transformer(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        decoder_weight = self.transformer.wte.weight
        if labels is None:
            return CausalLMOutput(logits=F.linear(hidden_states, decoder_weight, self.output_bias))
        next_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
        return CausalLMOutput(loss=linear_cross_entropy(hidden_states, decoder_weight, self.output_bias, next_labels))


class ReferenceProbe(nn.Module):
    """One probe as the reference code builds it: Linear, GELU, LayerNorm, Linear to the vocabulary (not tied)."""

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [batch, seq, hidden] -> [batch, seq, vocab]
        return self.decoder(self.norm(self.act_fn(self.dense(hidden_states))))


class ReferenceTwoTowerGPT2(nn.Module):
    """
    The reference code's GPT variant (hezq06/twotower_lm, `ttlm/model.py`), kept as the baseline to beat: `num_towers`
    Hugging Face `GPT2Model`s of width h share one input embedding and run one after the other in a Python
    loop; their last hidden states are concatenated, projected by Linear(num_towers * h -> h), and decoded by
    a decoder tied to the shared embedding (plus an output bias). Probes score one after the other with full
    [batch, seq, vocab] logits, after a single pass of the towers.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.towers = nn.ModuleList(
            [GPT2Model(gpt2_config(config, config.num_hidden_layers)) for _ in range(config.num_towers)]
        )
        for tower in self.towers:
            tower.set_input_embeddings(self.embed_tokens)  # one shared embedding, as in the reference code
        self.fusion_dense = nn.Linear(config.num_towers * config.hidden_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.lm_head.weight = self.embed_tokens.weight
        self.probes = nn.ModuleList([ReferenceProbe(config) for _ in range(config.num_towers)])

    def set_attn_implementation(self, attn_implementation: str):
        for tower in self.towers:
            tower.set_attn_implementation(attn_implementation)

    def activation_checkpointing_enable(self):
        for tower in self.towers:
            tower.activation_checkpointing_enable()

    def tower_hidden_states(self, input_ids: torch.LongTensor) -> list[torch.Tensor]:
        """Each tower's last hidden states, [batch, seq, hidden], computed one tower after the other."""
        return [tower(input_ids=input_ids, use_cache=False).last_hidden_state for tower in self.towers]

    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None) -> CausalLMOutput:
        fused_hidden_states = self.fusion_dense(torch.cat(self.tower_hidden_states(input_ids), dim=-1))
        logits = self.lm_head(fused_hidden_states)  # [batch, seq, vocab]
        loss = None if labels is None else ForCausalLMLoss(logits, labels, self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits)

    def probe_logprobs(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Each probe's log-probability of the next token, [num_towers, batch, seq - 1]."""
        targets = input_ids[:, 1:].unsqueeze(-1)
        gold_logprobs = []
        for probe, hidden_states in zip(self.probes, self.tower_hidden_states(input_ids)):
            logits = probe(hidden_states[:, :-1]).float()  # [batch, seq - 1, vocab]
            gold_logprobs.append(logits.log_softmax(dim=-1).gather(-1, targets).squeeze(-1))
        return torch.stack(gold_logprobs)


def ssm_config(config: TwoTowerConfig) -> TwoTowerConfig:
    """`config` with state-space towers: MambaMixer blocks of `intermediate_size` channels instead of attention + MLP."""
    return TwoTowerConfig.from_dict({**config.to_dict(), "tower_type": "ssm"})


def build_model(name: str, config: TwoTowerConfig, seed: int = 0) -> nn.Module:
    """One of MODEL_NAMES or TWO_TOWER_SSM at `config`'s sizes, with weights drawn from `seed`."""
    builders = {
        TWO_TOWER: TwoTowerForCausalLM,
        GPT2_EQUAL_FLOPS: equal_flops_gpt2,
        GPT2_SAME_LOSS: GPT2WithTheSameLoss,
        REFERENCE: ReferenceTwoTowerGPT2,
        TWO_TOWER_SSM: lambda config: TwoTowerForCausalLM(ssm_config(config)),
    }
    if name not in builders:
        raise ValueError(f"Unknown model {name!r}; choose one of {list(builders)}.")
    torch.manual_seed(seed)
    return builders[name](config)


def gold_logprobs(model: nn.Module, input_ids: torch.LongTensor) -> torch.Tensor:
    """The scoring pipeline: probes' log-probabilities of the next token, or the LM's own for GPT-2."""
    if hasattr(model, "probe_logprobs"):
        return model.probe_logprobs(input_ids)
    logits = model(input_ids, use_cache=False).logits[:, :-1].float()  # [batch, seq - 1, vocab]
    return logits.log_softmax(dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def training_flops_per_token(name: str, config: TwoTowerConfig, seq_len: int) -> float:
    """
    Model FLOPs of one training token (forward + backward), nanoGPT's estimate: 6 per matmul weight (the tied
    decoder included, embedding lookups free) plus 12 * layers * width * seq_len for attention scores.
    """
    if name == TWO_TOWER:
        return two_tower_flops_per_token(config, seq_len, "pretrain")
    if name == TWO_TOWER_SSM:
        return two_tower_flops_per_token(ssm_config(config), seq_len, "pretrain")
    hidden, layers = config.hidden_size, config.num_towers * config.num_hidden_layers
    stack = layers * (4 * hidden * hidden + 2 * hidden * config.intermediate_size)
    head = config.vocab_size * hidden
    if name == REFERENCE:
        head += config.num_towers * hidden * hidden  # fusion_dense, Linear(num_towers * h -> h)
    return 6 * (stack + head) + 12 * layers * hidden * seq_len


def num_parameters(model: nn.Module) -> int:
    """Parameters used to predict tokens (shared ones once); probes are left out, they train in a later phase."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("probes."))
