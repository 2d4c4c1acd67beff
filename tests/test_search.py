"""Tests of convs2s.inference.search (greedy, beam search, ensembles) and
convs2s.inference.unk_replace.

Beam search is checked against a plain one-sentence-at-a-time reference written here from the
rules (docs/reference.md, Evaluation), on a model trained for a few seconds so that its
distributions are peaked like a real model's.

Run: .venv/bin/python -m pytest tests/test_search.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from convs2s.config import BOS, EOS, PAD, PRESETS, UNK, ModelConfig
from convs2s.model.network import ConvS2S, inference_copy
from convs2s.inference.search import generate, greedy
from convs2s.inference.unk_replace import load_dictionary, replace_unknowns

VOCAB = 24  # 4 special ids + 20 words


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small models gain nothing from intra-op threads, and one thread avoids OpenMP stalls
    (measured 50x) when the two cores are shared with other processes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def toy_pairs(n=8, seed=0):
    """Source: random words; target: the source reversed with every word id shifted by one."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        L = 3 + i % 5
        src = torch.randint(4, VOCAB - 1, (L,), generator=g).tolist()
        tgt = [w + 1 for w in reversed(src)]
        pairs.append((src + [EOS], tgt + [EOS]))
    return pairs


def collate(pairs, left_pad=False):
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs)
    src = torch.full((len(pairs), S), PAD)
    tgt = torch.full((len(pairs), T), PAD)
    prev = torch.full((len(pairs), T), PAD)
    for i, (s, t) in enumerate(pairs):
        if left_pad:
            src[i, S - len(s):] = torch.tensor(s)
        else:
            src[i, :len(s)] = torch.tensor(s)
        tgt[i, :len(t)] = torch.tensor(t)
        prev[i, :len(t)] = torch.tensor([EOS] + t[:-1])  # EOS acts as BOS
    return src, src.ne(PAD).sum(1), prev, tgt


def train(model, pairs, steps, lr=1e-2):
    src, lengths, prev, tgt = collate(pairs)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        logits, _ = model(src, lengths, prev)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.fixture(scope="module")
def trained():
    """A tiny model trained briefly (peaked but imperfect distributions), and its data."""
    torch.manual_seed(0)
    model = ConvS2S(PRESETS["tiny"](), VOCAB, VOCAB)
    pairs = toy_pairs()
    train(model, pairs, steps=60)
    return model.eval(), pairs


def reference_beam(models, src, K, max_len, min_len=1, lenpen=1.0):
    """One sentence (src 1 x S), full recomputation, Python lists: the rules spelled out."""
    beams = [([EOS], 0.0, [])]  # (prefix, cumulative log-prob, per-token log-probs)
    finished = []
    with torch.no_grad():
        for step in range(max_len + 1):
            prev = torch.tensor([b[0] for b in beams])
            srcs = src.expand(len(beams), -1)
            lps = [F.log_softmax(m(srcs, srcs.ne(PAD).sum(1), prev)[0][:, -1], -1)
                   for m in models]
            lp = torch.logsumexp(torch.stack(lps), 0) - math.log(len(models))
            lp[:, PAD] = lp[:, BOS] = -math.inf
            if step < min_len:
                lp[:, EOS] = -math.inf
            if step == max_len:
                eos = lp[:, EOS].clone()
                lp[:] = -math.inf
                lp[:, EOS] = eos
            cands = sorted(((beams[i][1] + lp[i, w].item(), i, w) for i in range(len(beams))
                            for w in range(lp.shape[1])), reverse=True)[:2 * K]
            new = []
            for rank, (score, i, w) in enumerate(cands):
                prefix, _, pos = beams[i]
                if w == EOS:
                    if rank < K and score > -math.inf and len(finished) < K:
                        n = len(prefix)
                        finished.append((prefix[1:] + [EOS], score / n ** lenpen,
                                         pos + [score - beams[i][1]]))
                elif len(new) < K:
                    new.append((prefix + [w], score, pos + [score - beams[i][1]]))
            if len(finished) >= K:
                break
            beams = new
    return sorted(finished, key=lambda h: -h[1])


def assert_same_hyps(got, want, atol=1e-4):
    assert [h["tokens"].tolist() for h in got] == [h[0] for h in want]
    for h, (_, score, pos) in zip(got, want):
        assert abs(h["score"] - score) < atol
        torch.testing.assert_close(h["positional_scores"], torch.tensor(pos), rtol=0, atol=atol)


@pytest.mark.parametrize("lenpen", [1.0, 0.3])
def test_beam_matches_reference_search(trained, lenpen):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs[:5], left_pad=True)
    hyps = generate(model, src, lengths, beam_size=3, max_len_a=1.0, max_len_b=2, nbest=3,
                    lenpen=lenpen)
    for b in range(src.shape[0]):
        row = src[b:b + 1, src[b].ne(PAD)]
        want = reference_beam([model], row, K=3, max_len=int(lengths[b]) + 2, lenpen=lenpen)
        assert_same_hyps(hyps[b], want)


def test_ensemble_matches_reference_search(trained):
    model, pairs = trained
    torch.manual_seed(5)
    other = ConvS2S(PRESETS["tiny"](), VOCAB, VOCAB)
    train(other, pairs, steps=30)
    src, lengths, _, _ = collate(pairs[:4])
    hyps = generate([model, other.eval()], src, lengths, beam_size=4, max_len_b=9, nbest=2)
    for b in range(src.shape[0]):
        want = reference_beam([model, other], src[b:b + 1, src[b].ne(PAD)], K=4, max_len=9)
        assert_same_hyps(hyps[b], want[:2])


@pytest.mark.parametrize("random_mixed", [False, True], ids=["trained", "random-mixed"])
def test_incremental_equals_full_recomputation(trained, random_mixed):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs, left_pad=True)
    if random_mixed:  # kernels 1, 2, 5, width changes, attention in a subset of layers
        torch.manual_seed(3)
        model = ConvS2S(ModelConfig(embed_dim=16, encoder_layers=[(16, 3), (24, 2)],
                                    decoder_layers=[(16, 5), (24, 2), (24, 1)], out_embed_dim=12,
                                    decoder_attention=(False, True, True)), VOCAB, VOCAB)
    kw = dict(beam_size=4, max_len_a=1.5, max_len_b=3, nbest=4)
    fast = generate(model, src, lengths, incremental=True, **kw)
    slow = generate(model, src, lengths, incremental=False, **kw)
    for f, s in zip(fast, slow, strict=True):
        assert [h["tokens"].tolist() for h in f] == [h["tokens"].tolist() for h in s]
        for a, b in zip(f, s, strict=True):
            assert abs(a["score"] - b["score"]) < 1e-5
            torch.testing.assert_close(a["attention"], b["attention"], rtol=0, atol=1e-5)


def test_beam_one_equals_greedy(trained):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)
    beam = generate(model, src, lengths, beam_size=1, max_len_b=12)
    grd = greedy(model, src, lengths, max_len_b=12)
    for b, g in zip(beam, grd, strict=True):
        assert b[0]["tokens"].tolist() == g[0]["tokens"].tolist()
        assert abs(b[0]["score"] - g[0]["score"]) < 1e-5
        torch.testing.assert_close(b[0]["attention"], g[0]["attention"])


def test_ensemble_of_copies_equals_single_model(trained):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)
    kw = dict(beam_size=3, max_len_b=10, nbest=3)
    one = generate(model, src, lengths, **kw)
    alone = generate([model], src, lengths, **kw)
    two = generate([model, inference_copy(model)], src, lengths, **kw)
    for a, b, c in zip(one, alone, two, strict=True):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b] \
            == [h["tokens"].tolist() for h in c]
        for x, y, z in zip(a, b, c, strict=True):
            assert x["score"] == y["score"]
            assert abs(x["score"] - z["score"]) < 1e-5


def test_lengths_eos_min_len_and_fixed_length(trained):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)
    for hyps in generate(model, src, lengths, beam_size=3, max_len_b=20, min_len=9, nbest=3):
        for h in hyps:
            t = h["tokens"].tolist()
            assert t[-1] == EOS and EOS not in t[:-1] and len(t) >= 10
            assert PAD not in t and BOS not in t
            assert abs(h["score"] - h["positional_scores"].sum().item() / len(t)) < 1e-5
    # max_len_a=0, max_len_b=N, min_len=N: every output is exactly N tokens + EOS
    for fn in (generate, greedy):
        for hyps in fn(model, src, lengths, max_len_a=0, max_len_b=6, min_len=6):
            assert len(hyps[0]["tokens"]) == 7
    # max length a * |x| + b, per sentence (|x| counts the source EOS)
    for hyps, n in zip(generate(model, src, lengths, max_len_a=0.5, max_len_b=1, nbest=3),
                       lengths.tolist(), strict=True):
        assert all(len(h["tokens"]) - 1 <= int(0.5 * n + 1) for h in hyps)


def test_a_sentence_whose_max_length_is_below_min_len_ends_there_with_its_own_score(trained):
    """The max length is per sentence (a * |x| + b within the model's positions): a short
    sentence of the batch may get fewer pieces than `min_len`. It ends at its max length,
    scored as the model scores EOS there, and the batch's other sentences keep `min_len`. (EOS
    was banned and forced at one step: such an output scored about -1e4, max_len_b=3 and
    min_len=6 gave -2502; refusing the batch instead failed every sentence searched with it.)"""
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)  # sentence 0: 3 pieces + EOS, the shortest
    max_lens = (lengths.double() * 0.5).long()  # max_len_a=0.5, max_len_b=0
    assert int(max_lens[0]) == 2 and int(max_lens.max()) >= 3
    for fn in (generate, greedy):
        for b, hyps in enumerate(fn(model, src, lengths, max_len_a=0.5, max_len_b=0,
                                    min_len=3)):
            pieces = len(hyps[0]["tokens"]) - 1  # (its EOS last)
            assert pieces >= min(3, int(max_lens[b])) and pieces <= int(max_lens[b]), (b, hyps)
            assert hyps[0]["score"] > -100, (b, hyps[0]["score"])
        (short,) = fn(model, src[:1], lengths[:1], max_len_a=0, max_len_b=3, min_len=6)
        assert len(short[0]["tokens"]) == 4 and short[0]["score"] > -100


def test_a_source_row_without_tokens_is_refused_not_searched(trained):
    """An all-padding row (or a 0-wide batch) has nothing to attend to (a NaN softmax):
    an error that says so, not an empty or NaN hypothesis."""
    model, pairs = trained
    src, lengths, _, _ = collate(pairs[:2])
    src[1] = PAD
    lengths[1] = 0
    for fn in (generate, greedy):
        with pytest.raises(ValueError, match=r"source rows \[1\] hold no token"):
            fn(model, src, lengths, max_len_b=5)
        with pytest.raises(ValueError, match="hold no token"):
            fn(model, src[:, :0], lengths, max_len_b=5)


def test_scores_are_the_models_log_probs(trained):
    """Teacher-forcing each hypothesis reproduces its positional scores and attention."""
    model, pairs = trained
    src, lengths, _, _ = collate(pairs[:3], left_pad=True)
    hyps = generate(model, src, lengths, beam_size=4, max_len_b=10, nbest=4)
    for b in range(3):
        scores = [h["score"] for h in hyps[b]]
        assert scores == sorted(scores, reverse=True)
        for h in hyps[b]:
            tok = h["tokens"]
            prev = torch.cat([torch.tensor([EOS]), tok[:-1]])[None]
            with torch.no_grad():
                logits, attn = model(src[b:b + 1], lengths[b:b + 1], prev)
            lp = F.log_softmax(logits[0], -1).gather(1, tok[:, None])[:, 0]
            torch.testing.assert_close(h["positional_scores"], lp, rtol=0, atol=1e-5)
            real = src[b].ne(PAD)
            torch.testing.assert_close(h["attention"], attn[0][:, real].t(), rtol=0, atol=1e-5)


def test_a_search_without_attention_finds_the_same_hypotheses_and_keeps_none(trained):
    """attention=False (what translation and serving ask unless the attention is wanted):
    the same tokens, scores and positional scores, in beam search (an ensemble too) and
    greedy, and no attention kept: the hypotheses carry None."""
    model, pairs = trained
    src, lengths, _, _ = collate(pairs, left_pad=True)
    for fn, kw in ((generate, dict(beam_size=4, max_len_b=10, nbest=4)),
                   (generate, dict(beam_size=3, max_len_b=12, min_len=5, nbest=2)),
                   (greedy, dict(max_len_b=12))):
        for models in (model, [model, inference_copy(model)]):
            kept = fn(models, src, lengths, **kw)
            none = fn(models, src, lengths, attention=False, **kw)
            for a, b in zip(kept, none, strict=True):
                assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
                assert [h["score"] for h in a] == [h["score"] for h in b]
                for x, y in zip(a, b, strict=True):
                    assert torch.equal(x["positional_scores"], y["positional_scores"])
                    assert x["attention"] is not None and y["attention"] is None


def test_unk_penalty(trained):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)
    boosted = generate(model, src, lengths, beam_size=2, max_len_b=8, unk_penalty=-50.0)
    assert all(UNK in h[0]["tokens"].tolist() for h in boosted)
    banned = generate(model, src, lengths, beam_size=2, max_len_b=8, unk_penalty=50.0, nbest=2)
    assert all(UNK not in h["tokens"].tolist() for hs in banned for h in hs)


def test_generate_restores_training_mode(trained):
    model, pairs = trained
    src, lengths, _, _ = collate(pairs[:2])
    model.train()
    generate(model, src, lengths, beam_size=2, max_len_b=3)
    assert model.training
    model.eval()


def test_tiny_model_overfits_and_greedy_reproduces():
    """A tiny model learns a handful of pairs (loss < 0.1) and greedy decoding returns them."""
    torch.manual_seed(0)
    model = ConvS2S(PRESETS["tiny"](), VOCAB, VOCAB)
    pairs = toy_pairs()
    # 150 Adam steps: seeds 0-9 all end below 0.002 (at 100 steps an unlucky dropout stream
    # could still be recovering from a loss spike).
    loss = train(model, pairs, steps=150)
    assert loss < 0.1
    src, lengths, _, _ = collate(pairs, left_pad=True)
    for (_, tgt), hyp in zip(pairs, greedy(model, src, lengths, max_len_a=1.5, max_len_b=5),
                             strict=True):
        assert hyp[0]["tokens"].tolist() == tgt
    for (_, tgt), hyp in zip(pairs, generate(model, src, lengths, max_len_a=1.5, max_len_b=5),
                             strict=True):
        assert hyp[0]["tokens"].tolist() == tgt


def test_replace_unknowns(tmp_path):
    src = ["das", "Haus", "ist", "klein"]
    hyp = ["the", "<unk>", "is", "<unk>"]
    attn = torch.zeros(5, 5)  # source words + EOS row, hypothesis words + EOS column
    attn[0, 0] = attn[1, 1] = attn[2, 2] = attn[3, 3] = 1.0
    attn[4, 3] = 2.0  # the source EOS is never a replacement
    path = tmp_path / "dict.txt"
    path.write_text("Haus house\nklein small\n\n")
    table = load_dictionary(str(path))
    assert replace_unknowns(hyp, src, attn, dictionary=table) == ["the", "house", "is", "small"]
    assert replace_unknowns(hyp, src, attn) == ["the", "Haus", "is", "klein"]
    with pytest.raises(ValueError, match="does not cover"):
        replace_unknowns(hyp, src, attn[:2])
    # Pieces: one that alone spells a source word is that word (or its entry, as the codec's
    # word piece); a piece of a longer word is copied as it is, never looked up.
    pieces, words = ["\u2581das", "\u2581Ha", "us"], ["das", None, None]
    unks = ["<unk>"] * 3
    assert replace_unknowns(unks, pieces, attn[:, :3], dictionary={"das": "the", "us": "X"},
                            words=words, word_piece=lambda w: "\u2581" + w) == \
        ["\u2581the", "\u2581Ha", "us"]
    with pytest.raises(ValueError, match="2 source words given for 3 source pieces"):
        replace_unknowns(unks, pieces, attn, words=words[:2])
    bad = tmp_path / "bad.txt"
    bad.write_text("one two three\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        load_dictionary(str(bad))


@pytest.mark.parametrize("V", [8000, 8003, 24, 1000])
def test_best_candidates_equal_a_full_topk(V):
    from convs2s.inference.search import _best_candidates

    torch.manual_seed(V)
    A, K, k = 3, 5, 10
    lprobs = torch.randn(A * K, V).log_softmax(-1)
    scores = torch.randn(A * K) * 3
    scores[1:K] = -math.inf  # sentence 0: only beam 0 is live (the first step)
    lprobs[K + 2, -2:] = torch.tensor([5.0, 6.0])  # winners after the last full block
    lprobs[2 * K:, ::2] = -math.inf
    want_v, want_i = (lprobs + scores[:, None]).view(A, K * V).topk(k, dim=1)
    got_v, got_i = _best_candidates(lprobs, scores, K, k)
    assert torch.equal(got_v, want_v) and torch.equal(got_i, want_i)


def test_beam_matches_reference_search_with_a_wide_vocabulary():
    """K x V = 4000 candidates per sentence: the blocked top-k path of the search."""
    torch.manual_seed(11)
    model = ConvS2S(PRESETS["tiny"](), 50, 1000).eval()
    src = torch.randint(4, 50, (3, 6))
    src[0, :2] = PAD
    lengths = src.ne(PAD).sum(1)
    hyps = generate(model, src, lengths, beam_size=4, max_len_b=5, nbest=4)
    for b in range(3):
        want = reference_beam([model], src[b:b + 1, src[b].ne(PAD)], K=4, max_len=5)
        assert_same_hyps(hyps[b], want)


class HostSyncs(TorchDispatchMode):
    """Counts, per decoder step of a search, the operations that make the host wait for the
    device on a GPU: reading a value (`bool`, `int`, `.item()`), `nonzero` and what is built on
    it (a boolean-mask index, `masked_select`, `unique`, a tensor of repeats) and copies to
    the host. On the CPU nothing waits, but the operations are the same ones: counted here,
    they are what a GPU search would wait for (the `gpu` test below checks it with CUDA's own
    sync debug mode)."""

    SYNCS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default",
             "aten.nonzero.default", "aten.nonzero_numpy.default", "aten.argwhere.default",
             "aten.masked_select.default", "aten.repeat_interleave.Tensor",
             "aten._unique2.default", "aten.unique_dim.default",
             "aten.unique_consecutive.default"}

    def __init__(self, monkeypatch):
        super().__init__()
        from convs2s.inference import search

        self.per_step: list[int] = []  # syncs from one step's start to the next's (or to
        # the results' collection)
        self._stepping = False
        step, collect = search._ensemble_step, search._Finished.collect

        def counted_step(*a, **k):
            self._stepping = True
            self.per_step.append(0)
            return step(*a, **k)

        def uncounted_collect(*a, **k):
            self._stepping = False
            return collect(*a, **k)

        monkeypatch.setattr(search, "_ensemble_step", counted_step)
        monkeypatch.setattr(search._Finished, "collect", uncounted_collect)
        self._host = TorchFunctionMode.__new__(_HostCopies)
        self._host.owner = self

    def __enter__(self):
        self._host.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._host.__exit__(*exc)

    def count(self) -> None:
        if self._stepping:
            self.per_step[-1] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in self.SYNCS or (name.startswith(("aten.index.Tensor", "aten.index_put"))
                                  and any(i is not None and i.dtype == torch.bool
                                          for i in args[1])):
            self.count()
        return func(*args, **(kwargs or {}))


class _HostCopies(TorchFunctionMode):
    """Copies to the host, which on a CPU tensor never reach the dispatcher."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("tolist", "cpu", "numpy"):
            self.owner.count()
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_a_search_step_waits_for_the_device_once_and_twice_when_a_hypothesis_ends(
        trained, search, monkeypatch):
    """On a GPU every host sync of a step stops the host from queueing the next step's kernels
    while the device works. Beam search syncs once a step to find the hypotheses that ended
    and, only when one did, once more to find the sentences that are done; greedy search once
    (the sentences that ended). Steps from the batch's smallest max length on add one (the rows
    whose EOS is forced). Checked on sentences that end by themselves (the trained model,
    max length 30) and on an untrained model whose every sentence is forced to end at its
    max length, over a 1,000-token vocabulary (the blocked top-k)."""
    model, pairs = trained
    src, lengths, _, _ = collate(pairs)
    torch.manual_seed(11)
    wide = ConvS2S(PRESETS["tiny"](), VOCAB, 1000).eval()
    for m, b, ends_by_itself in ((model, 30, True), (wide, 6, False)):
        syncs = HostSyncs(monkeypatch)
        with syncs:
            if search == "beam":
                hyps = generate(m, src, lengths, beam_size=4, max_len_b=b, nbest=2)
            else:
                hyps = greedy(m, src, lengths, max_len_b=b)
        assert all(h for h in hyps)
        steps = syncs.per_step
        forced = [] if ends_by_itself else steps[b:]  # steps from the max length on
        free = steps[:len(steps) - len(forced)]
        assert len(steps) > 3
        most = 1 if search == "greedy" else 2
        assert max(free) <= most and 1 in free, steps
        assert all(n <= most + 1 for n in forced), steps


@pytest.mark.gpu
@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_on_a_gpu_a_search_step_syncs_as_often_as_counted_on_the_cpu(trained, search,
                                                                     monkeypatch):
    """CUDA's sync debug mode warns at every operation that makes the host wait for the GPU:
    per step no more than the CPU count above (a sync the CPU count cannot see shows here)."""
    import warnings

    from convs2s.inference import search as search_module

    model, pairs = trained
    gpu = ConvS2S(PRESETS["tiny"](), VOCAB, VOCAB).cuda().eval()
    gpu.load_state_dict(model.state_dict())
    src, lengths, _, _ = collate(pairs)
    src, lengths = src.cuda(), lengths.cuda()
    marks: list[int] = []  # sync warnings so far, at each step's start and at the collection
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")

        def mark(fn):
            def marked(*a, **k):
                marks.append(sum("synchroniz" in str(w.message) for w in seen))
                return fn(*a, **k)
            return marked

        monkeypatch.setattr(search_module, "_ensemble_step",
                            mark(search_module._ensemble_step))
        monkeypatch.setattr(search_module._Finished, "collect",
                            mark(search_module._Finished.collect))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            if search == "beam":
                generate(gpu, src, lengths, beam_size=4, max_len_b=30, nbest=2)
            else:
                greedy(gpu, src, lengths, max_len_b=30)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    per_step = [b - a for a, b in zip(marks, marks[1:])]
    assert len(per_step) > 3
    assert min(per_step) >= 1, per_step  # (every step has its nonzero: the warnings are seen)
    assert max(per_step) <= (1 if search == "greedy" else 2), per_step
