"""Configuration of the two-tower language model (He & Toyoizumi, arXiv 2210.07041)."""

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

# The paper's sizes (PAPER.md, "Reference hyper-parameters"); every size describes ONE tower.
PRESETS = {
    # Small enough to train for a few minutes on two CPU cores.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "base": dict(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536, vocab_size=30528
    ),
    "large": dict(
        hidden_size=512, num_hidden_layers=24, num_attention_heads=16, intermediate_size=2048, vocab_size=30528
    ),
    # ELMo-style towers: 2 LSTM layers of model width 256, cells of 2048 / 4096 projected back to 256.
    "elmo-base": dict(tower_type="lstm", hidden_size=256, num_hidden_layers=2, lstm_hidden_size=2048, vocab_size=30528),
    "elmo-large": dict(tower_type="lstm", hidden_size=256, num_hidden_layers=2, lstm_hidden_size=4096, vocab_size=30528),
}
TOWER_TYPES = ("transformer", "lstm")
PROBE_TYPES = ("mlp", "linear")


class TwoTowerConfig(PretrainedConfig):
    r"""
    Configuration of a [`TwoTowerForCausalLM`]: `num_towers` transformer stacks of identical shape, fed by one
    shared token embedding of width `embedding_size` (by default `num_towers * hidden_size`, the paper's) and
    joined only by a fusion head whose decoder is tied to that embedding.

    `hidden_size`, `num_hidden_layers`, `num_attention_heads` and `intermediate_size` describe ONE tower.
    `embedding_size=hidden_size` gives the h-wide embedding and decoder of the reference code's GPT variant:
    the fusion head then maps the concatenated towers down to h before the decoder, and the model spends
    about the FLOPs of one GPT-2 of width h and `num_towers * num_hidden_layers` layers (the default layout
    spends 1.1-1.7x that, its decoder being `num_towers` times wider).

    Example:

    ```python
    >>> from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
    >>> config = TwoTowerConfig.from_preset("base")
    >>> config.num_towers, config.hidden_size, config.fused_hidden_size, config.embedding_size
    (2, 384, 768, 768)
    >>> model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=128))
    ```
    """

    # Namespaced so that a future native transformers model called "twotower" can never collide with it.
    model_type = "twotower-pkg"
    keys_to_ignore_at_inference = ["cache"]

    def __init__(
        self,
        vocab_size: int = 30528,  # bert-base-uncased's 30522, padded up to a multiple of 64
        hidden_size: int = 384,  # width of one tower (h); the shared embedding is num_towers * h wide
        num_hidden_layers: int = 12,  # layers per tower
        num_attention_heads: int = 12,  # heads per tower
        intermediate_size: int = 1536,  # MLP width of one tower
        num_towers: int = 2,  # 2 in the paper; 3 or more also work
        embedding_size: int | None = None,  # shared embedding and tied decoder width (None: num_towers * hidden_size)
        tower_type: str = "transformer",  # transformer (BERT/GPT-style) | lstm (ELMo-style)
        lstm_hidden_size: int | None = None,  # lstm towers: cells >= hidden_size, projected back to it (None: 4 * h)
        bidirectional: bool | None = None,  # None: set by the model class (causal LM: False, masked LM: True)
        cooperative: bool = True,  # False: the independent-towers control (own LM head and loss per tower)
        probe_replicas: int = 1,  # probes per tower, each with its own initial weights (replica-level statistics)
        probe_type: str = "mlp",  # mlp (the paper's: Linear, GELU, LayerNorm, Linear) | linear (softmax regression)
        hidden_act: str = "gelu",  # any key of transformers.activations.ACT2FN
        max_position_embeddings: int = 128,  # the paper's context length
        hidden_dropout: float = 0.1,  # embeddings, residual branches and fusion head
        attention_dropout: float = 0.1,
        layer_norm_eps: float = 1e-12,  # BERT's value, as in the reference code
        initializer_range: float = 0.02,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,  # the decoder is tied to the shared input embedding
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.num_towers = num_towers
        self.embedding_size = embedding_size
        self.tower_type = tower_type
        self.lstm_hidden_size = lstm_hidden_size
        self.bidirectional = bidirectional
        self.cooperative = cooperative
        self.probe_replicas = probe_replicas
        self.probe_type = probe_type
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self._validate_architecture()
        if not cooperative:
            tie_word_embeddings = False  # the control has per-tower LM heads, nothing to tie
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @property
    def fused_hidden_size(self) -> int:
        """Width of the concatenated towers, `num_towers * hidden_size` (and by default of the embedding)."""
        return self.num_towers * self.hidden_size

    @property
    def num_probes(self) -> int:
        """Probes in all: `probe_replicas` per tower, tower-major (probe `t * probe_replicas + r`)."""
        return self.num_towers * self.probe_replicas

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "TwoTowerConfig":
        """The paper's sizes (`base`, `large`, `elmo-base`, `elmo-large`) or CPU-sized `tiny`; kwargs override fields."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **kwargs})

    def _validate_architecture(self):
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        for field in (*positive, "max_position_embeddings"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{field}` must be a positive integer, got {value!r}.")
        if not isinstance(self.num_towers, int) or self.num_towers < 2:
            raise ValueError(
                f"`num_towers` must be an integer >= 2 (a two-tower model needs at least two towers), "
                f"got {self.num_towers!r}."
            )
        if self.embedding_size is None:
            self.embedding_size = self.fused_hidden_size
        if not isinstance(self.embedding_size, int) or self.embedding_size <= 0:
            raise ValueError(
                f"`embedding_size` must be a positive integer (or None for num_towers * hidden_size = "
                f"{self.fused_hidden_size}), got {self.embedding_size!r}."
            )
        if self.tower_type == "transformer" and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads}); change one of them, e.g. hidden_size="
                f"{self.num_attention_heads * max(1, round(self.hidden_size / self.num_attention_heads))}."
            )
        if self.tower_type not in TOWER_TYPES:
            raise ValueError(f"Unknown `tower_type` {self.tower_type!r}; use one of {list(TOWER_TYPES)}.")
        if self.tower_type == "lstm":
            self.lstm_hidden_size = self.lstm_hidden_size or 4 * self.hidden_size
            if self.lstm_hidden_size < self.hidden_size:
                raise ValueError(
                    f"`lstm_hidden_size` ({self.lstm_hidden_size}) is smaller than `hidden_size` ({self.hidden_size}): "
                    f"LSTM cells are projected down to the tower width, never up; use lstm_hidden_size >= "
                    f"{self.hidden_size} (equal: no projection)."
                )
            # LSTM state is not a key/value cache: generation recomputes the prefix at every step.
            self.use_cache = False
        elif self.lstm_hidden_size is not None:
            raise ValueError(
                f"`lstm_hidden_size`={self.lstm_hidden_size} only applies to tower_type='lstm'; drop it for "
                f"transformer towers (their MLP width is `intermediate_size`)."
            )
        if not isinstance(self.probe_replicas, int) or self.probe_replicas < 1:
            raise ValueError(
                f"`probe_replicas` must be a positive integer (probes per tower), got {self.probe_replicas!r}."
            )
        if self.probe_type not in PROBE_TYPES:
            raise ValueError(f"Unknown `probe_type` {self.probe_type!r}; use one of {list(PROBE_TYPES)}.")
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"Unknown `hidden_act` {self.hidden_act!r}; use one of {sorted(ACT2FN)}.")
        for field in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{field}` must be in [0, 1), got {value!r}.")


__all__ = ["TwoTowerConfig", "PRESETS", "PROBE_TYPES", "TOWER_TYPES"]
