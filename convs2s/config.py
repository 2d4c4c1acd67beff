"""Model configuration and the named presets of the paper and the reference implementation.

A layer stack is data: a list of (channels, kernel_width) per side, as in the paper's tables.
Presets are plain functions returning a `ModelConfig`; `PRESETS` maps their names for the CLI.

    from convs2s.config import PRESETS
    cfg = PRESETS["wmt14_en_de"]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# Special token ids, fixed project-wide (the reference convention; sentencepiece is trained to
# these ids). Targets start with EOS used as BOS, as in the reference implementation.
BOS, PAD, EOS, UNK = 0, 1, 2, 3

Layers = list[tuple[int, int]]  # [(channels, kernel_width), ...]


@dataclass(frozen=True)
class ModelConfig:
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

    def __post_init__(self) -> None:
        # Frozen dataclass: normalise lists of lists (e.g. from JSON) into tuples once.
        object.__setattr__(self, "encoder_layers", [tuple(x) for x in self.encoder_layers])
        object.__setattr__(self, "decoder_layers", [tuple(x) for x in self.decoder_layers])
        if self.decoder_attention is not None:
            att = tuple(bool(a) for a in self.decoder_attention)
            if len(att) != len(self.decoder_layers):
                raise ValueError(
                    f"decoder_attention has {len(att)} flags for {len(self.decoder_layers)} "
                    "decoder layers; give one flag per layer or None for all layers"
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

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        d = dict(d)
        if d.get("decoder_attention") is not None:
            d["decoder_attention"] = tuple(d["decoder_attention"])
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# --- presets (reference-facts §3) -------------------------------------------------------------


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
    """Paper §5.1 En-Ro: 20 + 20 layers, kernel 3, 512 hidden units throughout."""
    return ModelConfig(
        embed_dim=512,
        encoder_layers=[(512, 3)] * 20,
        decoder_layers=[(512, 3)] * 20,
        out_embed_dim=512,
        dropout=0.2,
    )


def wmt14_en_de() -> ModelConfig:
    """Reference fconv_wmt_en_de (the paper's text says 10x512, 3x768, 2x2048)."""
    layers = [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
    return ModelConfig(
        embed_dim=768,
        encoder_layers=layers,
        decoder_layers=layers,
        out_embed_dim=512,
        dropout=0.2,
    )


def wmt14_en_fr() -> ModelConfig:
    """Reference fconv_wmt_en_fr: 15 layers growing from 512 to 4096 units."""
    layers = [(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] + [(4096, 1)]
    return ModelConfig(
        embed_dim=768,
        encoder_layers=layers,
        decoder_layers=layers,
        out_embed_dim=512,
        dropout=0.1,
    )


def gigaword() -> ModelConfig:
    """Paper §5.5 summarization: six layers each side, hidden size 256."""
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


PRESETS: dict[str, ModelConfig] = {
    "iwslt_de_en": iwslt_de_en(),
    "wmt16_en_ro": wmt16_en_ro(),
    "wmt14_en_de": wmt14_en_de(),
    "wmt14_en_fr": wmt14_en_fr(),
    "gigaword": gigaword(),
    "tiny": tiny(),
    "small": small(),
}
