"""The settings of the model package, in one torch-free module (cheap to import when a
workflow is declared): the model's shape (`ModelConfig`, with the named presets of the paper and
the reference implementation), the optimization recipe (`TrainConfig`) and beam search
(`SearchConfig`, with the summarization preset). All are frozen dataclasses sharing `Settings`:
`replace(**changes)`, `to_dict()` and `from_dict(d)` (which refuses unknown fields and values
of another type, by the rules of `--set`; a `TrainConfig` ignores the fields it no longer has,
`RETIRED_TRAIN_FIELDS`).

A layer stack is data: a list of (channels, kernel_width) per side, as in the paper's tables.
Presets are plain functions returning a config; `PRESETS` maps their names for the CLI.

    from convs2s.config import PRESETS, SearchConfig, TrainConfig
    cfg = PRESETS["wmt14_en_de"]()  # or wmt14_en_de()
    train = TrainConfig(max_epochs=5).replace(lr=0.5)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# The precisions a search can multiply with, and training's choices: the precision table
# (convs2s.precision.MODES, the standard library only); every --precision offers these.
from convs2s.precision import CHOICES as TRAINING_PRECISIONS
from convs2s.precision import INFERENCE_PRECISIONS

# Special token ids, fixed project-wide (the reference convention; sentencepiece is trained to
# these ids). Targets start with EOS used as BOS, as in the reference implementation.
BOS, PAD, EOS, UNK = 0, 1, 2, 3

Layers = list[tuple[int, int]]  # [(channels, kernel_width), ...]


class Settings:
    """The dataclass plumbing every config shares (a base of frozen dataclasses)."""

    def to_dict(self) -> dict:
        """Plain dict for checkpoints, MLflow params and JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """`to_dict`'s dict back; a ValueError names an unknown field, or a value of another
        type than its field's (checked as `--set` checks one: an lr of "1e-3x" or a
        warmup_updates of "200" fails here, not in a training worker)."""
        from storage.settings import check_fields

        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**check_fields(cls, d))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ModelConfig(Settings):
    """Shape of a ConvS2S model (paper §3). Field names follow the paper's terms."""

    embed_dim: int  # E: token and position embedding size (encoder and decoder)
    encoder_layers: Layers  # (channels, kernel) per encoder block
    decoder_layers: Layers  # (channels, kernel) per decoder block
    out_embed_dim: int  # decoder fc2 output size, the input of fc3 (paper §3.2)
    dropout: float = 0.1  # dropout probability; 1 - dropout is appendix A's retain prob. p
    max_positions: int = 1024  # longest sequence the learned position embeddings cover
    # Multi-step attention (§3.3): one flag per decoder layer, or None for attention everywhere.
    decoder_attention: tuple[bool, ...] | None = None
    share_decoder_embed: bool = False  # tie fc3 to the decoder input embedding (needs E == out)
    # Learned position embeddings on each side (§3.1); Table 4 ablates them. Without them the
    # model still refuses inputs over max_positions (one limit for every model).
    src_positions: bool = True
    tgt_positions: bool = True

    def __post_init__(self) -> None:
        for name in ("embed_dim", "out_embed_dim"):
            if not _count(getattr(self, name)):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for side in ("encoder_layers", "decoder_layers"):
            layers = getattr(self, side)
            if not layers or not all(isinstance(x, (list, tuple)) and len(x) == 2
                                     and all(_count(n) for n in x) for x in layers):
                raise ValueError(f"{side} is [[channels, kernel_width], ...], at least one "
                                 f"layer of two positive integers; got {layers!r}")
        if not _count(self.max_positions) or self.max_positions < 2:
            raise ValueError(f"max_positions must be an integer >= 2 (a piece and EOS), got "
                             f"{self.max_positions!r}")
        # Frozen dataclass: normalise lists of lists (e.g. from JSON) into tuples once.
        object.__setattr__(self, "encoder_layers", [tuple(x) for x in self.encoder_layers])
        object.__setattr__(self, "decoder_layers", [tuple(x) for x in self.decoder_layers])
        if self.decoder_attention is not None:
            flags = self.decoder_attention  # true / false per layer (1 / 0: fairseq's form);
            if isinstance(flags, (str, bytes)) or not all(  # "false" or 0.5 is no flag
                    a in (0, 1) and isinstance(a, (bool, int)) for a in flags):
                raise ValueError(f"decoder_attention is one flag per decoder layer, true or "
                                 f"false; got {flags!r}")
            att = tuple(bool(a) for a in flags)
            if len(att) != len(self.decoder_layers):
                raise ValueError(
                    f"decoder_attention has {len(att)} flags for {len(self.decoder_layers)} "
                    "decoder layers; give one flag per layer, or null (None) for all layers"
                )
            object.__setattr__(self, "decoder_attention", att)
        if self.share_decoder_embed and self.out_embed_dim != self.embed_dim:
            raise ValueError("share_decoder_embed needs out_embed_dim == embed_dim")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def attention_layers(self) -> tuple[bool, ...]:
        """Per decoder layer: does it attend? (all layers when decoder_attention is None)."""
        if self.decoder_attention is None:
            return tuple(True for _ in self.decoder_layers)
        return self.decoder_attention

    def to_dict(self) -> dict:
        """Plain dict (lists, ints, floats) for checkpoints, MLflow params and JSON."""
        d = dataclasses.asdict(self)
        d["encoder_layers"] = [list(x) for x in self.encoder_layers]
        d["decoder_layers"] = [list(x) for x in self.decoder_layers]
        if self.decoder_attention is not None:
            d["decoder_attention"] = list(self.decoder_attention)
        return d


def _either(names) -> str:
    """("a", "b", "c") -> "'a', 'b' or 'c'"."""
    quoted = [repr(n) for n in names]
    return ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]


def _count(n) -> bool:
    """A positive integer (not a bool, not 3.5)."""
    return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1


# --- presets (docs/reference.md, Presets) ---------------------------------------------------------


def iwslt_de_en() -> ModelConfig:
    """The reference's small model (fconv_iwslt_de_en), also our CPU benchmark model."""
    return ModelConfig(
        embed_dim=256,
        encoder_layers=[(256, 3)] * 4,
        decoder_layers=[(256, 3)] * 3,
        out_embed_dim=256,
        dropout=0.2,
    )


def wmt16_en_ro() -> ModelConfig:
    """Paper §5.1 En-Ro: 20 + 20 layers, kernel 3, 512 hidden units throughout. The dropout
    (0.2) is this project's: the paper gives none for this model."""
    return ModelConfig(
        embed_dim=512,
        encoder_layers=[(512, 3)] * 20,
        decoder_layers=[(512, 3)] * 20,
        out_embed_dim=512,
        dropout=0.2,
    )


def wmt14_en_de() -> ModelConfig:
    """Reference fconv_wmt_en_de (the paper's text says 10x512, 3x768, 2x2048; and 512-wide
    embeddings, §4.2, where the reference's are 768)."""
    layers = [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
    return ModelConfig(
        embed_dim=768,
        encoder_layers=layers,
        decoder_layers=layers,
        out_embed_dim=512,
        dropout=0.2,
    )


def wmt14_en_de_ablation() -> ModelConfig:
    """The model of the paper's analysis (§5.4): 13 encoder layers at kernel 3 and 5 decoder
    layers at kernel 5 (no widths given there; 512, §4.2's default and §5.1's En-Ro model)."""
    return ModelConfig(
        embed_dim=512,
        encoder_layers=[(512, 3)] * 13,
        decoder_layers=[(512, 5)] * 5,
        out_embed_dim=512,
        dropout=0.2,
    )


def wmt14_en_fr() -> ModelConfig:
    """Reference fconv_wmt_en_fr: 15 layers growing from 512 to 4096 units (the paper's text,
    §5.1, gives 5 x 512, 4 x 768, 3 x 1024, then 2048 and 4096 at kernel 1, and 512-wide
    embeddings, §4.2; the reference's, which its published model was trained with: 6 x 512
    and 768)."""
    layers = [(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] + [(4096, 1)]
    return ModelConfig(
        embed_dim=768,
        encoder_layers=layers,
        decoder_layers=layers,
        out_embed_dim=512,
        dropout=0.1,
    )


def gigaword() -> ModelConfig:
    """Paper §5.7 summarization: six layers each side, hidden size 256. The dropout (0.2) is
    this project's choice: the paper gives none for this model."""
    return ModelConfig(
        embed_dim=256,
        encoder_layers=[(256, 3)] * 6,
        decoder_layers=[(256, 3)] * 6,
        out_embed_dim=256,
        dropout=0.2,
    )


def tiny() -> ModelConfig:
    """A few-thousand-parameter model for tests and the CPU smoke workflow."""
    return ModelConfig(
        embed_dim=32,
        encoder_layers=[(32, 3)] * 2,
        decoder_layers=[(32, 3)] * 2,
        out_embed_dim=32,
        dropout=0.0,
        max_positions=256,
    )


def small() -> ModelConfig:
    """CPU-trainable model for the demo corpus (smoke workflows): learns it in minutes."""
    return ModelConfig(
        embed_dim=128,
        encoder_layers=[(128, 3)] * 3,
        decoder_layers=[(128, 3)] * 3,
        out_embed_dim=128,
        dropout=0.1,
        max_positions=256,
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "iwslt_de_en": iwslt_de_en,
    "wmt16_en_ro": wmt16_en_ro,
    "wmt14_en_de": wmt14_en_de,
    "wmt14_en_de_ablation": wmt14_en_de_ablation,
    "wmt14_en_fr": wmt14_en_fr,
    "gigaword": gigaword,
    "tiny": tiny,
    "small": small,
}


# --- optimization (paper §4.2, docs/reference.md, Recipes) ----------------------------------------

# TrainConfig fields that were removed, dropped when an old saved config is read: the test-only
# fault injection (crash_rank dying at update crash_at_update), now environment variables of the
# driver (convs2s.train.faults.CrashInjection) so that a test hook changes no recipe or hash.
RETIRED_TRAIN_FIELDS = ("crash_at_update", "crash_rank")

# The lr schedules that end with the run's budget (their lr falls to 0 as it is spent); the
# others shrink the lr by epochs and stop training once it falls below min_lr.
BUDGET_SCHEDULES = ("cosine", "linear")

# The TrainConfig fields a checkpoint's optimizer state was made with (recorded in its
# meta.json): a resume with others is refused (convs2s.train.data.resume_differences). Loading
# the state brings back the saved values, so another momentum or weight decay was not used while
# the run's params said it was, and another optimizer's state did not load.
OPTIMIZER_KEYS = ("optimizer", "momentum", "weight_decay", "adam_betas", "adam_eps")

# Settings that only some choice of another setting reads: (the choosing field, the choices
# that read it). One given on purpose for a run whose choice ignores it is refused
# (`unused_setting`): momentum set for Adam trained as if unset, while the run's params said 0.9.
USED_ONLY_BY = {"momentum": ("optimizer", ("nag",)),
                "adam_betas": ("optimizer", ("adam",)), "adam_eps": ("optimizer", ("adam",)),
                "anneal_from_epoch": ("lr_schedule", ("fixed",)),
                "lr_shrink": ("lr_schedule", ("anneal", "plateau", "fixed")),
                "min_lr": ("lr_schedule", ("anneal", "plateau", "fixed"))}


def reads(train: TrainConfig, name: str) -> bool:
    """Whether TrainConfig `train` reads its setting `name` at all (whatever its value): a
    rerun that changes only settings its run never reads is the same run."""
    if name in ("lr_shrink", "min_lr") and train.lr_schedule == "fixed" \
            and train.anneal_from_epoch is None:
        return False
    if name in USED_ONLY_BY:
        chooser, readers = USED_ONLY_BY[name]
        return getattr(train, chooser) in readers
    return name != "warmup_init_lr" or bool(train.warmup_updates)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def unused_setting(train: TrainConfig, name: str) -> str | None:
    """Why TrainConfig `train` does not read its setting `name` (`reads`), and the fix; None
    where it does, or where the setting is its default (`null` turns one off, as a preset
    does)."""
    field = next((f for f in dataclasses.fields(TrainConfig) if f.name == name), None)
    if field is None or getattr(train, name) == field.default or reads(train, name):
        return None
    if name in USED_ONLY_BY and getattr(train, USED_ONLY_BY[name][0]) \
            not in USED_ONLY_BY[name][1]:
        chooser, readers = USED_ONLY_BY[name]
        return (f"{name} is read only with {chooser} {' / '.join(readers)}, and this run's "
                f"is {getattr(train, chooser)}: leave it out, or set train.{chooser}")
    if name == "warmup_init_lr":
        return ("warmup_init_lr is the lr a warmup starts from, and warmup_updates is 0: set "
                "train.warmup_updates > 0 with it, or leave it out")
    return (f"{name} is read by the fixed schedule once it shrinks the lr, and this run's "
            "never does: set train.anneal_from_epoch with it, or leave it out")


@dataclass(frozen=True)
class TrainConfig(Settings):
    """Optimization recipe. Defaults are the paper's (§4.2: NAG 0.99, lr 0.25, clip 0.1), but
    for the lr schedule, `plateau`, fairseq-py's reading of its rule (docs/reference.md,
    Recipes); the paper presets each set theirs."""

    # "nag": Nesterov accelerated gradient (paper §4.2); "adam": AdamW (decoupled weight decay).
    optimizer: Literal["nag", "adam"] = "nag"
    lr: float = 0.25
    momentum: float = 0.99  # Nesterov accelerated gradient (paper §4.2)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.1  # gradient renormalization threshold (paper §4.2); 0 disables
    # "anneal": paper §4.2 as its authors' code does it: once an epoch's valid perplexity does
    # not improve on the epoch before, lr /= 10 after that epoch and every later one.
    # "plateau": fairseq-py's reading, lr /= 10 after each epoch whose valid perplexity did not
    # improve on the best (docs/reference.md, Recipes).
    # "fixed": reference recipe, lr fixed, then x lr_shrink per epoch from anneal_from_epoch.
    # "cosine" / "linear": from lr down to 0 over the run's budget (the fraction spent of
    # max_time, max_updates or max_epochs, whichever is furthest): a budgeted run ends annealed.
    lr_schedule: Literal["anneal", "plateau", "fixed", "cosine", "linear"] = "plateau"
    lr_shrink: float = 0.1
    anneal_from_epoch: int | None = None  # "fixed" only: first (1-based) epoch with a shrunk lr
    min_lr: float = 1e-4  # stop once the lr falls below this (paper §4.2)
    warmup_updates: int = 0  # linear warmup from warmup_init_lr to lr over this many updates
    warmup_init_lr: float = 0.0
    label_smoothing: float = 0.0  # the paper uses none; the reference's WMT recipes use 0.1
    max_epochs: int = 100  # 0 = no epoch limit
    max_updates: int = 0  # 0 = no update limit
    # Wall-clock budget in seconds (0 = none), like the reference's --stop-time-hours: training
    # stops after the first update that ends past it, validates and checkpoints. The clock counts
    # the training loop (validation and checkpoints included, not Ray's start-up) and carries
    # over a resume: a resumed run has the budget left at its latest checkpoint.
    max_time: float = 0.0
    update_freq: int = 1  # gradient accumulation: micro-batches per update and per rank
    checkpoint_interval: int = 0  # also checkpoint every N updates (0: only at epoch ends)
    keep_last: int = 3  # checkpoints kept besides best/ (Ray's CheckpointConfig.num_to_keep)
    log_interval: int = 50  # updates between train metric logs (the only host syncs)
    shuffle_buffer: int = 256  # batch rows in the per-worker shuffle buffer (reshuffled per epoch)
    seed: int = 1
    # "auto": bf16 autocast where every rank's hardware multiplies bf16 natively (GPUs from
    # Ampere, CPUs with AVX-512 BF16 / AMX), float32 elsewhere; "bf16" / "fp32": as asked.
    # Decided once per run and the same on every rank (convs2s.precision).
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # torch.compile the model through the fused loss as one graph with dynamic shapes (one
    # compile for every batch shape): "" off (eager), else the backend ("inductor"; "aot_eager"
    # captures without generating code, for checks).
    compile: str = ""
    # The element-wise work between each block's products (GLU, residuals, scalings, the
    # attention's softmax) compiled as four functions that every block shares
    # (convs2s.model.fused), and on CUDA the fused loss's chunks: "" off (eager), else the
    # backend ("inductor"). A compile of under a minute where the whole model's (`compile`)
    # takes minutes; not with `compile`, which fuses all of it itself.
    fuse: str = ""
    # How the convolutions' full pass is computed (convs2s.model.conv.use_native_conv):
    # "windows", k-frame windows and one GEMM (faster on CPUs, docs/benchmarks.md), or
    # "native", the library's convolution (cuDNN on a GPU: no windows written). The same
    # parameters, checkpoints and, to float32 rounding, the same numbers.
    conv: Literal["windows", "native"] = "windows"
    # Static shapes: every training batch padded to one of a few fixed shapes, its lengths
    # rounded up to a multiple of this and its sentences to a rung of a ladder
    # (convs2s.train.collate.static_shape; about 1.2x the token slots on newstest-like
    # batches, docs/benchmarks.md); 0: each batch its own shape. The same updates: pad rows
    # and positions carry no loss (tests/test_local_training.py).
    static_shapes: int = 0
    # CUDA graphs over those shapes: the training forward through the loss and its backward,
    # captured once per shape and replayed (convs2s.train.graphs), for steps bound by
    # launching kernels (the paper's 3,000 tokens per GPU). Needs static_shapes; a CUDA device
    # and one rank (elsewhere the run says so and steps eagerly); not with `compile`.
    cuda_graphs: bool = False
    # DDP, for runs of several ranks (convs2s.train.ddp): the gradient buckets' size in MiB
    # (PyTorch's default 25), and "bf16" to all-reduce the gradients as bf16 (half the bytes;
    # the weights and the optimizer stay float32) or "none".
    ddp_bucket_mb: float = 25.0
    grad_compression: Literal["none", "bf16"] = "none"
    # Dropout that follows the passes over the data a time budget will reach on this machine
    # (convs2s.train.regularization): ((from_passes, dropout), ...), ascending, the first from
    # 0. After `passes_probe_updates` updates the trainer projects the run's passes from their
    # rate and sets the dropout of the last entry whose `from_passes` the projection reaches,
    # once, and says so (log, MLflow). Empty, or no max_time: the model's dropout throughout.
    dropout_by_passes: tuple[tuple[float, float], ...] = ()
    passes_probe_updates: int = 50

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return super().from_dict(cls.upgrade(d))

    @staticmethod
    def upgrade(d: dict) -> dict:
        """`d` in today's fields. Configs saved before a field was removed (every checkpoint
        holds its train_config) still load: the removed fields are dropped."""
        d = {k: v for k, v in d.items() if k not in RETIRED_TRAIN_FIELDS}
        if "bf16" in d:  # before `precision`: bf16 = True meant bf16 where it pays (GPUs)
            d.setdefault("precision", "auto" if d.pop("bf16") else "fp32")
        return d

    def __post_init__(self) -> None:
        if self.lr_schedule not in ("anneal", "plateau", "fixed", "cosine", "linear"):
            raise ValueError("lr_schedule must be 'anneal', 'plateau', 'fixed', 'cosine' or "
                             "'linear', "
                             f"got {self.lr_schedule!r}")
        if self.lr_schedule == "fixed" and self.anneal_from_epoch is not None \
                and self.anneal_from_epoch < 1:
            raise ValueError("anneal_from_epoch is 1-based: give an epoch >= 1 or None")
        if self.precision not in TRAINING_PRECISIONS:
            raise ValueError(f"precision must be {_either(TRAINING_PRECISIONS)}, got "
                             f"{self.precision!r}")
        if self.optimizer not in ("nag", "adam"):
            raise ValueError(f"optimizer must be 'nag' or 'adam', got {self.optimizer!r}")
        object.__setattr__(self, "adam_betas", tuple(self.adam_betas))  # from JSON: a list
        if len(self.adam_betas) != 2 or not all(
                _is_number(b) and 0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"adam_betas is (beta1, beta2), each in [0, 1), got "
                             f"{self.adam_betas}")
        for name, ok, want in (("lr", self.lr > 0, "> 0"), ("adam_eps", self.adam_eps > 0, "> 0"),
                               ("momentum", 0.0 <= self.momentum < 1.0, "in [0, 1)"),
                               ("lr_shrink", 0.0 < self.lr_shrink <= 1.0, "in (0, 1]")):
            if not ok:
                raise ValueError(f"{name} must be {want}, got {getattr(self, name)}")
        if self.lr_schedule not in BUDGET_SCHEDULES and self.lr < self.min_lr:
            raise ValueError(f"lr {self.lr:g} is below min_lr {self.min_lr:g}, where the "
                             f"{self.lr_schedule!r} schedule stops training: it would stop "
                             "before its first update; lower min_lr (train.min_lr) or raise lr")
        for name in ("weight_decay", "clip_norm", "min_lr", "warmup_init_lr", "warmup_updates",
                     "max_epochs", "max_updates", "checkpoint_interval", "shuffle_buffer",
                     "seed"):  # (the epoch's plan seeds numpy with it: non-negative only)
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.update_freq < 1:
            raise ValueError(f"update_freq must be >= 1, got {self.update_freq}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        if self.log_interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {self.log_interval}")
        if self.max_time < 0:
            raise ValueError(f"max_time is in seconds and must be >= 0, got {self.max_time}")
        if self.max_epochs <= 0 and self.max_updates <= 0 and self.max_time <= 0:
            raise ValueError("give max_epochs, max_updates or max_time (all 0 would train "
                             "forever)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not all(isinstance(pair, (list, tuple)) and all(map(_is_number, pair))
                   for pair in self.dropout_by_passes):  # ([1, 2]: "'int' is not iterable")
            raise ValueError("dropout_by_passes is ((from_passes, dropout), ...), a list of "
                             "number pairs, e.g. [[0, 0.3], [30, 0.4]]; got "
                             f"{self.dropout_by_passes}")
        table = tuple(tuple(float(x) for x in pair) for pair in self.dropout_by_passes)
        object.__setattr__(self, "dropout_by_passes", table)  # from JSON / --set: lists
        if table:
            if any(len(pair) != 2 for pair in table) or table[0][0] != 0.0 \
                    or any(a[0] >= b[0] for a, b in zip(table, table[1:])) \
                    or not all(0.0 <= p < 1.0 for _, p in table):
                raise ValueError("dropout_by_passes is ((from_passes, dropout), ...): from_passes "
                                 "ascending from 0, each dropout in [0, 1); got "
                                 f"{self.dropout_by_passes}")
        if self.passes_probe_updates < 1:
            raise ValueError("passes_probe_updates must be >= 1")
        if self.ddp_bucket_mb <= 0:
            raise ValueError(f"ddp_bucket_mb must be > 0, got {self.ddp_bucket_mb}")
        if self.grad_compression not in ("none", "bf16"):
            raise ValueError("grad_compression must be 'none' or 'bf16', got "
                             f"{self.grad_compression!r}")
        if self.conv not in ("windows", "native"):
            raise ValueError(f"conv must be 'windows' or 'native', got {self.conv!r}")
        if self.static_shapes < 0:
            raise ValueError("static_shapes is the multiple lengths are rounded up to (0: off), "
                             f"got {self.static_shapes}")
        if self.cuda_graphs and not self.static_shapes:
            raise ValueError("cuda_graphs captures one graph per batch shape: give static_shapes "
                             "as well (8 is a good start)")
        for name in ("compile", "fuse"):  # a misspelt backend: here, not in the first step
            if problem := backend_problem(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r}: {problem}")
        if self.fuse and self.compile:
            raise ValueError(f"fuse={self.fuse!r} and compile={self.compile!r}: choose one (the "
                             "whole-model compile fuses the same work itself)")
        if self.cuda_graphs and self.compile:
            raise ValueError(f"cuda_graphs and compile={self.compile!r}: choose one (a compiled "
                             "step is not captured in these graphs)")


# torch.compile's own backends (torch._dynamo.list_backends(exclude_tags=()) of torch 2.x, the
# testing ones left out), named here so that a config is checked without importing torch;
# a package may add more under the "torch_dynamo_backends" entry points (torch reads those too).
COMPILE_BACKENDS = ("inductor", "aot_eager", "aot_eager_decomp_partition",
                    "aot_eager_default_partitioner", "aot_ts", "cudagraphs", "eager", "openxla",
                    "ts", "tvm")


def backend_problem(name: str) -> str | None:
    """Why `name` cannot be TrainConfig.compile / .fuse ("" is off); None when it can."""
    if not name or name in COMPILE_BACKENDS:
        return None
    from importlib.metadata import entry_points

    if name in {e.name for e in entry_points(group="torch_dynamo_backends")}:
        return None
    return (f"not a torch.compile backend; give one of {', '.join(COMPILE_BACKENDS)}, or "
            "false (off)")


def keep_explicit_dropout(train: TrainConfig, preset_dropout: float,
                          dropout: float) -> TrainConfig:
    """A sweep variant's dropout (a model variant of workflows/ablations.py) wins over
    `dropout_by_passes`: `train` without the table when `dropout` is not the preset's. (A
    `--set model.dropout`, in workflows/overrides.py, wins whatever its value.)"""
    if train.dropout_by_passes and dropout != preset_dropout:
        return train.replace(dropout_by_passes=())
    return train


# --- beam search (paper §4.3, docs/reference.md, Evaluation) --------------------------------------




@dataclass(frozen=True)
class SearchConfig(Settings):
    """Beam search and output settings (docs/reference.md, Evaluation). Lengths count output
    pieces."""

    beam: int = 5  # beam width K (paper §4.3: 5)
    lenpen: float = 1.0  # score = sum log p / |y|^lenpen
    max_len_a: float = 0.0  # at most a * |x| + b output pieces (|x| counts source EOS)
    max_len_b: int = 200
    min_len: int = 1  # at least this many pieces (summarization, paper §4.1: 14 words)
    unk_penalty: float = 0.0  # subtracted from log p(<unk>); negative favours <unk>
    nbest: int = 1  # hypotheses kept per sentence (1 <= nbest <= beam)
    replace_unk: bool = False  # replace <unk> by the most attended source piece (a whole word:
    # that word, or its `dictionary` entry; paper §4.3)
    dictionary: str | None = None  # `source target` word table used by replace_unk
    max_sentences: int = 128  # sentences per search batch
    # Also cut a batch where its padded source tokens (sentences x longest) would pass this;
    # 0: sentences only. Batches are cut from the sentences sorted by length either way.
    max_tokens: int = 0
    # Weights the search multiplies with (convs2s.inference.quantize): "fp32" as trained;
    # "bf16"; "int8" (per-channel int8 weights, CPU). Faster, scores may move slightly: never
    # a silent default.
    precision: Literal["fp32", "bf16", "int8"] = "fp32"
    # "fp32": serve float32 weights, with one warning, where `precision` cannot run (no int8
    # kernels in this build or CPU, int8 asked of a GPU, bf16 on a GPU without it); None
    # (default): that is an error. The translator's search says what was served.
    precision_fallback: Literal["fp32"] | None = None
    # Vocabulary selection (convs2s.inference.shortlist): the lexical table (a shortlist.npz of the
    # model's data, preprocessing's shortlist/ stage); each batch scores only the
    # shortlist_frequent most frequent targets and the table's candidates for its source
    # tokens (shortlist_per_source of them; 0: all the table has). None: the whole vocabulary.
    shortlist: str | None = None
    shortlist_frequent: int = 2000
    shortlist_per_source: int = 0

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam must be >= 1, got {self.beam}")
        for name in ("lenpen", "unk_penalty", "max_len_a"):  # (nan changed the outputs)
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
            # a float whatever was given (lenpen=1): a served model's params schema is typed
            # by these values, and a long there refuses a request's lenpen 0.6
            object.__setattr__(self, name, float(getattr(self, name)))
        if not 1 <= self.nbest <= self.beam:
            raise ValueError(f"nbest must be in [1, beam={self.beam}], got {self.nbest}")
        if self.min_len < 0 or self.max_len_b < 0 or self.max_len_a < 0:
            raise ValueError("min_len, max_len_a and max_len_b must be >= 0")
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ValueError("max_len_b=0 with max_len_a=0 allows no output piece: give "
                             "max_len_b >= 1 (or max_len_a > 0)")
        if self.max_len_a == 0 and self.max_len_b < self.min_len:
            # EOS would be forced at max_len_b although min_len still bans it
            # (convs2s.inference.search): every output cut there, with the model's own EOS
            # score. (Past the model's position table: `Translator` refuses it.)
            raise ValueError(f"min_len={self.min_len} is more output pieces than "
                             f"max_len_b={self.max_len_b} allows (max_len_a=0): lower min_len "
                             "or raise max_len_b")
        if self.max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {self.max_sentences}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0: no token budget), got "
                             f"{self.max_tokens}")
        if self.precision not in INFERENCE_PRECISIONS:
            raise ValueError(f"precision must be {_either(INFERENCE_PRECISIONS)}, got "
                             f"{self.precision!r}")
        if self.precision_fallback not in (None, "fp32"):
            raise ValueError(f"precision_fallback must be None or 'fp32', got "
                             f"{self.precision_fallback!r}")
        if self.shortlist_frequent < 0 or self.shortlist_per_source < 0:
            raise ValueError("shortlist_frequent and shortlist_per_source must be >= 0")
        if self.dictionary is not None and not self.replace_unk:
            raise ValueError("a dictionary is only used with replace_unk=True")


def summarization_search(**changes) -> SearchConfig:
    """Paper §4.3 / §4.1: beam 5 and outputs of at least 14 words (here BPE pieces, a close
    proxy)."""
    return SearchConfig(beam=5, min_len=14).replace(**changes)


# --- command-line values -----------------------------------------------------------------------


def duration(text: str) -> float:
    """'3600' or '3600s', '60m', '1.5h' -> seconds (argparse type of every --max-time: the
    workflows', the benchmarks', `python -m convs2s train`)."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    scale = units.get(t[-1:], None)
    try:
        value = float(t[:-1] if scale else t) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give seconds or a "
                                         "number with s, m or h (e.g. 3600, 60m, 1.5h)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time budget must be positive")
    return value
