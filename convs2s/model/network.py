"""The ConvS2S model (Gehring et al. 2017, §3) in PyTorch, with incremental decoding (§5.3).

Written in the paper's order: embeddings (§3.1), convolution blocks with GLUs and scaled
residuals (§3.2), the encoder, multi-step attention (§3.3), the decoder, the normalization and
initialization strategy (§3.4, §3.5, appendix A), then incremental decoding for generation.
Tensors are batch-first and channels-last everywhere: B x T x C (S for source positions, V for
the vocabulary). Imports only torch (and `convs2s.config` and its neighbours `layers`, `conv`
and `loss` in `convs2s.model`, themselves torch-only).

Training / scoring:

    model = ConvS2S(PRESETS["iwslt_de_en"](), src_vocab_size, tgt_vocab_size)
    logits, attn = model(src_tokens, src_lengths, prev_output_tokens)
    # src_tokens B x S (padded with PAD=1, left or right), src_lengths B (non-pad counts; the
    # model derives lengths and masks from PAD itself, so padding side does not matter),
    # prev_output_tokens B x T ([EOS] + target[:-1], right-padded with PAD)
    # logits B x T x V (unnormalized), attn B x T x S (mean over the attention layers, float32)
    loss_sum, nll_sum = model(src_tokens, src_lengths, prev_output_tokens, target=target,
                              label_smoothing=0.1)  # output layer fused with the loss

Inference (used by `convs2s.inference.search`):

    net = inference_copy(model)             # eval-mode copy, weight norm folded into plain weights
    enc = net.encode(src_tokens, src_lengths)         # EncoderOut, computed once per sentence
    state = net.init_state(enc, beam_size=K)          # DecoderState: B*K rows, zero buffers
    logits, attn = net.decode_step(tokens, state)     # tokens B*K (last outputs), logits B*K x V
    logits, attn = net.decode_step(tokens, state, out=buf)  # logits written into buf (reused)
    state.reorder(rows)                               # row i continues hypothesis rows[i]
    state.reorder(rows, sentences=keep)               # ... and drop finished sentences
    logits, attn = net.decode(prefix, enc, last_only=True)  # full-prefix recomputation

One decode step costs the same at every position: each decoder convolution keeps the last k-1
input frames and computes one matmul with its (out, k * in) weight (`Conv.step`); a block's
`step` shares all the rest with its `forward`, so the incremental step is the full pass's math.
Rows are hypotheses, the K of a sentence consecutive; attention reads each sentence's keys and
values once for its K rows (the decoder accepts N = B * K target rows for B source rows
everywhere, `decode` included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from convs2s.config import PAD, ModelConfig
from convs2s.model.conv import conv
from convs2s.model.fused import EAGER, SQRT_HALF
from convs2s.model.layers import GradMultiply, dropout, embedding, linear, make_positions
from convs2s.model.loss import output_layer_loss


class Block(nn.Module):
    """One GLU convolution block (§3.2); decoder blocks may also attend (§3.3):
    residual -> dropout -> conv -> GLU -> [attention] -> (+ residual) * sqrt(.5).

    The full pass (`forward`, encoder and decoder) and the incremental decoder step (`step`,
    §5.3) share all of it but the convolution: `_conv_input` before it, `_conv_output` after.
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, causal: bool, dropout: float,
                 attention: nn.Module | None = None):
        super().__init__()
        # Residual projection only where the width changes (plain init: no dropout before it).
        self.proj = linear(c_in, c_out) if c_in != c_out else None
        self.conv = conv(c_in, 2 * c_out, kernel, causal, dropout)  # 2 * C_out for the GLU
        self.attention = attention
        self.kernel, self.dropout = kernel, dropout
        self.fused = EAGER  # the element-wise work after the conv (convs2s.model.fused)

    def _conv_input(self, x: torch.Tensor, keep: torch.Tensor | None = None):
        """x N x T x C_in -> residual N x T x C_out, conv input N x T x C_in (dropped out)."""
        residual = x if self.proj is None else self.proj(x)
        return residual, dropout(x, self.dropout, self.training, keep=keep)

    def _conv_output(self, y: torch.Tensor, residual: torch.Tensor, g, enc):
        """Conv output y N x T x 2C -> block output N x T x C, attention N x T x S or None:
        (GLU(y) [+ attention] + residual) * sqrt(.5), GLU(y) = A * sigmoid(B)."""
        if self.attention is None:
            return self.fused.glu_residual(y, residual), None
        return self.attention(F.glu(y, dim=-1), g, enc, residual)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None,
                g: torch.Tensor | None = None, enc: EncoderOut | None = None):
        """x N x T x C_in -> N x T x C_out, attention N x T x S (None without attention).
        Attention needs `g` N x T x E (the target embedding) and `enc`; `keep`: see Encoder."""
        residual, x = self._conv_input(x, keep)
        return self._conv_output(self.conv(x), residual, g, enc)  # causal: t sees inputs <= t

    def step(self, x: torch.Tensor, buffer: torch.Tensor | None, g: torch.Tensor,
             enc: EncoderOut):
        """`forward` at the last position of the prefix, in O(1) of its length: x N x 1 x C_in
        and the conv's buffer -> N x 1 x C_out, attention N x 1 x S or None, the next buffer."""
        residual, x = self._conv_input(x)
        y, buffer = self.conv.step(x, buffer)  # N x 1 x 2C
        return *self._conv_output(y, residual, g, enc), buffer


def _check_length(tokens: torch.Tensor, max_positions: int, name: str) -> None:
    if tokens.shape[1] > max_positions:
        raise ValueError(f"{name} has {tokens.shape[1]} positions but the model's position "
                         f"table covers max_positions={max_positions}; filter or truncate "
                         "longer sentences (preprocessing) or use a larger max_positions")


# --- encoder (§3.1, §3.2, §3.4) ---------------------------------------------------------------


@dataclass
class EncoderOut:
    """What the decoder attends to, computed once per source sentence (§3.3)."""

    keys: torch.Tensor  # B x S x E: z_j, the encoder output (gradient scaled)
    values: torch.Tensor  # B x S x E: (z_j + e_j) * sqrt(.5), output plus input embedding
    mask_bias: torch.Tensor  # B x 1 x S float32: 0 for tokens, -inf for source padding
    scale: torch.Tensor  # B x 1 x 1 float32: sqrt(s), s = true source length (§3.4)

    def for_attention(self) -> "EncoderOut":
        """The keys in float32 (the scores are float32 even under autocast, `Attention`) and,
        under autocast, the values in its dtype (the product with the attention weights casts
        them to it): once for all the decoder's attention layers instead of once in each. Under
        bf16 autocast each of the 15 layers of the paper's models cast both (and the length
        scale) again, and converted the gradients back: 75 casts a step for the same numbers."""
        values, device = self.values, self.values.device.type
        if torch.is_autocast_enabled(device):
            values = values.to(torch.get_autocast_dtype(device))
        return EncoderOut(self.keys.float(), values, self.mask_bias, self.scale)

    def select(self, rows: torch.Tensor) -> "EncoderOut":
        """Rows `rows` (LongTensor) of every field, e.g. to drop finished sentences."""
        return EncoderOut(*(t.index_select(0, rows) for t in
                            (self.keys, self.values, self.mask_bias, self.scale)))


class Embedded(nn.Module):
    """§3.1, the same on both sides: token embedding plus position embedding, then dropout.
    The encoder and the decoder extend it, so their tables keep the reference's names
    (`embed_tokens`, `embed_positions`) and one change here reaches both sides. Without
    `positions` (Table 4's ablation) there is no position table: tokens alone."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, positions: bool = True):
        super().__init__()
        self.dropout, self.max_positions = cfg.dropout, cfg.max_positions
        self.embed_tokens = embedding(vocab_size, cfg.embed_dim)
        # Positions count from PAD + 1 (`make_positions`); row PAD stays zero.
        self.embed_positions = embedding(cfg.max_positions + PAD + 1, cfg.embed_dim) \
            if positions else None

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """N x T tokens and their positions -> N x T x E."""
        e = self.embed_tokens(tokens)
        if self.embed_positions is not None:
            e = e + self.embed_positions(positions)
        return dropout(e, self.dropout, self.training)


class Encoder(Embedded):
    def __init__(self, cfg: ModelConfig, vocab_size: int, num_attention_layers: int):
        super().__init__(cfg, vocab_size, cfg.src_positions)
        E, p = cfg.embed_dim, cfg.dropout
        c0 = cfg.encoder_layers[0][0]
        self.fc1 = linear(E, c0, dropout=p)  # dropout precedes fc1
        widths = [c0] + [c for c, _ in cfg.encoder_layers]
        self.blocks = nn.ModuleList(
            Block(c_in, c_out, k, causal=False, dropout=p)
            for c_in, (c_out, k) in zip(widths[:-1], cfg.encoder_layers)
        )
        self.fc2 = linear(widths[-1], E)
        # §3.4: the encoder receives one gradient per attention layer; divide by 2 * their number.
        self.grad_scale = 1.0 / (2.0 * num_attention_layers)

    def forward(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> EncoderOut:
        _check_length(src_tokens, self.max_positions, "src_tokens")
        pad = src_tokens.eq(PAD).unsqueeze(-1)  # B x S x 1
        keep = (~pad).to(torch.float32)  # 1 for tokens, 0 for padding
        e = self.embed(src_tokens, make_positions(src_tokens))  # B x S x E (§3.1)
        x = self.fc1(e)  # B x S x C0
        for block in self.blocks:
            # Pad frames are zero conv inputs so that left or right padding changes nothing
            # (a broadcast multiply: much faster on CPU than masked_fill with a broadcast mask;
            # folded into the dropout mask when training).
            x, _ = block(x, keep=keep)  # B x S x C
        z = self.fc2(x)
        z = z * keep.to(z.dtype)  # B x S x E, zero at padding
        if torch.is_grad_enabled():
            z = GradMultiply.apply(z, self.grad_scale)  # the embedding path e is not scaled
        values = (z + e) * SQRT_HALF  # §3.3: the conditional input sums outputs and embeddings
        # True (non-pad) source length; counted from the mask so it cannot disagree with it.
        s = (~pad).sum(dim=1, keepdim=True).to(torch.float32)  # B x 1 x 1
        mask_bias = torch.zeros(pad.shape[0], 1, pad.shape[1], device=z.device)
        mask_bias = mask_bias.masked_fill(pad.transpose(1, 2), float("-inf"))  # B x 1 x S
        return EncoderOut(keys=z, values=values, mask_bias=mask_bias, scale=s.sqrt())


# --- multi-step attention (§3.3) ---------------------------------------------------------------


class Attention(nn.Module):
    """Attention of one decoder layer: d = (W h + b + g) * sqrt(.5), a = softmax(d . z)."""

    def __init__(self, channels: int, embed_dim: int):
        super().__init__()
        self.in_proj = linear(channels, embed_dim)
        self.out_proj = linear(embed_dim, channels)
        self.fused = EAGER  # the element-wise work between the products (convs2s.model.fused)

    def forward(self, h: torch.Tensor, g: torch.Tensor, enc: EncoderOut,
                residual: torch.Tensor):
        """h N x T x C (the GLU output), g N x T x E (target embedding), the block's residual
        N x T x C -> the block's output ((W c + b + h) * sqrt(.5) + residual) * sqrt(.5)
        N x T x C and the attention N x T x S. N = B * K target rows for B sentences, the K
        rows of a sentence consecutive (K = 1 in training)."""
        N, T, _ = h.shape
        B, S, E = enc.keys.shape
        fused = self.fused
        d = fused.attention_query(self.in_proj(h), g)  # N x T x E float32: (W h + b + g) * √.5
        d = d.view(B, N // B * T, E)  # B x KT x E: one matmul per sentence, keys read once
        # Scores and softmax in float32 even under autocast (bf16 logits lose the ranking).
        with torch.autocast(device_type=d.device.type, enabled=False):
            scores = torch.bmm(d, enc.keys.float().transpose(1, 2))  # B x KT x S
            # padding gets weight 0; §3.4: the context is scaled by m * sqrt(1/m), m = the true
            # source length, applied to the weights before the product
            attn, weights = fused.attention_weights(scores, enc.mask_bias, enc.scale,
                                                    enc.values.dtype)
        c = torch.bmm(weights, enc.values)  # B x KT x E
        out = fused.attention_residual(self.out_proj(c.view(N, T, E)), h, residual)
        return out, attn.view(N, T, S)


# --- decoder (§3.2, §3.3) and incremental decoding state (§5.3) ---------------------------------


@dataclass
class DecoderState:
    """Everything one incremental decode step needs; rows are hypotheses (sentences x beams)."""

    enc: EncoderOut  # B sentences
    buffers: list  # per decoder block: N x (k-1) x C_in, the last k-1 conv inputs (None if k=1)
    step: int = 0  # number of target tokens consumed so far

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Row i continues hypothesis rows[i]; `sentences` (optional) selects the source rows
        that remain, so that the K rows of each remaining sentence stay consecutive."""
        self.buffers = [None if b is None else b.index_select(0, rows) for b in self.buffers]
        if sentences is not None:
            self.enc = self.enc.select(sentences)


class Decoder(Embedded):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__(cfg, vocab_size, cfg.tgt_positions)
        E, p = cfg.embed_dim, cfg.dropout
        c0 = cfg.decoder_layers[0][0]
        self.fc1 = linear(E, c0, dropout=p)
        widths = [c0] + [c for c, _ in cfg.decoder_layers]
        self.blocks = nn.ModuleList(
            Block(c_in, c_out, k, causal=True, dropout=p,
                  attention=Attention(c_out, E) if att else None)
            for c_in, (c_out, k), att in zip(widths[:-1], cfg.decoder_layers, cfg.attention_layers)
        )
        self.num_attention = sum(cfg.attention_layers)
        self.fc2 = linear(widths[-1], cfg.out_embed_dim)
        if cfg.share_decoder_embed:  # tied output embedding (plain Linear sharing the table)
            self.fc3 = nn.Linear(cfg.out_embed_dim, vocab_size)
            self.fc3.weight = self.embed_tokens.weight
            nn.init.zeros_(self.fc3.bias)
        else:
            self.fc3 = linear(cfg.out_embed_dim, vocab_size, dropout=p)  # dropout precedes fc3

    def _output(self, x: torch.Tensor, out: torch.Tensor | None = None,
                rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """N x T x C_last -> N x T x V; or, with `out` (N x V, T = 1), logits written there.
        `rows` (weight C x E, bias C): a shortlist's rows of fc3 (vocabulary selection),
        giving N x T x C (or N x C in `out`)."""
        x = dropout(self.fc2(x), self.dropout, self.training)
        if rows is None and out is None:
            return self.fc3(x)
        if callable(rows):  # an int8 copy's shortlist layer (convs2s.inference.quantize.Int8Linear)
            y = rows(x)
            return y if out is None else out.copy_(y.view(out.shape))
        weight, bias = rows if rows is not None else (self.fc3.weight, self.fc3.bias)
        if out is None:
            return F.linear(x, weight, bias)
        return torch.addmm(bias, x.view(out.shape[0], -1), weight.t(), out=out)

    def _output_loss(self, x: torch.Tensor, target: torch.Tensor, label_smoothing: float,
                     target_rows: torch.Tensor | None = None):
        """N x T x C_last, target N x T -> (loss sum, nll sum): the output layer fused with the
        loss, no N x T x V logits (`convs2s.model.loss.output_layer_loss`)."""
        x = dropout(self.fc2(x), self.dropout, self.training)
        return output_layer_loss(x, self.fc3.weight, self.fc3.bias, target, label_smoothing,
                                 target_rows=target_rows)

    def _blocks(self, x: torch.Tensor, g: torch.Tensor, enc: EncoderOut, buffers=None,
                need_attn: bool = True):
        """x N x T x C0 -> N x T x C_last, attention summed over the layers N x T x S (None
        without `need_attn`: training and scoring never read it). With `buffers`
        (DecoderState.buffers, updated in place): one incremental step, T = 1."""
        attn_sum = None
        for i, block in enumerate(self.blocks):
            if buffers is None:
                x, attn = block(x, g=g, enc=enc)
            else:
                x, attn, buffers[i] = block.step(x, buffers[i], g, enc)
            if attn is not None and need_attn:
                attn_sum = attn if attn_sum is None else attn_sum + attn
        return x, attn_sum

    def forward(self, prev_output_tokens: torch.Tensor, enc: EncoderOut, last_only: bool = False,
                target: torch.Tensor | None = None, label_smoothing: float = 0.0,
                target_rows: torch.Tensor | None = None):
        """prev N x T -> logits N x T x V, attention N x T x S (T = 1 with `last_only`);
        with `target` N x T: (loss sum, nll sum) instead, see `ConvS2S.forward`."""
        _check_length(prev_output_tokens, self.max_positions, "prev_output_tokens")
        g = self.embed(prev_output_tokens, make_positions(prev_output_tokens))  # N x T x E
        x, attn_sum = self._blocks(self.fc1(g), g, enc.for_attention(),  # N x T x C_last
                                   need_attn=target is None)
        if target is not None:  # training and validation: no attention average needed
            return self._output_loss(x, target, label_smoothing, target_rows)
        attn = attn_sum / self.num_attention  # mean over attention layers
        if last_only:  # full-prefix decoding needs the output layer at the last position only
            x, attn = x[:, -1:], attn[:, -1:]
        return self._output(x), attn

    def init_state(self, enc: EncoderOut, beam_size: int = 1) -> DecoderState:
        """Empty history for `beam_size` rows per sentence: zero buffers, exactly the left
        padding of the causal convolutions."""
        # the activations' dtype (an int8 copy keeps float embeddings and activations)
        N, dtype = enc.keys.shape[0] * beam_size, self.embed_tokens.weight.dtype
        buffers = [b.conv.init_buffer(N, enc.keys.device, dtype) for b in self.blocks]
        # keys in float32 once per search, not in each attention layer at each step (bf16)
        return DecoderState(enc=enc.for_attention(), buffers=buffers, step=0)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState,
                    out: torch.Tensor | None = None,
                    rows: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Consume one token per row (N), return logits N x V and mean attention N x S; with
        `rows` (a shortlist's fc3 weight C x E and bias C), logits N x C over the shortlist.

        `forward` at position `state.step` (same embedding, blocks and output layer; the blocks
        step, `Block.step`), in O(1) of the prefix length. `out` (optional, N x V, the model's
        dtype, no autocast): a buffer to write the logits into, reused across steps by the
        search (a fresh N x V tensor per step costs page faults on CPU that take as long as the
        output matmul).
        """
        if state.step >= self.max_positions:
            raise ValueError(f"decode_step: step {state.step} is beyond max_positions "
                             f"{self.max_positions} of the position table")
        tokens = tokens.unsqueeze(1)  # N x 1
        g = self.embed(tokens, torch.full_like(tokens, PAD + 1 + state.step))  # N x 1 x E
        x, attn_sum = self._blocks(self.fc1(g), g, state.enc, state.buffers)  # N x 1 x C_last
        state.step += 1
        attn = attn_sum.squeeze(1) / self.num_attention  # N x S, mean over attention layers
        if out is not None:
            return self._output(x, out, rows), attn
        return self._output(x, rows=rows).squeeze(1), attn


# --- the full model ----------------------------------------------------------------------------


class ConvS2S(nn.Module):
    """Encoder-decoder ConvS2S (§3). See the module docstring for the call signatures."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.max_positions = cfg.max_positions
        num_att = sum(cfg.attention_layers)
        if num_att == 0:
            raise ValueError("ConvS2S needs at least one decoder attention layer")
        self.encoder = Encoder(cfg, src_vocab_size, num_att)
        self.decoder = Decoder(cfg, tgt_vocab_size)

    def forward(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor,
                prev_output_tokens: torch.Tensor, target: torch.Tensor | None = None,
                label_smoothing: float = 0.0, target_rows: torch.Tensor | None = None):
        """src B x S, lengths B, prev B x T -> logits B x T x V, attention B x T x S.

        With `target` (B x T, PAD where there is no token): (loss sum, nll sum) over the
        non-pad targets, float32 scalars, equal to `sequence_loss(logits, target,
        label_smoothing)` but with the output layer fused into the loss (no B x T x V logits).
        Training goes through here rather than a separate method so that DDP sees one forward.
        `target_rows`: the flat indices of target's non-pad tokens, made by the collate on the
        host (`Batch.target_rows`), so that finding them is no device-to-host wait in the step.
        """
        enc = self.encoder(src_tokens, src_lengths)
        return self.decoder(prev_output_tokens, enc, target=target,
                            label_smoothing=label_smoothing, target_rows=target_rows)

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> EncoderOut:
        return self.encoder(src_tokens, src_lengths)

    def decode(self, prev_output_tokens: torch.Tensor, enc: EncoderOut, last_only: bool = False):
        """Full (non-incremental) decoder pass over a whole prefix: logits B x T x V, attn."""
        return self.decoder(prev_output_tokens, enc, last_only)

    def init_state(self, enc: EncoderOut, beam_size: int = 1) -> DecoderState:
        return self.decoder.init_state(enc, beam_size)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState,
                    out: torch.Tensor | None = None,
                    rows: tuple[torch.Tensor, torch.Tensor] | None = None):
        """One incremental step: tokens N -> logits N x V (in `out` if given), attention N x S;
        over a shortlist's fc3 `rows` (weight C x E, bias C): N x C."""
        return self.decoder.decode_step(tokens, state, out, rows)

    def output_rows(self, ids: torch.Tensor):
        """fc3's weight and bias rows of the target ids `ids` (C): vocabulary selection's
        output layer for one batch. An int8 copy (`convs2s.inference.quantize`) gets those rows as
        an int8 layer of their own (`fc3.select`), packed once per batch."""
        fc3 = self.decoder.fc3
        if hasattr(fc3, "select"):
            return fc3.select(ids)
        return fc3.weight.index_select(0, ids), fc3.bias.index_select(0, ids)


def inference_copy(model: ConvS2S) -> ConvS2S:
    """An eval-mode copy with weight norm folded once into plain weights (the reference does the
    same for generation), so that a decode step multiplies weights instead of renormalizing.

    Built fresh (on the meta device, then filled) rather than deep-copied: parametrized modules
    of a deep copy share their generated class, and unfolding one would break the original.
    """
    ref = next(model.parameters())
    with torch.device("meta"):
        net = ConvS2S(model.cfg, model.src_vocab_size, model.tgt_vocab_size)
    for m in net.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    net = net.to_empty(device=ref.device).to(ref.dtype)
    if net.cfg.share_decoder_embed:  # to_empty unties shared tables; tie them again
        net.decoder.fc3.weight = net.decoder.embed_tokens.weight
    old = dict(model.named_modules())
    with torch.no_grad():
        for name, m in net.named_modules():
            for attr in ("weight", "bias"):
                t = getattr(m, attr, None)
                if name and isinstance(t, torch.Tensor):
                    t.copy_(getattr(old[name], attr))  # parametrized: the folded g * v / ||v||
    net.eval().requires_grad_(False)
    return net
