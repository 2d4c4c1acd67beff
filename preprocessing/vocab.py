"""Joint BPE vocabulary: the project-wide special ids and the sentencepiece model.

The model is learned once (paper §4.1: joint BPE, 40k types) on a bounded, seeded, uniform
random sample of training pairs, both sides in one model. The sample is the `spm_sample_pairs`
rows with the smallest mix64(id, seed): a uniform sample without replacement that depends only
on row ids, so the same input and seed always give the same model. The sample and the trainer
stay in Ray (`learn_bpe`, a task): nothing of either reaches the driver.

Special ids match `convs2s.config` (a test checks it): BOS=0, PAD=1, EOS=2, UNK=3. Byte
fallback spells characters outside the vocabulary as bytes, so decode(encode(x)) == x for
any cleaned text (cleaning makes U+2581, sentencepiece's own word mark, a space), and the
identity normalization keeps the text exactly as cleaning left it.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sentencepiece as spm

from preprocessing.errors import PreprocessError
from preprocessing.stages import mix64
from storage import local_copy, location

# Special token ids, fixed project-wide (the same values as convs2s.config; the packages do
# not import each other). Encoded sentences end with EOS and carry no BOS.
BOS, PAD, EOS, UNK = 0, 1, 2, 3

log = logging.getLogger("preprocessing")


def _sample_filter(batch: pa.Table, *, threshold: int, seed: int) -> pa.Table:
    """Ray Data function: rows whose hash falls under the sampling threshold, with the hash."""
    h = mix64(batch["id"].to_numpy(), seed)
    keep = h < np.uint64(threshold)
    return pa.table({"h": pa.array(h[keep], pa.uint64()),
                     "src": batch["src"].filter(pa.array(keep)),
                     "tgt": batch["tgt"].filter(pa.array(keep))})


def sample_pairs(ds, n_rows: int, k: int, seed: int) -> list:
    """The blocks (ObjectRefs of pyarrow tables with `h`, src, tgt) holding the k rows of `ds`
    (columns id, src, tgt; n_rows in all) with the smallest hash, and a few more.

    A Bernoulli pre-filter at rate ~1.1 k / n runs in Ray; what passes stays in the object
    store (`smallest` keeps the k). Fewer than k pass with negligible probability, in which
    case the sample is simply those rows (still uniform).
    """
    rate = min(1.0, 1.1 * k / max(n_rows, 1) + 64 / max(n_rows, 1))
    threshold = min(int(rate * 2.0**64), 2**64 - 1)
    return ds.map_batches(_sample_filter, batch_format="pyarrow",
                          fn_kwargs={"threshold": threshold, "seed": seed}).to_arrow_refs()


def smallest(tables: list[pa.Table], k: int) -> pa.Table:
    """The k rows of `tables` with the smallest hash `h`, in its order."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({"h": pa.array([], pa.uint64()), "src": pa.array([], pa.string()),
                         "tgt": pa.array([], pa.string())})
    table = pa.concat_tables(tables)
    table = table.take(pc.sort_indices(table, [("h", "ascending")]))
    return table.slice(0, k)


def learn_bpe(blocks: list, k: int, model_prefix: str, vocab_size: int,
              character_coverage: float) -> int:
    """Ray task body: `train_bpe` (`model_prefix`: a folder's or a bucket's path) on the k
    smallest-hash rows of `blocks` (`sample_pairs`'s ObjectRefs); the number of pairs it
    learned from. It runs in a Ray task so that neither the sample (about 250 MB at 1M pairs)
    nor the trainer's memory lands on the driver, which a cluster runs on its head node
    (preprocessing.pipeline)."""
    import ray

    sample = smallest(ray.get(blocks), k)
    train_bpe(sample, model_prefix, vocab_size, character_coverage)
    return sample.num_rows


def train_bpe(sample: pa.Table, model_prefix: str | Path, vocab_size: int,
              character_coverage: float = 0.9999) -> None:
    """Train the joint BPE model on both sides of `sample`: writes <prefix>.model / .vocab.

    Sentences are streamed to the trainer and the model comes back as bytes, so the model file
    records no temporary paths: the same sample gives a byte-identical model.
    """
    def sentences():
        for s, t in zip(sample["src"].to_pylist(), sample["tgt"].to_pylist()):
            yield s
            yield t

    # sentencepiece skips a sentence longer than max_sentence_length without a word (at
    # minloglevel 2): every sampled sentence is learned from, however long max_line_bytes lets
    # it be
    longest = max((pc.max(pc.binary_length(sample[side])).as_py() or 0
                   for side in ("src", "tgt")), default=0)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=buf, model_type="bpe",
            vocab_size=vocab_size, character_coverage=character_coverage, byte_fallback=True,
            bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=UNK,
            normalization_rule_name="identity",  # text is already NFC-cleaned; keep it exact
            input_sentence_size=0, shuffle_input_sentence=False,  # we sampled ourselves
            max_sentence_length=max(1 << 16, longest + 1),
            num_threads=1,  # the learned merges depend on the thread count: keep it fixed
            minloglevel=2)
    except RuntimeError as e:  # e.g. fewer types than the sample's required characters
        raise PreprocessError(f"sentencepiece could not train a {vocab_size}-type BPE model "
                              f"on {sample.num_rows} sampled pairs: {e}; change vocab_size "
                              "or character_coverage") from None
    location(f"{model_prefix}.model").write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    location(f"{model_prefix}.vocab").write_text("".join(
        f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())))


def load(path: str | Path) -> spm.SentencePieceProcessor:
    """Load a model and check that it uses the project's special ids."""
    sp = spm.SentencePieceProcessor(model_file=str(local_copy(path)))  # a bucket's: fetched
    ids = (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id())
    if ids != (BOS, PAD, EOS, UNK):
        raise ValueError(f"{path}: special ids (bos, pad, eos, unk) = {ids}, expected "
                         f"{(BOS, PAD, EOS, UNK)}; retrain it with preprocessing")
    return sp
