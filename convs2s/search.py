"""Greedy and beam search for ConvS2S models and ensembles (paper §5, reference-facts §6).

    from convs2s.search import generate
    hyps = generate([model], src_tokens, src_lengths, beam_size=5, max_len_a=1.2, max_len_b=10)
    best = hyps[0][0]  # sentence 0, best hypothesis: dict with
    # tokens (LongTensor L, ends in EOS), score (float, sum log p / L^lenpen),
    # positional_scores (FloatTensor L), attention (FloatTensor S_i x L over the sentence's
    # non-pad source positions, mean of the attention layers and of the ensemble's models)

All sentences of a batch are searched together: one decoder step per model covers every
hypothesis of every unfinished sentence (rows = sentences x beams); sentences that finish leave
the batch. Lengths count output tokens before the final EOS: each sentence emits at least
`min_len` and at most min(a * |x| + b, max_positions - 1) of them, so `max_len_a=0,
max_len_b=N, min_len=N` gives exactly N tokens + EOS (fixed work, for benchmarks).
An ensemble averages the models' probabilities: log p = log(mean_m p_m).
`incremental=False` recomputes the whole prefix each step (the quadratic baseline).
Imports only torch.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from convs2s.config import BOS, EOS, PAD, UNK


class _Stepper:
    """One model's decoding: incremental (DecoderState) or full-prefix recomputation."""

    def __init__(self, model, enc, beam_size: int, incremental: bool):
        self.model, self.incremental = model, incremental
        self.enc = enc  # one row per sentence, shared by its beam_size hypothesis rows
        self.state = model.init_state(enc, beam_size) if incremental else None

    def step(self, prefix: torch.Tensor):  # prefix N x (t+1) -> logits N x V, attn N x S
        if self.incremental:
            return self.model.decode_step(prefix[:, -1], self.state)
        logits, attn = self.model.decode(prefix, self.enc, last_only=True)  # recompute prefix
        return logits[:, -1], attn[:, -1]

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        if self.incremental:
            self.state.reorder(rows, sentences)
        elif sentences is not None:
            self.enc = self.enc.select(sentences)


@contextmanager
def _inference(models):
    """Eval mode, no autograd, and weight norm computed once per call (not once per step)."""
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        with torch.inference_mode(), parametrize.cached():
            yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


def _ensemble_step(steppers, prefix):
    """Log of the mean of the models' probabilities (float32): N x V; mean attention N x S."""
    lprobs, attns = [], []
    for s in steppers:
        logits, attn = s.step(prefix)
        lprobs.append(F.log_softmax(logits.float(), dim=-1))
        attns.append(attn.float())
    if len(steppers) == 1:
        return lprobs[0], attns[0]
    lp = torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(steppers))
    return lp, torch.stack(attns).mean(0)


def _constrain(lprobs, step: int, min_len: int, max_lens, unk_penalty: float):
    """Forbid PAD/BOS, penalize UNK, forbid EOS before min_len, force EOS at a row's max length.

    lprobs N x V (modified in place); max_lens N: the step at which each row must emit EOS.
    """
    lprobs[:, PAD] = -math.inf
    lprobs[:, BOS] = -math.inf
    lprobs[:, UNK] -= unk_penalty
    if step < min_len:
        lprobs[:, EOS] = -math.inf
    force = max_lens <= step  # N
    if bool(force.any()):
        eos = lprobs[:, EOS].clone()
        lprobs.masked_fill_(force[:, None], -math.inf)
        lprobs[:, EOS] = torch.where(force, eos.clamp(min=-1e4), eos)  # EOS stays finite
    return lprobs


def _max_lens(models, src_lengths, max_len_a: float, max_len_b: int) -> torch.Tensor:
    limit = min(m.max_positions for m in models) - 1  # target positions the tables cover
    lens = (src_lengths.double() * max_len_a + max_len_b).long()
    return lens.clamp(min=0, max=limit)  # B


def _encode(models, src_tokens, src_lengths, beam_size, incremental):
    return [_Stepper(m, m.encode(src_tokens, src_lengths), beam_size, incremental)
            for m in models]


def _as_list(models):
    return list(models) if isinstance(models, (list, tuple)) else [models]


def generate(models, src_tokens: torch.Tensor, src_lengths: torch.Tensor, beam_size: int = 5,
             max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1,
             lenpen: float = 1.0, unk_penalty: float = 0.0, nbest: int = 1,
             incremental: bool = True) -> list[list[dict]]:
    """Beam search over a batch: src_tokens B x S (PAD 1), src_lengths B -> per sentence the
    `nbest` best hypotheses, best first (see the module docstring for their fields).

    A hypothesis ends when EOS is among the K best of the 2K candidates of its sentence (the
    reference's rule); a sentence ends when K hypotheses have ended. Scores are normalized by
    length: sum log p / |y|^lenpen, |y| counting the EOS.
    """
    models = _as_list(models)
    K = beam_size
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be in [1, beam_size={K}], got {nbest}")
    B, S = src_tokens.shape
    dev = src_tokens.device
    with _inference(models):
        max_lens = _max_lens(models, src_lengths, max_len_a, max_len_b).to(dev)  # B
        T = int(max_lens.max()) + 1  # most steps any sentence takes (tokens + EOS)
        steppers = _encode(models, src_tokens, src_lengths, K, incremental)
        # Finished hypotheses, K slots per sentence.
        fin_tokens = torch.full((B, K, T), PAD, dtype=torch.long, device=dev)
        fin_pos = torch.zeros(B, K, T, device=dev)
        fin_attn = torch.zeros(B, K, T, S, device=dev)
        fin_len = torch.zeros(B, K, dtype=torch.long, device=dev)
        fin_score = torch.full((B, K), -math.inf, device=dev)
        fin_count = torch.zeros(B, dtype=torch.long, device=dev)

        sent = torch.arange(B, device=dev)  # A active sentences -> original index
        tokens = torch.full((B * K, 1), EOS, dtype=torch.long, device=dev)  # EOS acts as BOS
        pos_hist = torch.zeros(B * K, 0, device=dev)  # per-token log-probs so far
        attn_hist = torch.zeros(B * K, 0, S, device=dev)
        # Only beam 0 is live at the start (all K beams are the same empty hypothesis).
        scores = torch.full((B, K), -math.inf, device=dev)
        scores[:, 0] = 0.0
        scores = scores.view(-1)  # A*K cumulative log-probs
        beam_offsets = torch.arange(K, device=dev)
        for step in range(T):
            A = sent.numel()
            lprobs, attn = _ensemble_step(steppers, tokens)  # A*K x V, A*K x S
            V = lprobs.shape[1]
            lprobs = _constrain(lprobs, step, min_len,
                                max_lens[sent].repeat_interleave(K), unk_penalty)
            cand = lprobs.add_(scores[:, None]).view(A, K * V)  # in place: N x V is the big one
            cand_scores, cand_idx = cand.topk(min(2 * K, K * V), dim=1)  # A x 2K, best first
            cand_beam = cand_idx // V  # beam within the sentence
            cand_tok = cand_idx % V
            cand_rows = cand_beam + (torch.arange(A, device=dev) * K)[:, None]  # A x 2K
            is_eos = cand_tok.eq(EOS) & torch.isfinite(cand_scores)

            # 1) EOS among the K best candidates finishes that hypothesis (up to K per sentence).
            eos_top = is_eos[:, :K]
            if bool(eos_top.any()):
                a_idx, c_idx = eos_top.nonzero(as_tuple=True)  # sentence-major, rank order
                slot = fin_count[sent][a_idx] + eos_top.cumsum(1)[a_idx, c_idx] - 1
                ok = slot < K
                a_idx, c_idx, slot = a_idx[ok], c_idx[ok], slot[ok]
                rows, b = cand_rows[a_idx, c_idx], sent[a_idx]
                total = cand_scores[a_idx, c_idx]
                n = step + 1  # tokens including EOS
                fin_tokens[b, slot, :step] = tokens[rows, 1:]
                fin_tokens[b, slot, step] = EOS
                fin_pos[b, slot, :step] = pos_hist[rows]
                fin_pos[b, slot, step] = total - scores[rows]
                fin_attn[b, slot, :step] = attn_hist[rows]
                fin_attn[b, slot, step] = attn[rows]
                fin_len[b, slot] = n
                fin_score[b, slot] = total / n ** lenpen
                fin_count.index_add_(0, b, torch.ones_like(b))

            # 2) The K best non-EOS candidates continue (stable sort keeps the rank order).
            order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :K]
            new_rows = cand_rows.gather(1, order).view(-1)  # A*K
            new_tok = cand_tok.gather(1, order).view(-1)
            new_scores = cand_scores.gather(1, order).view(-1)
            step_lp = new_scores - scores[new_rows]

            # 3) Sentences with K finished hypotheses leave the batch.
            done = fin_count[sent] >= K
            if bool(done.all()):
                break
            keep = None  # active sentences that stay (None: all of them)
            if bool(done.any()):
                keep = (~done).nonzero(as_tuple=True)[0]
                keep_rows = (keep[:, None] * K + beam_offsets).view(-1)
                new_rows, new_tok = new_rows[keep_rows], new_tok[keep_rows]
                new_scores, step_lp = new_scores[keep_rows], step_lp[keep_rows]
                sent = sent[keep]
            for s in steppers:
                s.reorder(new_rows, keep)
            tokens = torch.cat([tokens[new_rows], new_tok[:, None]], 1)
            pos_hist = torch.cat([pos_hist[new_rows], step_lp[:, None]], 1)
            attn_hist = torch.cat([attn_hist[new_rows], attn[new_rows, None]], 1)
            scores = new_scores
        return _collect(fin_tokens, fin_pos, fin_attn, fin_len, fin_score, src_tokens, nbest)


def _collect(fin_tokens, fin_pos, fin_attn, fin_len, fin_score, src_tokens, nbest):
    """Per sentence: its finished hypotheses sorted by score, `nbest` of them, on the CPU."""
    order = fin_score.argsort(dim=1, descending=True, stable=True)
    fin = [t.cpu() for t in (fin_tokens, fin_pos, fin_attn, fin_len, fin_score, order)]
    fin_tokens, fin_pos, fin_attn, fin_len, fin_score, order = fin
    src_real = src_tokens.ne(PAD).cpu()
    out = []
    for b in range(fin_tokens.shape[0]):
        hyps = []
        for k in order[b, :nbest].tolist():
            n = int(fin_len[b, k])
            if n == 0:  # an unused slot (fewer than nbest hypotheses could finish)
                continue
            hyps.append({
                "tokens": fin_tokens[b, k, :n].clone(),
                "score": float(fin_score[b, k]),
                "positional_scores": fin_pos[b, k, :n].clone(),
                "attention": fin_attn[b, k, :n][:, src_real[b]].t().contiguous(),  # S_i x L
            })
        out.append(hyps)
    return out


def greedy(models, src_tokens: torch.Tensor, src_lengths: torch.Tensor, max_len_a: float = 0.0,
           max_len_b: int = 200, min_len: int = 1, lenpen: float = 1.0,
           unk_penalty: float = 0.0, incremental: bool = True) -> list[list[dict]]:
    """Greedy decoding (argmax each step), in the same output format as `generate` (1-best)."""
    models = _as_list(models)
    B, S = src_tokens.shape
    dev = src_tokens.device
    with _inference(models):
        max_lens = _max_lens(models, src_lengths, max_len_a, max_len_b).to(dev)
        T = int(max_lens.max()) + 1
        steppers = _encode(models, src_tokens, src_lengths, 1, incremental)
        tokens = torch.full((B, 1), EOS, dtype=torch.long, device=dev)
        lps, attns = [], []
        length = torch.full((B,), T, dtype=torch.long, device=dev)  # tokens incl. EOS
        for step in range(T):
            lprobs, attn = _ensemble_step(steppers, tokens)
            lprobs = _constrain(lprobs, step, min_len, max_lens, unk_penalty)
            lp, tok = lprobs.max(dim=1)
            tokens = torch.cat([tokens, tok[:, None]], 1)
            lps.append(lp)
            attns.append(attn)
            ended = tok.eq(EOS) & length.eq(T)
            length = torch.where(ended, step + 1, length)
            if bool(length.lt(T).all()):
                break
        pos, attn = torch.stack(lps, 1), torch.stack(attns, 1)  # B x T', B x T' x S
        n_steps = pos.shape[1]
        steps = torch.arange(n_steps, device=dev)
        pos = pos.masked_fill(steps[None] >= length[:, None], 0.0)
        score = pos.sum(1) / length.double().pow(lenpen).float()
        return _collect(tokens[:, 1:].unsqueeze(1), pos[:, None], attn[:, None],
                        length[:, None], score[:, None], src_tokens, 1)
