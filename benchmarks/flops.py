"""Analytic FLOPs of a ConvS2S model (paper §3), counted from its `ModelConfig`.

Only matrix products and convolutions are counted (2 FLOPs per multiply-add); embeddings,
GLUs, softmax, weight norm, the loss and the optimizer are left out (they are a few percent
and not matmul-bound). Widths: E = embed_dim, C_l = a block's output channels, C_{l-1} its
input, k its kernel, O = out_embed_dim, V the target vocabulary, S the source length.

Encoder, per source token:
    fc1 2 E C_0  +  sum_l [2 k C_{l-1} 2C_l  (conv into the GLU)
                           + 2 C_{l-1} C_l   (residual projection, only where C_{l-1} != C_l)]
    +  fc2 2 C_L E
Decoder, per target token:
    fc1 2 E C_0  +  sum_l [2 k C_{l-1} 2C_l  +  2 C_{l-1} C_l (if projected)
                           + attention layers: 2 C_l E (in_proj) + 2 E S (scores d . z)
                                               + 2 S E (context a . y) + 2 E C_l (out_proj)]
    +  fc2 2 C_L O  +  fc3 2 O V

A forward pass over a batch costs enc * (source tokens) + dec(S) * (target tokens). Training
(forward + backward) costs 3 x forward: the backward pass computes the gradient with respect
to both the input and the weights of every product, each as costly as the forward product.
Incremental decoding costs dec(S) per hypothesis and step, independent of the prefix (§5.3).

    from benchmarks.flops import encoder_flops, decoder_flops, batch_flops
    batch_flops(cfg, V, src_lens, tgt_lens)  # {"useful": ..., "padded": ...} of one forward
"""

from __future__ import annotations

from collections.abc import Sequence

from convs2s.config import ModelConfig

TRAIN_MULTIPLIER = 3  # forward + backward (input and weight gradients)


def _blocks(embed_dim: int, layers, attention: Sequence[bool] | None, source_len: float) -> float:
    """FLOPs per position of a stack of GLU conv blocks (+ attention where flagged)."""
    widths = [layers[0][0]] + [c for c, _ in layers]
    total = 0.0
    for i, (c_out, k) in enumerate(layers):
        c_in = widths[i]
        total += 2 * k * c_in * 2 * c_out  # conv producing 2C for the GLU
        if c_in != c_out:
            total += 2 * c_in * c_out  # residual projection
        if attention is not None and attention[i]:
            total += 2 * c_out * embed_dim * 2  # in_proj and out_proj
            total += 2 * embed_dim * source_len * 2  # scores and context over S positions
    return total


def encoder_flops(cfg: ModelConfig) -> float:
    """Forward FLOPs per source token."""
    E = cfg.embed_dim
    first, last = cfg.encoder_layers[0][0], cfg.encoder_layers[-1][0]
    return 2 * E * first + _blocks(E, cfg.encoder_layers, None, 0) + 2 * last * E


def decoder_flops(cfg: ModelConfig, tgt_vocab: int, source_len: float) -> float:
    """Forward FLOPs per target token (or per hypothesis and decoding step) for a source of
    `source_len` positions."""
    E = cfg.embed_dim
    first, last = cfg.decoder_layers[0][0], cfg.decoder_layers[-1][0]
    body = _blocks(E, cfg.decoder_layers, cfg.attention_layers, source_len)
    return 2 * E * first + body + 2 * last * cfg.out_embed_dim + 2 * cfg.out_embed_dim * tgt_vocab


def batch_flops(cfg: ModelConfig, tgt_vocab: int, src_lens: Sequence[int],
                tgt_lens: Sequence[int]) -> dict:
    """Forward FLOPs of one batch: `useful` counts real tokens only (each target token attends
    over its own sentence's source), `padded` the B x S and B x T tensors the model computes on
    but the output projection, which the fused loss computes on the real target rows alone
    (convs2s/model/loss.py: counting it on the padding overstated the work by 1-2%).
    """
    enc = encoder_flops(cfg)
    useful = sum(enc * s + decoder_flops(cfg, tgt_vocab, s) * t
                 for s, t in zip(src_lens, tgt_lens))
    B, S, T = len(src_lens), max(src_lens), max(tgt_lens)
    projection = 2 * cfg.out_embed_dim * tgt_vocab  # fc3, per target row
    padded = B * S * enc + B * T * decoder_flops(cfg, tgt_vocab, S) \
        - (B * T - sum(tgt_lens)) * projection
    return {"useful": float(useful), "padded": float(padded)}


def main() -> None:
    import argparse

    from convs2s.config import PRESETS

    p = argparse.ArgumentParser(description="Print forward FLOPs per token of each preset.")
    p.add_argument("--vocab", type=int, default=40_000, help="target vocabulary size")
    p.add_argument("--source-len", type=float, default=30.0, help="source tokens attended over")
    args = p.parse_args()
    print(f"{'preset':<14}{'enc/src tok':>14}{'dec/tgt tok':>14}{'train/tgt tok':>16}  (MFLOP)")
    for name, cfg in ((n, make()) for n, make in PRESETS.items()):
        enc = encoder_flops(cfg)
        dec = decoder_flops(cfg, args.vocab, args.source_len)
        print(f"{name:<14}{enc / 1e6:>14.2f}{dec / 1e6:>14.2f}"
              f"{TRAIN_MULTIPLIER * (enc + dec) / 1e6:>16.2f}")


if __name__ == "__main__":
    main()
