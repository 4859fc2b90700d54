"""Configuration dataclasses and the divisibility rules that tie them together.

Every knob of a run lives in one of seven dataclasses grouped by :class:`Config`. Flat
snake_case names (``--num_layers``) map onto fields through :func:`Config.from_flat`, so the CLI
and the test suite share one vocabulary of workload dimensions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from microllm import ConfigError

DTYPES = ("fp32", "bf16", "fp16", "auto")  # auto: bf16 on CUDA, fp32 on CPU (microllm/device.py)
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_IMPLS = ("math", "sdpa", "chunked")
ACTIVATIONS = ("gelu", "swiglu")
SCHEDULES = ("1f1b", "gpipe")
LR_STYLES = ("cosine", "constant")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder-only transformer."""

    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    ffn_hidden_size: int = 0  # 0 means 4 * hidden_size (or 8/3 * hidden for swiglu, rounded)
    vocab_size: int = 128
    seq_length: int = 32
    activation: str = "gelu"
    attention_impl: str = "sdpa"
    attention_chunk: int = 16
    rotary_base: float = 10000.0
    norm_eps: float = 1e-5
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    recompute: bool = False
    num_experts: int = 0  # 0 = dense MLP
    moe_top_k: int = 1
    moe_aux_loss_coeff: float = 0.01
    vocab_pad_multiple: int = 8
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.activation == "swiglu":
            return 8 * ((8 * self.hidden_size // 3 + 7) // 8)
        return 4 * self.hidden_size


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel degrees and schedule; world size is tp * pp * dp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    pipeline_schedule: str = "1f1b"
    backend: str = "sim"  # "sim" (threads in one process) or "gloo" (processes; NCCL when each has a GPU)
    device: str = "auto"  # "auto" (CUDA when visible), "cpu" or "cuda" (microllm/device.py)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class PrecisionConfig:
    """Compute dtype; parameters, gradients and optimizer state stay in fp32 (``auto`` follows
    the device: bf16 on CUDA, fp32 on CPU)."""

    dtype: str = "fp32"
    loss_scale: float = 0.0  # 0 = dynamic scaling for fp16, none otherwise
    initial_loss_scale: float = 2.0**16
    loss_scale_window: int = 100


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW, warmup + cosine decay anchored at ``lr_decay_iters``, global clipping."""

    lr: float = 3e-3
    min_lr: float = 3e-4
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip_grad: float = 1.0
    warmup_iters: int = 2
    lr_decay_iters: int = 0  # 0 = train_iters
    lr_decay_style: str = "cosine"
    zero1: bool = False


@dataclass(frozen=True)
class TrainingConfig:
    """Loop length, batch sizes, eval cadence and determinism."""

    train_iters: int = 10
    micro_batch_size: int = 2
    global_batch_size: int = 4
    eval_interval: int = 0  # 0 = never
    eval_iters: int = 2
    exit_interval: int = 0  # 0 = run to train_iters
    seed: int = 1234
    deterministic: bool = True
    log_interval: int = 1
    metrics_path: str = ""
    routing_record: str = ""  # directory to record MoE routing decisions in (see model/routing.py)
    routing_replay: str = ""  # directory of a recorded trace: route as it did, report disagreements


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to save, and what to load."""

    save: str = ""
    save_interval: int = 0
    load: str = ""
    no_load_optim: bool = False
    no_load_rng: bool = False


@dataclass(frozen=True)
class DataConfig:
    """The learnable synthetic dataset."""

    num_samples: int = 4096
    noise: float = 0.05
    max_stride: int = 3
    data_seed: int = 7


@dataclass(frozen=True)
class Config:
    """All of a run's configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    data: DataConfig = field(default_factory=DataConfig)

    @property
    def num_microbatches(self) -> int:
        t = self.training
        return t.global_batch_size // (t.micro_batch_size * self.parallel.dp)

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.model.vocab_pad_multiple * self.parallel.tp
        return int(math.ceil(self.model.vocab_size / multiple) * multiple)

    @property
    def lr_decay_iters(self) -> int:
        return self.optimizer.lr_decay_iters or self.training.train_iters

    def validate(self) -> "Config":
        """Check every rule a real framework enforces; raise ConfigError naming the rule."""
        m, p, t = self.model, self.parallel, self.training
        _need(m.num_heads > 0 and m.hidden_size % m.num_heads == 0, "hidden_size % num_heads == 0")
        _need(m.head_dim % 2 == 0, "head_dim must be even for rotary embeddings")
        _need(m.num_heads % p.tp == 0, "num_heads % tp == 0")
        _need(m.ffn_size % p.tp == 0, "ffn_hidden_size % tp == 0")
        _need(m.num_layers % p.pp == 0, "num_layers % pp == 0")
        _need(self.padded_vocab_size % p.tp == 0, "padded vocab % tp == 0")
        _need(t.global_batch_size % (t.micro_batch_size * p.dp) == 0,
              "global_batch_size % (micro_batch_size * dp) == 0")
        _need(self.num_microbatches >= p.pp, "num_microbatches >= pp")
        _need(not p.sequence_parallel or m.seq_length % p.tp == 0, "seq_length % tp == 0 with sequence_parallel")
        _need(not p.sequence_parallel or p.tp > 1, "sequence_parallel requires tp > 1")
        _need(m.num_experts == 0 or 1 <= m.moe_top_k <= m.num_experts, "1 <= moe_top_k <= num_experts")
        _need(m.activation in ACTIVATIONS, f"activation in {ACTIVATIONS}")
        _need(m.attention_impl in ATTENTION_IMPLS, f"attention_impl in {ATTENTION_IMPLS}")
        _need(p.pipeline_schedule in SCHEDULES, f"pipeline_schedule in {SCHEDULES}")
        _need(p.backend in ("sim", "gloo"), "backend in ('sim', 'gloo')")
        _need(self.precision.dtype in DTYPES, f"dtype in {DTYPES}")
        _need(p.device in DEVICES, f"device in {DEVICES}")
        _need(self.optimizer.lr_decay_style in LR_STYLES, f"lr_decay_style in {LR_STYLES}")
        _need(not self.optimizer.lr_decay_iters or self.optimizer.lr_decay_iters >= self.optimizer.warmup_iters,
              "lr_decay_iters >= warmup_iters")
        _need(t.train_iters >= 1, "train_iters >= 1")
        _need(not self.optimizer.zero1 or p.dp >= 1, "zero1 needs a data-parallel group")
        _need(0.0 <= m.hidden_dropout < 1.0 and 0.0 <= m.attention_dropout < 1.0, "0 <= dropout < 1")
        tracing = bool(t.routing_record or t.routing_replay)
        _need(not (t.routing_record and t.routing_replay), "routing_record and routing_replay are exclusive")
        _need(not tracing or m.num_experts > 0, "routing traces need num_experts > 0")
        _need(not tracing or not m.recompute, "routing traces need recompute off (it reruns forward)")
        return self

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "Config":
        kwargs = {f.name: _SECTIONS[f.name](**dict(data.get(f.name, {}))) for f in fields(cls)}
        return cls(**kwargs)

    def with_flat(self, **flat: Any) -> "Config":
        """Return a copy with flat snake_case overrides (``num_layers=4, tp=2``)."""
        sections: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            section = FLAT_INDEX.get(key)
            if section is None:
                raise ConfigError(f"unknown configuration key: {key}")
            sections.setdefault(section, {})[key] = value
        out = self
        for section, values in sections.items():
            out = replace(out, **{section: replace(getattr(out, section), **values)})
        return out

    @classmethod
    def from_flat(cls, **flat: Any) -> "Config":
        return cls().with_flat(**flat)


def _need(ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(f"invalid configuration: {rule}")


_SECTIONS = {
    "model": ModelConfig, "parallel": ParallelConfig, "precision": PrecisionConfig,
    "optimizer": OptimizerConfig, "training": TrainingConfig, "checkpoint": CheckpointConfig,
    "data": DataConfig,
}
FLAT_INDEX: dict[str, str] = {
    f.name: section for section, cls in _SECTIONS.items() for f in fields(cls)
}
FLAT_TYPES: dict[str, Any] = {
    f.name: f.default for cls in _SECTIONS.values() for f in fields(cls)
}
