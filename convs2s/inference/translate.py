"""Translate text with one ConvS2S checkpoint or an ensemble of them (beam search, paper §4.3).

No Ray and no MLflow: this is the library that the evaluation jobs (`workflows.evaluation`),
the served model (`convs2s.serving.pyfunc`) and the command line (`convs2s.cli`) call.

Command line (also installed as `convs2s-translate`):

    python -m convs2s translate --checkpoint runs/demo/best [runs/other/best ...] \\
        --input test.en --output hyp.fr [--beam 5 --lenpen 1 --max-len-a 0 --max-len-b 200 \\
        --min-len 1 --unk-penalty 0 --nbest 1 --replace-unk [--dictionary lex.txt] \\
        --batch-size 128 --device cpu --threads 4 --print-attention --spm-model spm.model]

Reads one sentence per line (a file, a .gz of one, a parquet file's --column, or stdin when
--input is absent or "-"; --output may not be the --input file) and writes one detokenized
translation per line in input order. With --nbest N, N lines per input; with
--print-attention, a verbose format per input: `S-i source`, then per hypothesis `H-i score
text`, `P-i positional log-probs` and `A-i` alignments (`src-tgt` sentencepiece-piece index
pairs, each target piece aligned to its most attended source piece).

Python API:

    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference
    tr = load_for_inference(["runs/demo/best"], SearchConfig(beam=5, lenpen=1.0), "cpu")
    tr.translate(["the cat is small ."])        # -> ["le chat est petit ."]
    tr.translate_full(lines)                    # -> [Translation] with nbest Hypothesis each
    tr.translate_full(lines, attention=False)   # the same, without their attention matrices

Input handling: lines are normalized as preprocessing cleans text (control characters
dropped, then NFC, whitespace collapsed). An empty line gives an empty translation (the model
never sees it). A line longer than the model's position table is cut to `max_positions - 1`
pieces + EOS with a logged warning. Sentences are sorted by length and searched in batches of
up to `SearchConfig.max_sentences` (128, the paper's speed setting) so padding stays small; weight
norm is folded once per model at load time (`convs2s.model.network.inference_copy`).
"""

from __future__ import annotations

import logging
import math
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from convs2s.io.checkpoint import CheckpointError
from convs2s.config import EOS, PAD, UNK, SearchConfig
from convs2s.inference.quantize import for_inference, resolve_precision
from convs2s.inference.search import generate
from convs2s.inference.shortlist import Shortlist, ShortlistError
from convs2s.inference.unk_replace import load_dictionary, unk_replaced_text
from storage import StorageError, local_copy
from storage.paths import shown

log = logging.getLogger("convs2s.inference.translate")
MAX_WORD_CHARS = 4096  # a "word" longer than this in a source line is junk: cut there


@dataclass
class Hypothesis:
    text: str  # detokenized output
    score: float  # length-normalized log-probability
    tokens: list[int]  # target piece ids, final EOS included
    positional_scores: list[float]  # log p of each token (EOS included)
    # (source pieces + EOS) x (target pieces + EOS), model/layer mean; None when searched
    # without attention (translate_full(..., attention=False))
    attention: torch.Tensor | None

    def alignment(self) -> list[tuple[int, int]]:
        """(source piece, target piece) pairs: each target piece's most attended source piece.

        Indices are into the sentencepiece pieces on both sides (Translation.src_pieces and
        the hypothesis's tokens), so the source EOS row is left out of the choice (as in
        `unk_replace.replace_unknowns`): a piece that attends EOS most gets the most attended
        real source piece, not the index len(src_pieces), which names no piece."""
        if self.attention is None:
            raise ValueError("this hypothesis was searched without attention: ask "
                             "translate_full(..., attention=True) for alignments")
        pieces = self.attention[:-1, : len(self.tokens) - 1]  # rows: source pieces, EOS off
        if pieces.numel() == 0:
            return []
        best = pieces.argmax(dim=0).tolist()
        return [(s, t) for t, s in enumerate(best)]


@dataclass
class Translation:
    source: str  # the normalized input line
    src_pieces: list[str]  # sentencepiece pieces fed to the encoder (without EOS)
    hypotheses: list[Hypothesis]  # best first; empty for an empty line
    truncated: bool = False  # the source was cut to the model's positions

    @property
    def text(self) -> str:
        return self.hypotheses[0].text if self.hypotheses else ""

    @property
    def untranslated(self) -> bool:
        """A line with text whose search found no translation with a finite score (damaged
        weights, or an overflow in low precision): its `text` is empty, not a translation."""
        return bool(self.source) and (not self.hypotheses or not all(
            map(math.isfinite, self.hypotheses[0].positional_scores)))


def without_cut_line_warnings(record: logging.LogRecord) -> bool:
    """A logging filter for this module's logger where cut lines are counted otherwise (a served
    answer's "truncated", a corpus part's record): their warnings, one a line, are left out;
    those about lines with no finite translation are kept."""
    return not (record.levelno == logging.WARNING and "cut to" in record.getMessage())


def normalize(text: str) -> str:
    """Control / format characters dropped, NFC, whitespace collapsed: as preprocessing cleans
    training text (`preprocessing.cleaning.normalize`, copied because convs2s may not import
    preprocessing; tests/test_translate.py checks that the two agree). Deleting comes first: a
    deleted character between a letter and its combining mark would otherwise leave them
    uncomposed, and the sentencepiece model (normalization rule "identity") would split them
    into byte pieces the training text never had. U+2581, sentencepiece's word mark, is a
    space, as the sentencepiece model reads it."""
    if not text.isprintable():  # (the zero-width non-joiner and joiner spell words: kept)
        text = "".join(c if c.isprintable() or c in "\u200c\u200d"
                       else (" " if c.isspace() else "") for c in text)
    if "\u2581" in text:
        text = text.replace("\u2581", " ")
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return " ".join(text.split())


def load_for_inference(paths: str | os.PathLike | Iterable[str | os.PathLike],
                       search: SearchConfig | None = None,
                       device: str | torch.device = "cpu",
                       spm_model: str | os.PathLike | None = None) -> "Translator":
    """The one way to load checkpoints for inference (translate, evaluation, serving, the
    benchmarks): one checkpoint directory = a single model, several = an ensemble. Each model
    is an eval copy with weight norm folded into its weights; the text pipeline is the
    checkpoint's own (`convs2s.io.text_codec`: its bundled sentencepiece model, `spm_model` for
    all of them, or an imported model's dictionaries and BPE codes). All must share one text
    pipeline and the vocabulary sizes that go with it. Bad input raises a CheckpointError that
    names the file and the fix."""
    from convs2s.io.text_codec import (CodecError, check_spm_model_fits, codec_files,
                                       codec_for_checkpoint, local_checkpoint)

    # a bucket's: fetched once per node, a checkpoint.pt with its folder (file://: its local
    # path); a checkpoint.pt's text pipeline is its folder's
    paths = [local_checkpoint(p)
             for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not paths:
        raise CheckpointError("no checkpoint given")
    search = search or SearchConfig()
    # What is served: the asked precision, or float32 where it cannot run and the user asked
    # for that fallback (one warning); the translator's search says which.
    served = resolve_precision(search.precision, device, search.precision_fallback)
    search = search.replace(precision=served)
    models = [for_inference(_inference_model(p, device), served) for p in paths]
    if spm_model is not None:  # a bucket's (or a file:// URI's): its local copy, as the
        # checkpoints' (a URI taken as a local path "did not exist")
        try:
            spm_model = local_copy(spm_model)
        except (FileNotFoundError, StorageError) as err:
            raise CheckpointError(f"sentencepiece model {shown(str(spm_model))}: {err}") \
                from None
        if not spm_model.is_file():
            raise CheckpointError(f"sentencepiece model {spm_model} does not exist")
    try:
        if spm_model is not None:  # for sentencepiece checkpoints only (no member's text.json)
            for p in paths:
                check_spm_model_fits(p, spm_model)
        codec = codec_for_checkpoint(paths[0], spm_model)
        # Every member's text pipeline: the given sentencepiece model (a member that bundles
        # one must bundle that very one), else its own files; an ensemble needs one for all.
        given = None if spm_model is None else [Path(spm_model).read_bytes()]
        first = given or [f.read_bytes() for f in codec_files(paths[0])]
        for p in paths:
            own = [f.read_bytes() for f in codec_files(p)]
            if given and own and own != given:
                raise CheckpointError(
                    f"{p} bundles another sentencepiece model than --spm-model {spm_model}: "
                    "its token ids mean other pieces; leave --spm-model out to use its own, or "
                    "give the model it was trained with")
            if (given or own) != first:
                raise CheckpointError(f"{p} uses another text pipeline (sentencepiece "
                                      f"model, or dictionaries and BPE codes) than "
                                      f"{paths[0]}: an ensemble needs models trained on "
                                      "the same vocabulary")
    except CodecError as err:
        raise CheckpointError(str(err)) from None
    for p, m in zip(paths, models):
        if (m.src_vocab_size, m.tgt_vocab_size) != (codec.src_size, codec.tgt_size):
            what = "sentencepiece.model" if codec.kind == "sentencepiece" else "dictionaries"
            raise CheckpointError(
                f"{p}: vocabulary sizes {m.src_vocab_size}/{m.tgt_vocab_size} do not match "
                f"its {what} ({codec.src_size}/{codec.tgt_size} symbols)")
    shortlist = None
    if search.shortlist:
        if codec.kind != "sentencepiece":
            raise CheckpointError(f"{paths[0]}: vocabulary selection reads a lexical table of "
                                  "sentencepiece ids; this model's text pipeline is "
                                  f"{codec.kind}: search without a shortlist")
        spm_file = Path(spm_model) if spm_model is not None else codec_files(paths[0])[0]
        try:
            shortlist = Shortlist.load(search.shortlist, spm_file, models[0].src_vocab_size,
                                       target_vocab_size=models[0].tgt_vocab_size)
        except ShortlistError as err:
            raise CheckpointError(str(err)) from None
    return Translator(models, codec, search, device, shortlist)


def _inference_model(path: Path, device: str | torch.device):
    """The inference copy of one checkpoint directory's model, or a CheckpointError."""
    from convs2s.io.checkpoint import load_model
    from convs2s.model.network import inference_copy

    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist: give a checkpoint directory "
                              "of a training run (e.g. <storage_path>/<run_name>/best)")
    try:
        model, meta = load_model(path, device="cpu")
    except FileNotFoundError as err:
        raise CheckpointError(str(err)) from None
    except CheckpointError:  # unreadable or unsafe: the message says so
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        # A torch file of another shape (load_state_dict, the config): never torch's own text,
        # which suggests unsafe loading.
        raise CheckpointError(
            f"{path} is not a checkpoint of this project's model ({type(err).__name__} while "
            "rebuilding it); pick a checkpoint_* or best/ directory of a training run") from None
    net = inference_copy(model.to(device))
    net.meta = meta  # what the checkpoint says about itself: update, epoch, imported_from, ...
    return net


def batches_by_budget(todo: list, max_sentences: int, max_tokens: int = 0) -> list[list]:
    """(index, ids) pairs sorted longest first -> batches of at most `max_sentences`, and, with
    `max_tokens` > 0, of at most that many padded source tokens (a batch's first sentence is its
    longest; a sentence longer than the budget is a batch of its own)."""
    out: list[list] = []
    for item in todo:
        if out:
            batch = out[-1]
            n, longest = len(batch), len(batch[0][1])
            if n < max_sentences and (max_tokens <= 0 or (n + 1) * longest <= max_tokens):
                batch.append(item)
                continue
        out.append([item])
    return out


class Translator:
    """A checkpoint's text pipeline (`convs2s.io.text_codec`: sentencepiece, or Moses + BPE for
    imported reference models) and one model or an ensemble (probabilities averaged,
    docs/reference.md, Evaluation)."""

    def __init__(self, models: list, codec, search: SearchConfig,
                 device: str | torch.device = "cpu", shortlist: Shortlist | None = None):
        if not models:
            raise ValueError("a Translator needs at least one model")
        self.models, self.codec, self.search = list(models), codec, search
        self.shortlist = shortlist  # vocabulary selection's table, or None
        self.device = torch.device(device)
        self.max_positions = min(m.max_positions for m in self.models)
        if search.min_len > self.max_positions - 1:  # (EOS is forced at the position table's
            # end: every output would be cut there, whatever min_len asks)
            raise ValueError(f"min_len={search.min_len} is more output pieces than the model "
                             f"writes (max_positions {self.max_positions}: at most "
                             f"{self.max_positions - 1} and EOS): lower min_len")
        self.dictionary = load_dictionary(search.dictionary) if search.dictionary else None

    # --- encoding ------------------------------------------------------------------------------

    def encode(self, line: str, index: int = 0) -> tuple[list[int], list[str], bool]:
        """(ids ending in EOS, pieces, truncated) of a normalized line; cut to max_positions."""
        limit = self.max_positions - 1  # + EOS = max_positions source positions
        # Only the words that can reach the first `limit` pieces are encoded: no piece spans a
        # space and each word is one piece at least, so the first limit + 1 words give the same
        # first pieces as the whole line (a line of megabytes, binary junk in a corpus, was
        # encoded whole: seconds and hundreds of MB an actor). A word of more than
        # MAX_WORD_CHARS characters is junk, cut there.
        words = line.split(" ", limit + 1)  # (spaces only: the model keeps a no-break space
        words = [w for w in words[:-1] if w] + words[-1:]  # or a tab as a character)
        junk = any(len(w) > MAX_WORD_CHARS for w in words[:limit + 1])
        more = len(words) > limit + 1 or junk
        if more:
            line = " ".join(w[:MAX_WORD_CHARS] for w in words[:limit + 1])
        pieces = self.codec.encode(line)
        truncated = len(pieces) > limit or junk
        if truncated:
            log.warning("line %d has %s%d pieces, more than the model's %d positions: cut to "
                        "the first %d", index + 1, "more than " if more else "",
                        len(pieces) + (0 if more else 1), self.max_positions, limit)
            pieces = pieces[:limit]
        return self.codec.source_ids(pieces) + [EOS], pieces, truncated

    # --- translation ---------------------------------------------------------------------------

    def translate(self, lines: Iterable[str], search: SearchConfig | None = None) -> list[str]:
        """Best detokenized translation of each line, in input order."""
        return [t.text for t in self.translate_full(lines, search, attention=False)]

    def source_lengths(self, lines: Iterable[str]) -> list[int]:
        """Per line the source positions a search of it holds (its pieces, cut to the model's
        positions, + EOS); 0 for an empty line: what a request's cost is measured by before
        it is searched (convs2s.serving.requests.check_work)."""
        out = []
        for line in lines:
            src = normalize(line)
            out.append(min(len(self.codec.encode(src)), self.max_positions - 1) + 1 if src
                       else 0)
        return out

    def translate_full(self, lines: Iterable[str], search: SearchConfig | None = None,
                       attention: bool = True, first_line: int = 0) -> list[Translation]:
        """Per line a Translation with `search.nbest` hypotheses (none for an empty line).
        `search` replaces the loaded settings for this call only (a served request's beam,
        nbest, lenpen): its precision and vocabulary selection must be the loaded ones, which
        are properties of the weights and tables already in memory. `attention=False`: the
        hypotheses carry no attention (None; the same translations), and the search holds none
        (batch x beam x steps x source floats), unless replace_unk needs it. `first_line`:
        how many lines of the input came before `lines` (a warning names a cut line by its
        number in the input)."""
        s = self.search if search is None else search
        if (s.precision, s.shortlist) != (self.search.precision, self.search.shortlist):
            raise ValueError("precision and shortlist are chosen when the model is loaded "
                             f"({self.search.precision}, {self.search.shortlist}); a call may "
                             "change the search settings only")
        if s.dictionary != self.search.dictionary:
            raise ValueError("the replace-unk dictionary is chosen when the model is loaded")
        sources = [normalize(line) for line in lines]
        out: list[Translation | None] = [None] * len(sources)
        todo = []  # (line index, source ids)
        for i, src in enumerate(sources):
            if not src:
                out[i] = Translation(source="", src_pieces=[], hypotheses=[])
                continue
            ids, pieces, truncated = self.encode(src, first_line + i)
            out[i] = Translation(source=src, src_pieces=pieces, hypotheses=[],
                                 truncated=truncated)
            todo.append((i, ids))
        # Longest first: similar lengths share a batch (little padding), and the largest
        # batch runs first so an out-of-memory error shows at once.
        todo.sort(key=lambda x: -len(x[1]))
        for chunk in batches_by_budget(todo, s.max_sentences, s.max_tokens):
            for (i, _), hyps in zip(chunk, self._search([ids for _, ids in chunk], s,
                                                         attention or s.replace_unk)):
                out[i].hypotheses = [self._hypothesis(h, out[i], s, attention) for h in hyps]
        unscored = sorted(first_line + i + 1 for i, _ in todo if out[i].untranslated)
        if unscored:  # (its line is empty, or its text has words the model gave no chance)
            log.warning("line%s %s%s: no finite translation: the model's log-probabilities "
                        "are not finite (NaN or infinite: damaged weights, or an overflow%s)",
                        "s" if len(unscored) > 1 else "", ", ".join(map(str, unscored[:10])),
                        ", ..." if len(unscored) > 10 else "",
                        f" in {self.search.precision}" if self.search.precision != "fp32"
                        else "")
        return out  # type: ignore[return-value]

    def _search(self, batch: list[list[int]], s: SearchConfig,
                attention: bool = True) -> list[list[dict]]:
        S = max(len(ids) for ids in batch)
        src = torch.full((len(batch), S), PAD, dtype=torch.long)  # B x S, right-padded
        for b, ids in enumerate(batch):
            src[b, : len(ids)] = torch.tensor(ids)
        lengths = torch.tensor([len(ids) for ids in batch])
        vocab = None if self.shortlist is None else self.shortlist.for_batch(
            src, s.shortlist_frequent, s.shortlist_per_source or None)
        return generate(self.models, src.to(self.device), lengths.to(self.device),
                        beam_size=s.beam, max_len_a=s.max_len_a, max_len_b=s.max_len_b,
                        min_len=s.min_len, lenpen=s.lenpen, unk_penalty=s.unk_penalty,
                        nbest=s.nbest, vocab=vocab, attention=attention)

    def _hypothesis(self, h: dict, tr: Translation, s: SearchConfig,
                    attention: bool) -> Hypothesis:
        tokens = h["tokens"].tolist()
        ids = tokens[:-1] if tokens and tokens[-1] == EOS else tokens
        if s.replace_unk and UNK in ids:
            text = self._replace_unk(ids, tr, h["attention"])
        else:
            text = self.codec.decode(ids)
        # Byte pieces can spell line breaks or control characters: clean them as the training
        # text was cleaned, so that one translation is always one output line.
        text = normalize(text)
        return Hypothesis(text=text, score=h["score"], tokens=tokens,
                          positional_scores=h["positional_scores"].tolist(),
                          attention=h["attention"] if attention else None)

    def _replace_unk(self, ids: list[int], tr: Translation, attention: torch.Tensor) -> str:
        """Each <unk> becomes its most attended source piece, with the codec's word marks (a
        whole source word: that word, looked up in the dictionary, else copied; paper §4.3,
        Jean et al. 2015; `convs2s.inference.unk_replace`)."""
        return unk_replaced_text(self.codec, ids, tr.source, tr.src_pieces, attention,
                                 self.dictionary)


def format_translation(tr: Translation, index: int, nbest: int, verbose: bool) -> str:
    """One input's output lines. Plain: `nbest` lines (empty lines pad missing hypotheses).
    Verbose: S-/H-/P-/A- lines (the module docstring)."""
    if not verbose:
        texts = [h.text for h in tr.hypotheses[:nbest]]
        return "\n".join(texts + [""] * (nbest - len(texts))) + "\n"
    lines = [f"S-{index}\t{tr.source}"]
    for h in tr.hypotheses[:nbest]:
        lines.append(f"H-{index}\t{h.score:.4f}\t{h.text}")
        lines.append(f"P-{index}\t" + " ".join(f"{p:.4f}" for p in h.positional_scores))
        lines.append(f"A-{index}\t" + " ".join(f"{s}-{t}" for s, t in h.alignment()))
    return "\n".join(lines) + "\n"
