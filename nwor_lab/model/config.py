"""Model configurations read from Hugging Face `config.json` dicts (Llama and EAGLE heads)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

ROPE_TYPES = ("default", "linear", "llama3")
_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "max_position_embeddings")      # ints >= 1 (None: derived)
_POSITIVE = ("rms_norm_eps", "rope_theta")                                      # finite floats > 0
_SWITCHES = ("tie_word_embeddings", "attention_bias")
_TOKEN_IDS = ("bos_token_id", "eos_token_id")


def check_fields(cfg) -> None:
    """Every field of the right type and range, or a ValueError naming it (a config.json written by
    hand or for another architecture fails here, not deep inside the model)."""
    def bad(name, value, want):
        raise ValueError(f"{name}={value!r}: expected {want}, got {type(value).__name__}"
                         if not isinstance(value, (int, float)) or isinstance(value, bool)
                         else f"{name}={value!r}: expected {want}")
    for name in _COUNTS:
        v = getattr(cfg, name)
        if v is None and name in ("num_key_value_heads", "head_dim"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            bad(name, v, "an integer >= 1")
    for name in _POSITIVE:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            bad(name, v, "a finite number > 0")
    for name in _SWITCHES:
        if not isinstance(getattr(cfg, name), bool):
            bad(name, getattr(cfg, name), "true or false")
    for name in _TOKEN_IDS:
        v = getattr(cfg, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < cfg.vocab_size):
            bad(name, v, f"null or a token id in 0..{cfg.vocab_size - 1}")
    if cfg.rope_scaling is not None and not isinstance(cfg.rope_scaling, dict):
        bad("rope_scaling", cfg.rope_scaling, "null or an object")


@dataclass(frozen=True)
class LlamaConfig:
    """The Llama shape facts the lab needs; names follow Hugging Face's `LlamaConfig`.

    head_dim defaults to hidden_size // num_attention_heads. rope_scaling: None or a dict with
    `rope_type` (or legacy `type`) in default / linear / llama3 and that type's fields.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads} (GQA groups must be equal)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: RoPE needs an even head size")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"rope_scaling type {kind!r} is not supported; the lab knows "
                                 f"{', '.join(ROPE_TYPES)}")

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """From a `config.json` dict; unknown keys are kept in `extra` (HF configs carry many)."""
        names = {f for f in cls.__dataclass_fields__ if f != "extra"}
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}: is this a Llama config?")
        known = {k: v for k, v in d.items() if k in names}
        eos = known.get("eos_token_id")
        if isinstance(eos, list):  # Llama-3 lists several stop ids; the lab stops on the first
            known["eos_token_id"] = eos[0] if eos else None
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d.update(architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16")
        return d
