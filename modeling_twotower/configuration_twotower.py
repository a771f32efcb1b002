"""Configuration of the two-tower language model (He & Toyoizumi, arXiv 2210.07041)."""

from transformers import PretrainedConfig
from transformers.utils import logging

from .config_checks import INITIALIZATIONS, LAYOUTS, PROBE_TYPES, TOWER_TYPES, check_combinations, check_fields
from .towers import TOWER_KINDS

logger = logging.get_logger(__name__)

# The paper's sizes (arXiv 2210.07041 and its code's configs; docs/FAITHFULNESS.md); every size describes ONE
# tower. The paper-sized presets start from the reference code's initialisation; `tiny` keeps the plain N(0, 0.02)
# one of the CPU recipes' figures.
PRESETS = {
    # Small enough to train for a few minutes on two CPU cores.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "base": dict(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536, vocab_size=30528,
        initialization="reference",
    ),
    "large": dict(
        hidden_size=512, num_hidden_layers=24, num_attention_heads=16, intermediate_size=2048, vocab_size=30528,
        initialization="reference",
    ),
    # The reference's GPT variant: two GPT-2 stacks (tanh GELU, LayerNorm eps 1e-5) sharing an h-wide embedding.
    "gpt-base": dict(
        layout="gpt", hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536,
        vocab_size=30528, hidden_act="gelu_new", layer_norm_eps=1e-5, initialization="reference",
    ),
    "gpt-large": dict(
        layout="gpt", hidden_size=512, num_hidden_layers=24, num_attention_heads=16, intermediate_size=2048,
        vocab_size=30528, hidden_act="gelu_new", layer_norm_eps=1e-5, initialization="reference",
    ),
    # The reference's ELMo variant: per tower a forward and a backward LM of width 256 (hidden_size 512 = both),
    # each 2 unprojected LSTM layers of 2048 / 4096 cells followed by Linear(cells -> 256).
    "elmo-base": dict(
        layout="elmo", hidden_size=512, num_hidden_layers=2, lstm_hidden_size=2048, vocab_size=30528,
        initialization="reference",
    ),
    "elmo-large": dict(
        layout="elmo", hidden_size=512, num_hidden_layers=2, lstm_hidden_size=4096, vocab_size=30528,
        initialization="reference",
    ),
}  # fmt: skip


class TwoTowerConfig(PretrainedConfig):
    r"""
    Configuration of a [`TwoTowerForCausalLM`] or [`TwoTowerForMaskedLM`]: `num_towers` stacks of identical shape
    that share one token embedding and are joined only by a fusion head (LayerNorm of the concatenation, Linear +
    GELU, LayerNorm) whose decoder is tied to that embedding, plus an output bias.

    `hidden_size`, `num_hidden_layers`, `num_attention_heads` and `intermediate_size` describe ONE tower.
    `layout` picks one of the reference code's three variants (hezq06/twotower_lm, `ttlm/model.py`):

    - `"bert"` (default; TwoTowerDsBert): an embedding of width `embedding_size` (default `num_towers * hidden_size`)
      plus learned positions, LayerNorm and dropout, then one `Linear(embedding_size -> hidden_size)` per tower and
      pre-LN transformer blocks; bidirectional in the masked LM, causal in the causal LM. With `tower_type="lstm"`
      the towers are instead this package's LSTM stacks (cells projected back to `hidden_size` inside the LSTM; the
      masked LM adds a backward stack and a per-tower Linear(2h -> h)), the layout of the CPU recipes `tiny_lstm`
      and `tiny_elmo`.
    - `"gpt"` (TwoTowerGPT): GPT-2 stacks sharing one h-wide token and position embedding, with no embedding
      LayerNorm and no per-tower projection (each tower draws its own embedding dropout), each tower ending in its
      own final LayerNorm; the fusion head maps the concatenation down to h for the tied decoder.
    - `"elmo"` (TwoTowerELMo; masked LM only): no positions. Each tower is a forward and a backward LM of width
      `hidden_size // 2`, each an unprojected `num_hidden_layers`-layer LSTM of `lstm_hidden_size` cells followed by
      `Linear(lstm_hidden_size -> hidden_size // 2)`; both read the shared embedding (`num_towers * hidden_size // 2`
      wide) through a per-direction LayerNorm and the tower's `Linear(embedding_size -> hidden_size // 2)`.
      Position t concatenates the forward LM after tokens < t and the backward LM after tokens > t (the sequence
      shifted by the embedding of `pad_token_id`, 0 if unset, as the reference shifts in [PAD]); the fused features
      get dropout too, and a probe maps its tower's `hidden_size` to `hidden_size // 2` before its decoder.

    `initialization` draws new weights as:

    - `"normal"`: every matmul weight and embedding N(0, `initializer_range`), biases 0, norms 1 and 0, LSTM
      weights Xavier-uniform (the CPU recipes' scheme; the default, so older configs keep it).
    - `"reference"`: the reference code's, kind by kind, with r = `initializer_range`:

      | weight | bert | gpt | elmo |
      |---|---|---|---|
      | token / position embedding | U(-r, r) | N(0, r) | U(-r, r), no positions |
      | LayerNorms | 1, 0 | 1, 0 | 1, 0 |
      | q, k, v and MLP up projection | N(0, r), bias 0 | N(0, r), bias 0 | - |
      | attention output and MLP down projection | N(0, r / sqrt(2 L)), bias 0 | same | - |
      | per-tower input projection, LSTM output Linear | torch's Linear default | - | torch's Linear default |
      | LSTM weights and biases | torch's default U(+-1/sqrt(cells)) | - | same |
      | fusion Linear, probes, the control's LM heads | torch's Linear default | same | same |
      | output bias of the tied decoder | 0 | 0 | 0 |

      L is `num_hidden_layers`; torch's Linear default is U(+-1/sqrt(fan_in)) for weight and bias. The residual
      scaling is DeepSpeed's transformer kernel's (bert) and GPT-2's `c_proj` rule (gpt). The state-space towers
      (bert layout) draw their mixers' Linear layers by torch's default too (most have no bias), their depthwise
      convolutions by torch's Conv1d default, and A, D and the time step as Mamba does. Each kind declares the
      draws of its own layers (`reference_initializers` in its `towers_*.py`).

    `embedding_size=hidden_size` with the bert layout keeps the embedding norm and the per-tower projection; it
    spends about the FLOPs of one GPT-2 of width h and `num_towers * num_hidden_layers` layers.

    `separate_embeddings=True` (bert layout) cuts the token and position embeddings into `num_towers` equal slices
    of `embedding_size // num_towers` columns, each tower reading its own slice through its own LayerNorm and
    projection: the towers share no input parameter (the embedding keeps its size, each projection reads a slice).
    With `cooperative=False` the towers then share nothing at all (the fully independent control); the cooperative
    model's tied decoder still reads every slice.

    `tower_heads=True` (cooperative models) gives each tower, beside the fusion head, an LM head of its own (its own
    LayerNorm of the tower's output, then the control's probe-shaped head, untied) and a loss of its own, added to
    the joint loss (output `tower_loss`). `joint_gradient=False` then stops the joint loss's gradient at the towers'
    outputs while training: the fusion normalization and head still train on them, the towers learn from their own
    losses only (and the shared embedding from every loss through its uses outside the towers). Two models that
    differ only in `joint_gradient` have the same modules, parameters and losses: the joint-gradient experiment of
    docs/study.md.

    Example:

    ```python
    >>> from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
    >>> config = TwoTowerConfig.from_preset("base")
    >>> config.num_towers, config.hidden_size, config.fused_hidden_size, config.embedding_size
    (2, 384, 768, 768)
    >>> TwoTowerConfig.from_preset("gpt-base").embedding_size
    384
    >>> model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=128))
    ```
    """

    # Namespaced so that a future native transformers model called "twotower" can never collide with it.
    model_type = "twotower-pkg"
    keys_to_ignore_at_inference = ["cache"]

    # Fields with their defaults, as transformers 5's configs declare them (the base class makes them dataclass
    # fields); the defaults that read other fields are set by __post_init__.
    vocab_size: int = 30528  # bert-base-uncased's 30522, padded up to a multiple of 64
    hidden_size: int = 384  # width of one tower (h); the shared embedding is num_towers * h wide
    num_hidden_layers: int = 12  # layers per tower
    num_attention_heads: int = 12  # heads per tower
    intermediate_size: int = 1536  # MLP width of one tower
    num_towers: int = 2  # 2 in the paper; 3 or more also work
    embedding_size: int | None = None  # shared embedding and tied decoder width (None: the layout's, see above)
    layout: str = "bert"  # bert | gpt | elmo: the reference code's variant (see above)
    tower_type: str | None = None  # a kind of towers.py: transformer | lstm | ssm (None: the layout's first)
    lstm_hidden_size: int | None = None  # LSTM cells (None: 4 * hidden_size); bert layout: >= hidden_size
    bidirectional: bool | None = None  # None: set by the model class (causal LM: False, masked LM: True)
    cooperative: bool = True  # False: the independent-towers control (own LM head and loss per tower)
    separate_embeddings: bool = False  # bert layout: each tower reads its own slice of the embedding (see above)
    tower_heads: bool = False  # cooperative: each tower also has its own LM head and loss (see above)
    joint_gradient: bool = True  # False (with tower_heads): the joint loss does not train the towers (see above)
    sparse_prediction: bool = False  # masked LM given labels: head and loss on the labelled positions only
    probe_replicas: int = 1  # probes per tower, each with its own initial weights (replica-level statistics)
    probe_type: str = "mlp"  # mlp (the paper's: Linear, GELU, LayerNorm, Linear) | linear (softmax regression)
    probe_training_steps: int | None = None  # set by the probe phase before it saves; None: probes never trained
    hidden_act: str = "gelu"  # any key of transformers.activations.ACT2FN
    max_position_embeddings: int = 128  # the paper's context length
    hidden_dropout: float = 0.1  # embeddings, residual branches and fusion head
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12  # BERT's value, as in the reference code
    initializer_range: float = 0.02
    initialization: str = "normal"  # normal | reference: how new weights are drawn (see above)
    use_cache: bool = True  # kinds without a key/value cache set it False (generation recomputes the prefix)
    tie_word_embeddings: bool = True  # the decoder is tied to the shared input embedding (not in the control)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        check_fields(self)
        if self.tower_type is None:
            self.tower_type = next(name for name, kind in TOWER_KINDS.items() if self.layout in kind.layouts)
        if self.embedding_size is None:
            self.embedding_size = self.layout_embedding_size()[1]
        kind = TOWER_KINDS[self.tower_type]
        if self.lstm_hidden_size is None and "lstm_hidden_size" in kind.size_fields:
            self.lstm_hidden_size = 4 * self.hidden_size
        if not kind.has_cache:
            self.use_cache = False
        if not self.cooperative:
            self.tie_word_embeddings = False  # the control has per-tower LM heads, nothing to tie
        super().__post_init__(**kwargs)
        check_combinations(self)

    def layout_embedding_size(self) -> tuple[str, int]:
        """The shared embedding's width when `embedding_size` is None, by layout: (the rule in words, its value)."""
        return {
            "bert": ("num_towers * hidden_size", self.fused_hidden_size),
            "gpt": ("hidden_size", self.hidden_size),
            "elmo": ("num_towers * hidden_size // 2", self.fused_hidden_size // 2),
        }[self.layout]

    @property
    def fused_hidden_size(self) -> int:
        """Width of the concatenated towers, `num_towers * hidden_size` (and by default of the embedding)."""
        return self.num_towers * self.hidden_size

    @property
    def probe_hidden_size(self) -> int:
        """Width inside an mlp probe: `hidden_size`, or one direction's (`hidden_size // 2`) for ELMo towers."""
        return self.hidden_size // 2 if self.layout == "elmo" else self.hidden_size

    @property
    def num_probes(self) -> int:
        """Probes in all: `probe_replicas` per tower, tower-major (probe `t * probe_replicas + r`)."""
        return self.num_towers * self.probe_replicas

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "TwoTowerConfig":
        """The paper's sizes (`base`, `large`, `gpt-*`, `elmo-*`) or CPU-sized `tiny`; kwargs override fields."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **kwargs})

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "TwoTowerConfig":
        if "layout" not in config_dict:
            logger.warning(
                "This two-tower config has no `layout` field: it was saved before layouts existed, when every model "
                "had the 'bert' layout, so it loads as layout='bert'."
            )
        return super().from_dict(config_dict, **kwargs)


__all__ = ["TwoTowerConfig", "PRESETS", "INITIALIZATIONS", "LAYOUTS", "PROBE_TYPES", "TOWER_TYPES"]
