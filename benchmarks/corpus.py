"""Real sentences for the benchmarks: small WMT test sets from ../shared/data, BPE-encoded.

The training and generation benchmarks run on real sentence lengths (and real token ids): the
news test sets are cleaned as preprocessing cleans text, a joint sentencepiece BPE is trained
on them with preprocessing's own trainer (`preprocessing.vocab.train_bpe`), and every sentence
is encoded and terminated with EOS, exactly as the `encoded/` stage does. Corpora this small
cannot hold a 40k-type BPE; the BPE size sets the sentence lengths only, while the model's
vocabulary (its embedding and output layer) is set separately.

    pairs = read_pairs(data_dir / "wmt14-en-fr", ["newstest2012", "newstest2013"], "en", "fr")
    sp = train_joint_bpe(pairs, vocab_size=16_000, workdir=tmp)
    src_ids = encode(sp, [s for s, _ in pairs])       # lists of ids, each ending with EOS
"""

from __future__ import annotations

import gzip

from pathlib import Path

import numpy as np
import pyarrow as pa
import sentencepiece as spm

from preprocessing.batching import cut_batches
from preprocessing.cleaning import normalize
from preprocessing.vocab import EOS, load, train_bpe

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data


def read_pairs(folder: Path, names: list[str], src_lang: str, tgt_lang: str
               ) -> list[tuple[str, str]]:
    """Line-aligned pairs of the files `<folder>/<name>.<lang>`, cleaned (NFC, controls,
    whitespace); pairs with an empty side are left out."""
    pairs = []
    for name in names:
        paths = [Path(folder) / f"{name}.{lang}" for lang in (src_lang, tgt_lang)]
        paths = [p if p.is_file() or not p.with_name(p.name + ".gz").is_file()
                 else p.with_name(p.name + ".gz") for p in paths]  # gzipped: read as is
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"benchmark corpus file(s) {missing} not found: give the "
                                    "folder of the small real corpora with --data (the "
                                    "project's ../shared/data, see its README)")
        src, tgt = ((gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())
                    .decode("utf-8").split("\n") for p in paths)
        if src and src[-1] == "" and tgt and tgt[-1] == "":  # the final newline
            src, tgt = src[:-1], tgt[:-1]
        if len(src) != len(tgt):
            raise ValueError(f"{paths[0]} has {len(src)} lines but {paths[1]} has {len(tgt)}: "
                             "line-aligned files must have the same number of lines")
        for s, t in zip(src, tgt):
            s, t = normalize(s), normalize(t)
            if s and t:
                pairs.append((s, t))
    return pairs


def train_joint_bpe(pairs: list[tuple[str, str]], vocab_size: int, workdir: Path
                    ) -> spm.SentencePieceProcessor:
    """A joint BPE of both sides of `pairs` (preprocessing's trainer, special ids included)."""
    table = pa.table({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    prefix = Path(workdir) / f"bench-bpe-{vocab_size}"
    train_bpe(table, prefix, vocab_size)
    return load(f"{prefix}.model")


def encode(codec, sentences: list[str]) -> list[list[int]]:
    """Token ids of each sentence with EOS appended (the `encoded/` stage's format): with a
    sentencepiece model, or a checkpoint's text codec (`convs2s.io.text_codec`)."""
    if isinstance(codec, spm.SentencePieceProcessor):
        return [ids + [EOS] for ids in codec.encode(sentences, out_type=int)]
    return [codec.source_ids(codec.encode(s)) + [EOS] for s in sentences]


def token_budget_batches(src: list[list[int]], tgt: list[list[int]], max_tokens: int,
                         seed: int) -> list[tuple[list[list[int]], list[list[int]]]]:
    """Training batches as the `batches/` stage cuts them: sorted by length (longer side, then
    source, then target, then a seeded tie-break), cut greedily so that
    n_sentences * max(src_len, tgt_len) <= max_tokens, returned in a seeded random order."""
    rng = np.random.default_rng(seed)
    src_len = np.array([len(s) for s in src])
    tgt_len = np.array([len(t) for t in tgt])
    longest = np.maximum(src_len, tgt_len)
    order = np.lexsort((rng.permutation(len(src)), tgt_len, src_len, longest))
    bounds, _ = cut_batches(longest[order], max_tokens, None)  # longer sentences are dropped
    batches = [([src[i] for i in order[a:b]], [tgt[i] for i in order[a:b]]) for a, b in bounds]
    return [batches[i] for i in rng.permutation(len(batches))]


def length_stats(seqs: list[list[int]]) -> dict:
    lens = np.array([len(s) for s in seqs])
    return {"sentences": int(len(lens)), "mean": round(float(lens.mean()), 2),
            "median": float(np.median(lens)), "p95": float(np.percentile(lens, 95)),
            "max": int(lens.max())}
