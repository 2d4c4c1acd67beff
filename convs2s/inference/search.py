"""Greedy and beam search for ConvS2S models and ensembles (paper §4.3; docs/reference.md,
Evaluation).

    from convs2s.inference.search import generate
    hyps = generate([model], src_tokens, src_lengths, beam_size=5, max_len_a=1.2, max_len_b=10)
    best = hyps[0][0]  # sentence 0, best hypothesis: dict with
    # tokens (LongTensor L, ends in EOS), score (float, sum log p / L^lenpen),
    # positional_scores (FloatTensor L), attention (FloatTensor S_i x L over the sentence's
    # non-pad source positions, mean of the attention layers and of the ensemble's models;
    # None with attention=False)

All sentences of a batch are searched together: one decoder step per model covers every
hypothesis of every unfinished sentence (rows = sentences x beams); sentences that finish leave
the batch. Lengths count output tokens before the final EOS: each sentence emits at least
`min_len` and at most min(a * |x| + b, max_positions - 1) of them, so `max_len_a=0,
max_len_b=N, min_len=N` gives exactly N tokens + EOS (fixed work, for benchmarks); a sentence
whose max length is below `min_len` ends at its max length (min_len clamped to it), scored as
the model scores its EOS there.
An ensemble averages the models' probabilities: log p = log(mean_m p_m).
`attention=False` keeps no attention (the hypotheses' `attention` is None): the search's
decisions are the same, without the batch x beam x steps x source floats it otherwise holds
(and copies at every step for the live hypotheses).
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

    def __init__(self, model, enc, beam_size: int, incremental: bool,
                 vocab: torch.Tensor | None = None):
        self.model, self.incremental = model, incremental
        self.enc = enc  # one row per sentence, shared by its beam_size hypothesis rows
        self.state = model.init_state(enc, beam_size) if incremental else None
        # Vocabulary selection: fc3's rows of the batch's shortlist, cut once per batch.
        self.vocab = vocab
        self.rows = model.output_rows(vocab) if vocab is not None and incremental else None
        # Logits and log-prob buffers reused by every step (rows only shrink): on CPU a fresh
        # N x V tensor per step costs page faults that take as long as the output matmul.
        N = enc.keys.shape[0] * beam_size
        V = model.tgt_vocab_size if vocab is None else vocab.numel()
        dev = enc.keys.device
        # (float32 weights only: the buffer is written by fc3's own addmm)
        reuse = (incremental and getattr(model, "precision", "fp32") == "fp32"
                 and next(model.parameters()).dtype == torch.float32
                 and not torch.is_autocast_enabled(dev.type))
        self.buffers = (torch.empty(N, V, device=dev), torch.empty(N, V, device=dev)) \
            if reuse else None

    def step(self, prefix: torch.Tensor):  # prefix N x (t+1) -> log-probs N x V, attn N x S
        N = prefix.shape[0]
        if self.buffers is not None:
            logits, lprobs = (b[:N] for b in self.buffers)
            logits, attn = self.model.decode_step(prefix[:, -1], self.state, out=logits,
                                                  rows=self.rows)
            return torch.log_softmax(logits, dim=-1, out=lprobs), attn.float()
        if self.incremental:
            logits, attn = self.model.decode_step(prefix[:, -1], self.state, rows=self.rows)
        else:  # the baseline: recompute the decoder over the whole prefix
            logits, attn = self.model.decode(prefix, self.enc, last_only=True)
            logits, attn = logits[:, -1], attn[:, -1]
            if self.vocab is not None:
                logits = logits.index_select(1, self.vocab)
        # (log-softmax over the shortlist: its tokens share the probability mass)
        return F.log_softmax(logits.float(), dim=-1), attn.float()

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
    """Log of the mean of the models' probabilities (float32): N x V; mean attention N x S.

    The log-probs may live in a stepper's reused buffer: valid until the next step."""
    lprobs, attns = [], []
    for s in steppers:
        lp, attn = s.step(prefix)
        lprobs.append(lp)
        attns.append(attn)
    if len(steppers) == 1:
        return lprobs[0], attns[0]
    lp = torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(steppers))
    return lp, torch.stack(attns).mean(0)


def _check_sources(src_tokens: torch.Tensor) -> None:
    """A source row with no token (all padding, or none at all) has nothing to attend to: its
    attention softmax is NaN. (`Translator` gives every sentence at least its EOS.)"""
    empty = src_tokens.ne(PAD).sum(dim=1).eq(0) if src_tokens.shape[1] else \
        torch.ones(src_tokens.shape[0], dtype=torch.bool)
    if bool(empty.any()):
        rows = empty.nonzero(as_tuple=True)[0].tolist()
        raise ValueError(f"source rows {rows[:10]} hold no token (only padding): every source "
                         "needs at least its EOS (give sentences through Translator, or end "
                         "each row with EOS)")


def _constrain(lprobs, step: int, min_len: int, max_lens, unk_penalty: float):
    """Forbid PAD/BOS, penalize UNK, forbid EOS before min_len, force EOS at a row's max length.

    lprobs N x V (modified in place); max_lens N: the step at which each row must emit EOS, or
    None when the caller knows no row has reached its max length (no host sync then: finding
    the rows is a `nonzero`, which on a GPU waits for the device).
    """
    lprobs[:, PAD] = -math.inf
    lprobs[:, BOS] = -math.inf
    lprobs[:, UNK] -= unk_penalty
    if max_lens is None:
        if step < min_len:
            lprobs[:, EOS] = -math.inf
        return lprobs
    force = (max_lens <= step).nonzero(as_tuple=True)[0]  # rows that must end now
    # (read before min_len's ban: a row whose max length is below min_len ends there with the
    # model's own EOS score, not one cut at -1e4; finite even where the model gives -inf)
    eos = lprobs[force, EOS].clamp(min=-1e4) if force.numel() else None
    if step < min_len:
        lprobs[:, EOS] = -math.inf
    if force.numel():
        lprobs[force] = -math.inf
        lprobs[force, EOS] = eos
    return lprobs


def _best_candidates(lprobs: torch.Tensor, scores: torch.Tensor, K: int, k: int,
                     block: int = 64):
    """The k best of scores[r] + lprobs[r, v] over the K rows x V tokens of each sentence.

    lprobs N x V (N = A * K), scores N -> values A x k (best first) and indices into K * V.
    Equal to `(lprobs + scores[:, None]).view(A, -1).topk(k)` but faster on CPU: the k best lie
    in the k blocks of `block` tokens with the largest maxima, so one vectorized max per block
    and two small topk calls replace a topk over K * V, and the sum is never materialized.
    """
    N, V = lprobs.shape
    A, nb = N // K, V // block
    if K * nb < 4 * k:  # few blocks: nothing to gain
        return (lprobs + scores[:, None]).view(A, K * V).topk(k, dim=1)
    block_max = lprobs[:, : nb * block].view(N, nb, block).amax(dim=2) + scores[:, None]
    best = block_max.view(A, K * nb).topk(k, dim=1).indices  # A x k (beam, block) pairs
    # (repeats by expand: an int repeat_interleave may count its output on the host)
    beams = (best // nb)[:, :, None].expand(A, k, block).reshape(A, k * block)  # A x k*block
    cols = ((best % nb)[:, :, None] * block + torch.arange(block, device=lprobs.device))
    cols = cols.view(A, -1)
    if nb * block < V:  # the tokens after the last full block are always candidates
        tail = torch.arange(nb * block, V, device=lprobs.device)
        beams = torch.cat([beams, torch.arange(K, device=lprobs.device)[:, None]
                           .expand(K, tail.numel()).reshape(1, -1).expand(A, -1)], dim=1)
        cols = torch.cat([cols, tail.repeat(K).expand(A, -1)], dim=1)
    rows = beams + (torch.arange(A, device=lprobs.device) * K)[:, None]  # A x C
    values = lprobs.view(-1)[rows * V + cols] + scores[rows]
    values, j = values.topk(k, dim=1)
    return values, (beams * V + cols).gather(1, j)


def _max_lens(models, src_lengths, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """Per sentence the most output pieces: min(a * |x| + b, max_positions - 1). (One below
    `min_len` ends there: `_constrain`. A setting that leaves every sentence below it is
    refused where it is made, `SearchConfig`.)"""
    limit = min(m.max_positions for m in models) - 1  # target positions the tables cover
    return (src_lengths.double() * max_len_a + max_len_b).long().clamp(min=0, max=limit)  # B


def _step_bounds(max_lens: torch.Tensor) -> tuple[int, int]:
    """(the first step at which a sentence may have to end, the most steps any takes: its
    tokens + EOS), read once per search: before the first, a step forces no EOS and needs no
    host sync to find rows that must end."""
    lo, hi = max_lens.aminmax()
    lo, hi = torch.stack([lo, hi]).tolist()
    return lo, hi + 1


def _encode(models, src_tokens, src_lengths, beam_size, incremental, vocab=None):
    if vocab is not None:
        vocab = vocab.to(src_tokens.device)
        if vocab[:4].tolist() != [0, 1, 2, 3]:  # the specials at their own positions
            raise ValueError("vocab (a shortlist) must be sorted target ids that start with the "
                             "special tokens 0-3 (convs2s.inference.shortlist.Shortlist.for_batch)")
    return [_Stepper(m, m.encode(src_tokens, src_lengths), beam_size, incremental, vocab)
            for m in models]


def _as_list(models):
    return list(models) if isinstance(models, (list, tuple)) else [models]


class _Finished:
    """K slots per sentence for ended hypotheses, filled with tensor ops (no sentence loop).
    S=None: no attention kept."""

    def __init__(self, B: int, K: int, T: int, S: int | None, dev):
        self.K = K
        self.tokens = torch.full((B, K, T), PAD, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, K, T, device=dev)  # per-token log-probs
        self.attn = None if S is None else torch.zeros(B, K, T, S, device=dev)
        self.len = torch.zeros(B, K, dtype=torch.long, device=dev)  # 0: an empty slot
        self.score = torch.full((B, K), -math.inf, device=dev)
        self.count = torch.zeros(B, dtype=torch.long, device=dev)

    def add(self, ends, beams: "_Beams", cand_rows, cand_scores, attn, step: int,
            lenpen: float) -> int:
        """ends A x K: EOS among the K best candidates (rank order) ends those hypotheses; a
        sentence keeps its first K ended ones (the reference's rule), later ones are dropped.
        Returns how many were kept: the search's one host sync of a step (on a GPU the host
        waits for the device to find them; every other decision of the step is a tensor op)."""
        slot = self.count[beams.sent][:, None] + ends.cumsum(1) - 1  # A x K: each end's slot
        a_idx, c_idx = (ends & (slot < self.K)).nonzero(as_tuple=True)  # sentence-major, rank
        if a_idx.numel() == 0:
            return 0
        slot = slot[a_idx, c_idx]
        rows, b = cand_rows[a_idx, c_idx], beams.sent[a_idx]
        total = cand_scores[a_idx, c_idx]  # cumulative log-prob, EOS included
        self.tokens[b, slot, :step] = beams.tokens[rows, 1:]
        self.tokens[b, slot, step] = EOS
        self.pos[b, slot, :step] = beams.pos[rows]
        self.pos[b, slot, step] = total - beams.scores[rows]
        if self.attn is not None:
            self.attn[b, slot, :step] = beams.attn[rows]
            self.attn[b, slot, step] = attn[rows]
        self.len[b, slot] = step + 1  # |y| counts the EOS
        self.score[b, slot] = total / (step + 1) ** lenpen
        self.count.index_add_(0, b, torch.ones_like(b))
        return a_idx.numel()

    def collect(self, src_tokens: torch.Tensor, nbest: int) -> list[list[dict]]:
        """Per sentence: its hypotheses sorted by score, `nbest` of them, on the CPU."""
        order = self.score.argsort(dim=1, descending=True, stable=True).cpu()
        tokens, pos = self.tokens.cpu(), self.pos.cpu()
        attn = None if self.attn is None else self.attn.cpu()
        length, score = self.len.cpu(), self.score.cpu()
        src_real = src_tokens.ne(PAD).cpu()
        out = []
        for b in range(tokens.shape[0]):
            hyps = []
            for k in order[b, :nbest].tolist():
                n = int(length[b, k])
                if n == 0:  # an unused slot (fewer than nbest hypotheses could end)
                    continue
                hyps.append({
                    "tokens": tokens[b, k, :n].clone(),
                    "score": float(score[b, k]),
                    "positional_scores": pos[b, k, :n].clone(),
                    "attention": None if attn is None else
                    attn[b, k, :n][:, src_real[b]].t().contiguous(),  # S_i x L
                })
            out.append(hyps)
        return out


class _Beams:
    """The live hypotheses: rows = active sentences x K, the K rows of a sentence consecutive.
    S=None: no attention kept."""

    def __init__(self, B: int, K: int, S: int | None, dev):
        self.sent = torch.arange(B, device=dev)  # A active sentences -> original index
        self.tokens = torch.full((B * K, 1), EOS, dtype=torch.long, device=dev)  # EOS as BOS
        self.pos = torch.zeros(B * K, 0, device=dev)  # per-token log-probs so far
        self.attn = None if S is None else torch.zeros(B * K, 0, S, device=dev)
        # Only beam 0 is live at the start (all K beams are the same empty hypothesis).
        scores = torch.full((B, K), -math.inf, device=dev)
        scores[:, 0] = 0.0
        self.scores = scores.view(-1)  # A*K cumulative log-probs

    def advance(self, rows, tok, scores, attn, keep) -> None:
        """Row i continues old row rows[i] with token tok[i]; `keep`: sentences that stay."""
        if keep is not None:
            self.sent = self.sent[keep]
        self.tokens = torch.cat([self.tokens[rows], tok[:, None]], 1)
        self.pos = torch.cat([self.pos[rows], (scores - self.scores[rows])[:, None]], 1)
        if self.attn is not None:
            self.attn = torch.cat([self.attn[rows], attn[rows, None]], 1)
        self.scores = scores


def generate(models, src_tokens: torch.Tensor, src_lengths: torch.Tensor, beam_size: int = 5,
             max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1,
             lenpen: float = 1.0, unk_penalty: float = 0.0, nbest: int = 1,
             incremental: bool = True, vocab: torch.Tensor | None = None,
             attention: bool = True) -> list[list[dict]]:
    """Beam search over a batch: src_tokens B x S (PAD 1), src_lengths B -> per sentence the
    `nbest` best hypotheses, best first (see the module docstring for their fields).
    `vocab` (sorted target ids, the specials first): vocabulary selection, every step scores
    only these tokens (`convs2s.inference.shortlist`). `attention=False`: none kept (each
    hypothesis's `attention` is None; the same hypotheses otherwise).

    A hypothesis ends when EOS is among the K best of the 2K candidates of its sentence (the
    reference's rule); a sentence ends when K hypotheses have ended. Scores are normalized by
    length: sum log p / |y|^lenpen, |y| counting the EOS. Weight norm is computed once per
    call (pass `convs2s.model.network.inference_copy(model)` to skip even that).
    """
    models = _as_list(models)
    K = beam_size
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be in [1, beam_size={K}], got {nbest}")
    B, S = src_tokens.shape
    dev = src_tokens.device
    if B == 0:
        return []
    _check_sources(src_tokens)
    with _inference(models):
        max_lens = _max_lens(models, src_lengths, max_len_a, max_len_b).to(dev)  # B
        first_end, T = _step_bounds(max_lens)
        steppers = _encode(models, src_tokens, src_lengths, K, incremental, vocab)
        vocab = steppers[0].vocab
        kept = S if attention else None  # source positions of the attention kept, or none
        finished, beams = _Finished(B, K, T, kept, dev), _Beams(B, K, kept, dev)
        beam_offsets = torch.arange(K, device=dev)
        for step in range(T):
            A = beams.sent.numel()
            lprobs, attn = _ensemble_step(steppers, beams.tokens)  # A*K x V, A*K x S
            V = lprobs.shape[1]
            lprobs = _constrain(lprobs, step, min_len, None if step < first_end else
                                max_lens[beams.sent][:, None].expand(A, K).reshape(-1),
                                unk_penalty)
            # A x 2K best continuations (cumulative scores, best first), indices into K * V
            cand_scores, cand_idx = _best_candidates(lprobs, beams.scores, K, min(2 * K, K * V))
            cand_tok = cand_idx % V  # a column: the token itself, or its shortlist position
            if vocab is not None:
                cand_tok = vocab[cand_tok]  # (the specials keep their ids: EOS stays EOS)
            cand_rows = cand_idx // V + (torch.arange(A, device=dev) * K)[:, None]  # A x 2K
            is_eos = cand_tok.eq(EOS) & torch.isfinite(cand_scores)

            # 1) EOS among the K best candidates ends that hypothesis.
            ended = finished.add(is_eos[:, :K], beams, cand_rows, cand_scores, attn, step,
                                 lenpen)
            # 2) The K best non-EOS candidates continue (a stable sort keeps the rank order).
            order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :K]
            rows = cand_rows.gather(1, order).view(-1)  # A*K
            tok = cand_tok.gather(1, order).view(-1)
            scores = cand_scores.gather(1, order).view(-1)
            # 3) Sentences with K ended hypotheses leave the batch (only a step that ended a
            # hypothesis can end a sentence: every live sentence has fewer than K).
            keep = None  # active sentences that stay (None: all of them)
            if ended:
                keep = (finished.count[beams.sent] < K).nonzero(as_tuple=True)[0]
                if keep.numel() == 0:
                    break
                if keep.numel() == A:
                    keep = None
                else:
                    keep_rows = (keep[:, None] * K + beam_offsets).view(-1)
                    rows, tok, scores = rows[keep_rows], tok[keep_rows], scores[keep_rows]
            for s in steppers:
                s.reorder(rows, keep)
            beams.advance(rows, tok, scores, attn, keep)
        return finished.collect(src_tokens, nbest)


def greedy(models, src_tokens: torch.Tensor, src_lengths: torch.Tensor, max_len_a: float = 0.0,
           max_len_b: int = 200, min_len: int = 1, lenpen: float = 1.0,
           unk_penalty: float = 0.0, incremental: bool = True,
           vocab: torch.Tensor | None = None, attention: bool = True) -> list[list[dict]]:
    """Greedy decoding (argmax each step), in the same output format as `generate` (1-best);
    `vocab` and `attention`: as in `generate`."""
    models = _as_list(models)
    B, S = src_tokens.shape
    dev = src_tokens.device
    if B == 0:
        return []
    _check_sources(src_tokens)
    with _inference(models):
        max_lens = _max_lens(models, src_lengths, max_len_a, max_len_b).to(dev)
        first_end, T = _step_bounds(max_lens)
        steppers = _encode(models, src_tokens, src_lengths, 1, incremental, vocab)
        vocab = steppers[0].vocab
        out = _Finished(B, 1, T, S if attention else None, dev)
        active = torch.arange(B, device=dev)  # sentences still decoding (rows of the steppers)
        prefix = torch.full((B, 1), EOS, dtype=torch.long, device=dev)  # EOS as BOS
        length = torch.full((B,), T, dtype=torch.long, device=dev)  # tokens incl. EOS
        for step in range(T):
            lprobs, attn = _ensemble_step(steppers, prefix)
            lp, tok = _constrain(lprobs, step, min_len,
                                 None if step < first_end else max_lens[active],
                                 unk_penalty).max(dim=1)
            if vocab is not None:
                tok = vocab[tok]
            out.tokens[active, 0, step] = tok
            out.pos[active, 0, step] = lp
            if out.attn is not None:
                out.attn[active, 0, step] = attn
            ended = tok.eq(EOS)  # (a row's max length forces EOS: every row ends by T - 1)
            keep = (~ended).nonzero(as_tuple=True)[0]  # the step's one host sync
            if keep.numel() < active.numel():
                length[active] = torch.where(ended, step + 1, length[active])
                if keep.numel() == 0:
                    break
                # Sentences that ended leave the batch: the next steps compute only the others.
                for s in steppers:
                    s.reorder(keep, keep)
                active, prefix, tok = active[keep], prefix[keep], tok[keep]
            prefix = torch.cat([prefix, tok[:, None]], 1)
        out.len[:, 0] = length
        out.score[:, 0] = out.pos[:, 0].sum(1) / length.double().pow(lenpen).float()
        return out.collect(src_tokens, 1)
