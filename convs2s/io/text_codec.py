"""Text <-> token ids for a checkpoint: this project's sentencepiece model, or the text pipeline
of the reference implementation's published models (Moses tokenization, subword-nmt BPE with
`@@ ` continuation marks, one dictionary per language, Moses detokenization).

A checkpoint directory says which one it needs: `sentencepiece.model` beside `checkpoint.pt`
(trained here), or `text.json` + `bpecodes` + `dict.<src>.txt` / `dict.<tgt>.txt`
(imported with `python -m convs2s import-fairseq`).

    codec = codec_for_checkpoint("runs/imported/en-fr")
    pieces = codec.encode("Hello world!")            # ['Hello', 'world', '!'] (BPE pieces)
    ids = codec.source_ids(pieces)                   # source dictionary ids (no EOS)
    codec.decode([ids...])                           # detokenized target text

Both keep the special ids of docs/design.md (<s> 0, <pad> 1, </s> 2, <unk> 3).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from convs2s.config import BOS, EOS, PAD, UNK
from storage import local_copy, location

SENTENCEPIECE = "sentencepiece"
MAX_DICTIONARY_BYTES = 64 << 20  # a reference dictionary: ~1 MB for 40k symbols
MOSES_BPE = "moses+subword_nmt"
TEXT_FILE = "text.json"
SPM_FILE = "sentencepiece.model"
CHECKPOINT_FILE = "checkpoint.pt"  # (convs2s.io.checkpoint's: a checkpoint given as its file)
BPE_CODES = "bpecodes"
BPE_CACHE_WORDS = 200_000  # words subword-nmt's split cache holds before it is emptied
UNK_PIECE = "<unk>"


class CodecError(ValueError):
    """A checkpoint's text files are missing or do not fit its model."""


def checkpoint_folder(path: str | Path) -> Path:
    """The folder of a local checkpoint given as its folder or as a file in it (its
    checkpoint.pt): the folder whose meta.json and text pipeline go with the weights."""
    path = Path(path)
    return path if path.is_dir() else path.parent


def local_checkpoint(p) -> Path:
    """A checkpoint given as its folder or its checkpoint.pt, as a local path of the same kind
    (`storage.local_copy`: itself when local). A bucket's checkpoint.pt is fetched with its
    folder: alone, it would lie in a cache folder without its meta.json and text pipeline."""
    where = location(p)
    if not isinstance(where, Path) and where.name == CHECKPOINT_FILE:
        return local_copy(where.parent) / CHECKPOINT_FILE
    return local_copy(where)


def checkpoint_weights(p):
    """The weights file that `local_checkpoint` (and so `load_for_inference`) reads of a
    checkpoint given as its folder or its checkpoint.pt, named where it is, not fetched: for
    checks and version stamps before anything loads. A local path is a folder when it is one
    (its checkpoint.pt), else the file itself; a bucket's is its checkpoint.pt when named so,
    else a folder."""
    where = location(p)
    if isinstance(where, Path):
        return where / CHECKPOINT_FILE if where.is_dir() else where
    return where if where.name == CHECKPOINT_FILE else where / CHECKPOINT_FILE


def codec_settings(kind: str, source_lang: str, target_lang: str) -> dict:
    """The contents of a checkpoint's text.json."""
    return {"tokenizer": "moses" if kind == MOSES_BPE else kind,
            "bpe": "subword_nmt" if kind == MOSES_BPE else kind, "kind": kind,
            "source_lang": source_lang, "target_lang": target_lang,
            "bpe_codes": BPE_CODES, "source_dict": f"dict.{source_lang}.txt",
            "target_dict": f"dict.{target_lang}.txt"}


def read_codec_settings(checkpoint_dir: str | Path) -> dict | None:
    """The checkpoint's text.json, or None (a sentencepiece checkpoint); a checkpoint.pt's
    is its folder's."""
    path = checkpoint_folder(checkpoint_dir) / TEXT_FILE
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CodecError(f"{path} is not readable JSON ({err}); import the model again") from None
    if not isinstance(settings, dict):
        raise CodecError(f"{path} holds a JSON {type(settings).__name__}, not the text "
                         "pipeline's settings (an object); import the model again")
    if settings.get("kind") != MOSES_BPE:
        raise CodecError(f"{path}: unknown text pipeline {settings.get('kind')!r} "
                         f"(this project knows {SENTENCEPIECE!r} and {MOSES_BPE!r})")
    for key in ("bpe_codes", "source_dict", "target_dict"):
        name = settings.get(key)
        # Files beside text.json only: a path out of the folder would be read, staged with
        # the weights and uploaded as an MLflow artifact.
        if not isinstance(name, str) or not name or name in (".", "..") \
                or any(c in name for c in "/\\") or name.startswith("~"):
            raise CodecError(f"{path}: {key} = {name!r} must name a file in the checkpoint's "
                             "own folder (no path); import the model again")
    for key in ("source_lang", "target_lang"):  # (Moses' tokenizer and detokenizer languages)
        if not isinstance(settings.get(key), str) or not settings[key]:
            raise CodecError(f"{path}: {key} = {settings.get(key)!r} must be a language code "
                             "(en, de, ...); import the model again")
    return settings


class SentencePieceCodec:
    """One joint sentencepiece model for both sides (this project's training)."""

    kind = SENTENCEPIECE

    def __init__(self, sp, name: str = SPM_FILE):
        ids = (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id())
        if ids != (BOS, PAD, EOS, UNK):
            raise CodecError(f"{name}: special ids (bos, pad, eos, unk) = {ids}, expected "
                             f"{(BOS, PAD, EOS, UNK)} (docs/design.md)")
        self.sp = sp
        self.src_size = self.tgt_size = sp.get_piece_size()

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> "SentencePieceCodec":
        import sentencepiece as spm

        try:
            sp = spm.SentencePieceProcessor(model_proto=data)
        except Exception as err:  # noqa: BLE001 - sentencepiece raises RuntimeError / OSError
            raise CodecError(f"{name} is not a readable sentencepiece model ({err}); copy "
                             "the run's spm/spm.model again") from None
        return cls(sp, name)

    def encode(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

    def ids(self, lines: list[str], side: str) -> list[list[int]]:
        """Token ids (no EOS) of raw lines of either side (one joint model)."""
        return self.sp.encode(lines, out_type=int, num_threads=1)

    def source_ids(self, pieces: list[str]) -> list[int]:
        return [self.sp.piece_to_id(p) for p in pieces]

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)

    def target_piece(self, i: int) -> str:
        return UNK_PIECE if i == UNK else self.sp.id_to_piece(i)

    def source_words(self, source: str, pieces: list[str]) -> list[str | None]:
        """Per piece, the word of `source` it spells alone (it opens that word, U+2581, and the
        next piece opens another), or None for a piece of a longer word (unk replacement). A
        bare U+2581 (sentencepiece's split of a rare word: the mark, then its characters)
        stands for the word it opens: an unk attending it copies that word, not a space."""
        words = source.split(" ")
        out, w = [], -1
        for k, piece in enumerate(pieces):
            w += piece.startswith("\u2581")
            alone = piece == "\u2581" or piece.startswith("\u2581") and (
                k + 1 == len(pieces) or pieces[k + 1].startswith("\u2581"))
            out.append(words[min(max(w, 0), len(words) - 1)] if alone else None)
        return out

    def word_piece(self, word: str) -> str:
        """The piece that stands for `word` as a whole word: it opens a word."""
        return "\u2581" + word

    def byte_characters(self, pieces: list[str]) -> list[tuple[int, int] | None]:
        """Per piece, for a byte piece (`<0xC3>`, sentencepiece's byte fallback), the span
        [a, b) of the pieces that hold the bytes of its UTF-8 character; None for any other
        (unk replacement copies a whole character, not one of its bytes)."""
        out: list[tuple[int, int] | None] = [None] * len(pieces)
        values = [_byte_value(p) for p in pieces]
        k = 0
        while k < len(pieces):
            if values[k] is None:
                k += 1
                continue
            lead = values[k]  # the length its lead byte announces (1 for a stray byte)
            n = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else \
                4 if 0xF0 <= lead < 0xF8 else 1
            end = k + 1
            while end < min(k + n, len(pieces)) and values[end] is not None and \
                    0x80 <= values[end] < 0xC0:  # continuation bytes
                end += 1
            for i in range(k, end):
                out[i] = (k, end)
            k = end
        return out

    def join_with_words(self, ids: list[int], replaced: list[str]) -> str:
        """Decode `ids` with each <unk> replaced by its piece from `replaced` (unk replacement:
        a source piece, U+2581 opening a word): a piece of the vocabulary (byte pieces too)
        decodes with its neighbours, as does a run of byte pieces (`<0xC3><0xBC>`: a whole
        character); an empty one adds nothing; any other is spliced in as text."""
        parts, run = [], []

        def flush():
            if run:
                opens_word = self.sp.id_to_piece(run[0]).startswith("\u2581")
                parts.append((" " if opens_word else "") + self.sp.decode(run))
                run.clear()

        for i, piece in zip(ids, replaced):
            if i == UNK:
                if not piece:
                    continue
                if _BYTES.fullmatch(piece):  # the bytes of a character, one piece each
                    run.extend(self.sp.piece_to_id(b) for b in byte_pieces(piece))
                    continue
                i = self.sp.piece_to_id(piece)  # (UNK for a piece it does not know)
                if i == UNK:
                    flush()
                    parts.append(piece.replace("\u2581", " "))
                    continue
            run.append(i)
        flush()
        return "".join(parts).strip(" ")


_BYTE = re.compile(r"<0x[0-9A-F]{2}>")  # a byte piece of sentencepiece's byte fallback
_BYTES = re.compile(r"(?:<0x[0-9A-F]{2}>)+")


def _byte_value(piece: str) -> int | None:
    return int(piece[3:5], 16) if _BYTE.fullmatch(piece) else None


def byte_pieces(run: str) -> list[str]:
    """`<0xC3><0xBC>` (a character's bytes, as unk replacement copies them) as its pieces."""
    return _BYTE.findall(run)


class MosesBpeCodec:
    """The reference's text pipeline: Moses tokenization (sacremoses, with the language's
    rules, aggressive dash splits, HTML escaping as the reference's hub does), subword-nmt
    BPE with the archive's codes, a dictionary per language; output pieces joined, `@@ `
    removed, then Moses detokenization."""

    kind = MOSES_BPE

    def __init__(self, folder: str | Path, settings: dict):
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        folder = Path(folder)
        self.settings = settings
        codes = folder / settings.get("bpe_codes", BPE_CODES)
        if not codes.is_file():
            raise CodecError(f"{codes} is missing: the subword-nmt codes of the model "
                             "(import the archive again)")
        try:
            with open(codes, encoding="utf-8") as f:
                self.bpe = BPE(f, separator="@@")
        except (SystemExit, ValueError, UnicodeDecodeError) as err:  # subword-nmt exits on a
            # line it cannot read (after printing it): in a Serve replica or a corpus actor
            # that would end the process, naming neither the file nor the fix
            raise CodecError(f"{codes} is not a subword-nmt codes file ({type(err).__name__}"
                             f"{': ' + str(err)[:200] if str(err) else ''}); import the "
                             "archive again") from None
        self.src_symbols = read_dictionary(folder / settings["source_dict"])
        self.tgt_symbols = read_dictionary(folder / settings["target_dict"])
        # (a symbol given again, with the reference's overwrite flag, is its later id)
        self.src_index = {s: i for i, s in enumerate(self.src_symbols)}
        self.src_size, self.tgt_size = len(self.src_symbols), len(self.tgt_symbols)
        self.tok = MosesTokenizer(settings["source_lang"])
        self.detok = MosesDetokenizer(settings["target_lang"])
        self._tgt = None  # the target side's tokenizer and dictionary index, made when needed

    def encode(self, line: str) -> list[str]:
        return self._pieces(self.tok, line)

    def _pieces(self, tok, line: str) -> list[str]:
        tokens = tok.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
        if len(self.bpe.cache) > BPE_CACHE_WORDS:
            # subword-nmt keeps every word it has split, for good: a server's replica or a
            # corpus actor meeting ever new words (random tokens, a web crawl) grew without end
            self.bpe.cache.clear()
        return self.bpe.process_line(tokens).split()

    def ids(self, lines: list[str], side: str) -> list[list[int]]:
        """Token ids (no EOS) of raw lines of the source (`side` "src") or target language
        ("tgt"), each side tokenized with its language's rules and looked up in its own
        dictionary: training data for a model that keeps these dictionaries (fine-tuning)."""
        if side == "src":
            return [self.source_ids(self._pieces(self.tok, line)) for line in lines]
        if self._tgt is None:
            from sacremoses import MosesTokenizer

            index = {s: i for i, s in enumerate(self.tgt_symbols)}
            self._tgt = (MosesTokenizer(self.settings["target_lang"]), index)
        tok, index = self._tgt
        return [[index.get(p, UNK) for p in self._pieces(tok, line)] for line in lines]

    def source_ids(self, pieces: list[str]) -> list[int]:
        return [self.src_index.get(p, UNK) for p in pieces]

    def target_piece(self, i: int) -> str:
        return self.tgt_symbols[i] if 0 <= i < self.tgt_size else UNK_PIECE

    def decode(self, ids: list[int]) -> str:
        return self._detokenize([self.target_piece(i) for i in ids])

    def _detokenize(self, pieces: list[str]) -> str:
        text = (" ".join(pieces) + " ").replace("@@ ", "").rstrip()
        return self.detok.detokenize(text.split())

    def source_words(self, source: str, pieces: list[str]) -> list[str | None]:
        """Per piece, the source word it spells alone (neither it nor the piece before it
        carries the `@@` continuation mark), or None for a piece of a longer word."""
        return [None if p.endswith("@@") or (k and pieces[k - 1].endswith("@@")) else p
                for k, p in enumerate(pieces)]

    def word_piece(self, word: str) -> str:
        """The piece that stands for `word` as a whole word: the word, no `@@`."""
        return word

    def byte_characters(self, pieces: list[str]) -> list[tuple[int, int] | None]:
        """No byte pieces in subword-nmt's BPE: None for every piece."""
        return [None] * len(pieces)

    def join_with_words(self, ids: list[int], replaced: list[str]) -> str:
        """Decode `ids` with each <unk> replaced by its piece from `replaced` (unk replacement:
        a source piece, `@@` joining it to the next one)."""
        return self._detokenize([piece if i == UNK else self.target_piece(i)
                                 for i, piece in zip(ids, replaced)])


def read_dictionary(path: Path) -> list[str]:
    """The symbols of a reference dictionary file in id order: <s> <pad> </s> <unk> (ids 0-3,
    the same as ours), then one `symbol count` line per id."""
    path = Path(path)
    if not path.is_file():
        raise CodecError(f"{path} is missing: the model's dictionary of that language "
                         "(dict.<lang>.txt)")
    size = path.stat().st_size
    if size > MAX_DICTIONARY_BYTES:
        raise CodecError(f"{path} has {size:,} bytes, more than a dictionary's "
                         f"{MAX_DICTIONARY_BYTES:,} (a million symbols); is it the right file?")
    symbols = ["<s>", "<pad>", "</s>", "<unk>"]
    assert (BOS, PAD, EOS, UNK) == (0, 1, 2, 3)
    try:
        with path.open(encoding="utf-8") as f:  # streamed, a line at a time
            lines = [line.rstrip("\n") for line in f]
    except UnicodeDecodeError as err:  # (the decoder's words alone named no file)
        raise CodecError(f"{path} is not UTF-8 text (byte {err.start:,} of a chunk: "
                         f"{err.object[err.start:err.end]!r}); the reference writes its "
                         "dictionaries in UTF-8: copy or download the file again") from None
    seen = set(symbols)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        # as the reference reads it (Dictionary.add_from_file): the symbol is all before the
        # last field, which is the count, or the overwrite flag after the count; a symbol
        # given again needs that flag, and then has the later id (a new one)
        symbol, _, field = line.rstrip().rpartition(" ")
        overwrite = field == "#fairseq:overwrite"
        if overwrite:
            symbol, _, field = symbol.rpartition(" ")
        if not symbol or not field.lstrip("-").isdigit():
            raise CodecError(f"{path}:{n}: expected 'symbol count', got {line!r}")
        if symbol in seen and not overwrite:
            raise CodecError(f"{path}:{n}: {symbol!r} is given twice (the reference refuses "
                             "such a dictionary unless the line ends in #fairseq:overwrite)")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


def check_spm_model_fits(checkpoint_dir: str | Path, spm_model: str | Path) -> None:
    """A sentencepiece model given for a checkpoint (--spm-model) replaces only a
    sentencepiece pipeline: an imported model's ids are those of its dictionaries."""
    if read_codec_settings(checkpoint_dir) is not None:
        raise CodecError(f"{checkpoint_dir} is an imported model whose text pipeline is Moses "
                         f"+ subword-nmt BPE (its {TEXT_FILE}, dictionaries and bpecodes), not "
                         f"sentencepiece: leave out the sentencepiece model {spm_model} "
                         "(--spm-model)")


def codec_for_checkpoint(checkpoint_dir: str | Path, spm_model: str | Path | None = None):
    """The codec a checkpoint directory (or its checkpoint.pt: its folder's) needs (see the
    module docstring); `spm_model`: the sentencepiece model of a checkpoint that bundles none
    (refused for an imported one)."""
    folder = checkpoint_folder(checkpoint_dir)
    if spm_model is not None:
        check_spm_model_fits(folder, spm_model)
    settings = read_codec_settings(folder)
    if settings is not None:
        return MosesBpeCodec(folder, settings)
    spm = Path(spm_model) if spm_model else folder / SPM_FILE
    if not spm.is_file():
        raise CodecError(f"checkpoint {folder} has no sentencepiece.model beside "
                         "checkpoint.pt; copy the run's spm/spm.model there or give "
                         "the BPE model explicitly (--spm-model)")
    return SentencePieceCodec.from_bytes(spm.read_bytes(), str(spm))


def codec_files(checkpoint_dir: str | Path) -> list[Path]:
    """The files of a checkpoint's text pipeline (to copy with its weights); a checkpoint.pt's
    are its folder's."""
    folder = checkpoint_folder(checkpoint_dir)
    settings = read_codec_settings(folder)
    if settings is None:
        return [folder / SPM_FILE] if (folder / SPM_FILE).is_file() else []
    return [folder / TEXT_FILE, folder / settings["bpe_codes"], folder / settings["source_dict"],
            folder / settings["target_dict"]]


class CheckpointVocabulary:
    """A checkpoint's text pipeline as the vocabulary of new training data: fine-tuning keeps
    the model's token ids, so preprocessing encodes with the checkpoint's own sentencepiece
    model, or its Moses + subword-nmt pipeline and dictionaries, instead of learning a BPE.

    It is what `preprocessing.pipeline.run_pipeline(..., vocabulary=)` takes (the protocol is
    in preprocessing/encoding.py): plain attributes, so it pickles to the encoder actors, where
    `encoder()` builds the codec once.
    """

    def __init__(self, checkpoint_dir: str | Path):
        # A bucket's checkpoint: its local copy (fetched once per node) is what travels.
        folder = checkpoint_folder(local_checkpoint(checkpoint_dir))  # (file://: its local path)
        codec = codec_for_checkpoint(folder)  # the files exist and fit together
        self.folder = str(folder)
        self.kind = codec.kind
        self.src_size, self.tgt_size = codec.src_size, codec.tgt_size
        self.files = tuple(str(p) for p in codec_files(folder))  # they travel with the weights
        self.spm_model = str(folder / SPM_FILE) if codec.kind == SENTENCEPIECE else ""
        settings = read_codec_settings(folder)
        # (source, target) language of a Moses pipeline; None: sentencepiece knows no language
        self.languages = (settings["source_lang"], settings["target_lang"]) if settings else None
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes())
        self.fingerprint = digest.hexdigest()[:16]

    def encoder(self):
        """`encode(lines, side) -> ids` (no EOS) for side "src" or "tgt"."""
        return codec_for_checkpoint(self.folder).ids

    def __repr__(self) -> str:
        return f"CheckpointVocabulary({self.folder!r}, {self.kind}, {self.fingerprint})"
