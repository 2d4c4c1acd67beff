"""Per-task preprocessing settings (`PreprocessConfig`) and the paper's tasks as presets.

Presets are plain functions returning a config; `PRESETS` maps names for the command line.

    from preprocessing.config import wmt14_en_fr
    cfg = wmt14_en_fr().replace(source="/data/wmt14", root="/shared/prep")

Sources (`source`): "hub" (the Hugging Face parquet files of `hub_repo`), "demo" (the embedded
synthetic corpus, the default; `with_demo_source(cfg)` swaps a task's config to it with the
demo's own settings) or a local folder. `splits` maps our split names (`train`,
`valid`, one or more test splits) to the source's names: hub split names ("validation"), local
file stems ("newstest2013" -> newstest2013.en / newstest2013.fr, .tsv, .jsonl, parquet), or
two comma-separated files ("article.txt,title.txt").
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

WMT_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


EXCHANGES = ("files", "ray")  # how rows meet by window / bucket (preprocessing/exchange.py)

# The columns the reader adds to each row beside the two sides (preprocessing/reading.py)
ROW_COLUMNS = ("id", "error")
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]*")

@dataclass(frozen=True)
class PreprocessConfig:
    """Everything that decides a task's preprocessing output (docs/reference.md, Data)."""

    task: str  # the task's name: its output folder <root>/<task>/ (not a task *kind*)
    source: str = "demo"  # "demo" | "hub" | a local folder
    src_lang: str = "en"  # key in the hub row's "translation" dict / local file suffix
    tgt_lang: str = "fr"
    # "translation": rows {"translation": {src_lang: ..., tgt_lang: ...}} (WMT);
    # "columns": rows {src_lang: ..., tgt_lang: ...}, e.g. Gigaword's document / summary.
    row_shape: str = "translation"
    splits: dict[str, str] = field(default_factory=lambda: dict(WMT_SPLITS))
    hub_repo: str = "wmt/wmt14"
    hub_config: str = "fr-en"  # parquet folder in the hub repo
    hub_revision: str = "main"
    demo_rows: dict[str, int] = field(
        default_factory=lambda: {"train": 20_000, "valid": 500, "test": 500})
    # Filters (paper §4.1: drop sentences over 175 words, pairs with length ratio over 1.5).
    max_len: int | None = 175  # words per side; None = no limit
    max_len_ratio: float | None = 1.5  # None = off (summarization)
    dedupe: bool = False  # drop exact duplicate training pairs (keep the lowest row id)
    max_line_bytes: int = 1 << 16  # longer input lines are dropped as garbage, never held whole
    # Whole words replaced in every split, both sides, after cleaning: a corpus that spells
    # one thing two ways (Gigaword's test split writes an unknown word `UNK`, its training
    # data `<unk>`: {"UNK": "<unk>"}). Empty: no replacement.
    token_map: dict[str, str] = field(default_factory=dict)
    # Joint BPE (sentencepiece), learned once on a seeded uniform sample of training pairs.
    vocab_size: int = 40_000
    spm_sample_pairs: int = 1_000_000  # both sides of each sampled pair go into training
    spm_seed: int = 1
    character_coverage: float = 0.9999  # the rest is spelled in bytes (byte fallback)
    # Vocabulary selection's lexical table (preprocessing/lexical.py, the `shortlist` stage):
    # target candidates kept per source token; 0: no table. Counted on at most
    # shortlist_sample_pairs training pairs (every n-th pair).
    shortlist_per_source: int = 0
    shortlist_sample_pairs: int = 2_000_000
    # Token-budget batches: n_sentences * max(src_len, tgt_len) <= max_tokens.
    max_tokens: int = 4000
    max_sentences: int | None = 1024
    # Sentences with a side of more pieces (EOS included) than the model's positions are
    # dropped (counted, over_max_positions) when this is set: the workflows set it from the
    # model (ModelConfig.max_positions). None: no limit (the trainer refuses such data).
    max_positions: int | None = None
    shuffle_window: int = 200_000  # rows sorted by length inside windows of about this size
    seed: int = 1
    root: str = "data/preprocessed"
    block_rows: int = 50_000  # rows per block read from a source = rows per clean part
    encode_tasks: int = 0  # encoder tasks at a time; 0 = as many as Ray's CPUs
    # How dedupe buckets, batching windows and the lexical table's pair counts gather rows from
    # the whole split (exchange.py): "files" (spill files, bounded memory) or "ray" (Ray Data's
    # groupby shuffle). Same output.
    exchange: str = "files"

    def __post_init__(self) -> None:
        if "train" not in self.splits:
            raise ValueError(f"splits must include 'train', got {sorted(self.splits)}")
        # A split's name is a folder's (clean/<split>, encoded/<split>) and a file's (the
        # evaluation text): "../x" or "." named a folder outside its stage, which publishing
        # the stage replaced, deleting what was there
        bad = [name for name in self.splits if not isinstance(name, str)
               or not _SPLIT_NAME.fullmatch(name) or name in (".", "..")]
        if bad:
            raise ValueError(f"split names are letters, digits, '_', '-', '.' and spaces (no "
                             f"path), beginning with a letter or digit; got {bad!r}")
        # The task names its output folder <root>/<task>/: a path ("/tmp/x", "../x") would put
        # the data outside --storage-path (data.root is refused for that reason)
        if not isinstance(self.task, str) or not _SPLIT_NAME.fullmatch(self.task) \
                or self.task in (".", ".."):
            raise ValueError(f"task names a folder under the storage path: letters, digits, "
                             f"'_', '-', '.' and spaces (no path); got {self.task!r}")
        if self.row_shape not in ("translation", "columns"):
            raise ValueError(f"row_shape must be 'translation' or 'columns', got {self.row_shape}")
        # Rows of the columns shape hold each side in a column named after its language, beside
        # the reader's own columns: a side named like one would overwrite it
        clash = [lang for lang in (self.src_lang, self.tgt_lang) if lang in ROW_COLUMNS]
        if self.row_shape == "columns" and clash:
            raise ValueError(f"a side named {clash[0]!r} is a column of the rows themselves "
                             f"({', '.join(ROW_COLUMNS)}) in the columns row shape: read it "
                             "with row_shape 'translation' (local files: --set "
                             "data.row_shape=translation)")
        if self.src_lang == self.tgt_lang:
            raise ValueError("src_lang and tgt_lang must differ (they name the two sides)")
        if self.max_len_ratio is not None and not self.max_len_ratio >= 1.0:  # (NaN too: it
            # compared false with every ratio, and the filter was off without a word)
            raise ValueError(f"max_len_ratio must be >= 1 or None, got {self.max_len_ratio}")
        if self.max_len is not None and not self.max_len >= 1:  # (every row was too_long,
            raise ValueError(f"max_len must be >= 1 word or None, got {self.max_len}")  # late)
        if not 0.0 < self.character_coverage <= 1.0:  # (NaN too)
            raise ValueError(f"character_coverage must be in (0, 1], got "
                             f"{self.character_coverage}")
        if self.max_tokens < 1 or (self.max_sentences is not None and self.max_sentences < 1):
            raise ValueError("max_tokens and max_sentences must be positive")
        if self.max_positions is not None and self.max_positions < 2:
            raise ValueError(f"max_positions must be >= 2 (a piece and EOS) or None, got "
                             f"{self.max_positions}")
        if not isinstance(self.token_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k.split() == [k]
                and v.split() == [v] for k, v in self.token_map.items()):
            raise ValueError(f"token_map maps whole words to whole words (no spaces), e.g. "
                             f"{{'UNK': '<unk>'}}; got {self.token_map!r}")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {self.exchange!r}")
        if self.shortlist_per_source < 0 or self.shortlist_sample_pairs < 1:
            raise ValueError("shortlist_per_source must be >= 0 (0: no lexical table) and "
                             "shortlist_sample_pairs >= 1")
        if self.vocab_size < 300:  # 4 specials + 256 byte pieces + a few merges
            raise ValueError(f"vocab_size {self.vocab_size} too small; use at least 300")
        for name in ("seed", "spm_seed"):  # (numpy's generators take no negative seed: it
            value = getattr(self, name)  # failed in the batches stage, hours in, naming none)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("block_rows", "shuffle_window", "spm_sample_pairs", "max_line_bytes"):
            value = getattr(self, name)  # (0 reached the batches stage as a ZeroDivisionError)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def eval_splits(self) -> list[str]:
        """Every split but train: exported as text for scoring."""
        return [s for s in self.splits if s != "train"]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "PreprocessConfig":
        return dataclasses.replace(self, **changes)


# --- presets (docs/reference.md, Data) ------------------------------------------------------------


def wmt14_en_fr() -> PreprocessConfig:
    """WMT'14 En-Fr: 40.8M pairs on the hub (the paper's "full training set" is 36M, §4.1:
    another release of the same corpora); 175 words and ratio 1.5 (paper §4.1); joint BPE 40k."""
    return PreprocessConfig(task="wmt14_en_fr", source="hub", src_lang="en", tgt_lang="fr",
                            hub_repo="wmt/wmt14", hub_config="fr-en")


def wmt14_en_de() -> PreprocessConfig:
    """WMT'14 En-De: 4.5M pairs; the En-Fr filters (the paper gives none for En-De, §4.1; the
    reference's data script cleans at ratio 1.5 and 250 BPE pieces after BPE)."""
    return PreprocessConfig(task="wmt14_en_de", source="hub", src_lang="en", tgt_lang="de",
                            hub_repo="wmt/wmt14", hub_config="de-en")


def wmt16_en_ro() -> PreprocessConfig:
    """WMT'16 En-Ro: 610k pairs (the paper's 2.8M include Sennrich et al.'s back-translations,
    §4.1); the paper only drops sentences over 175 words."""
    return PreprocessConfig(task="wmt16_en_ro", source="hub", src_lang="en", tgt_lang="ro",
                            hub_repo="wmt/wmt16", hub_config="ro-en", max_len_ratio=None)


def gigaword() -> PreprocessConfig:
    """Gigaword headlines (paper §4.1): 30k vocabulary, no ratio filter (documents >> titles).
    Its test split (Rush et al.'s 1,951 pairs) writes an unknown word `UNK` where the training
    data writes `<unk>` (one of its documents: "japan 's nec corp. and UNK computer corp. ..."): one
    spelling for all splits, the training data's.

    Read from the hub's parquet conversion: the dataset itself is a loading script.
    """
    return PreprocessConfig(task="gigaword", source="hub", src_lang="document",
                            tgt_lang="summary", row_shape="columns",
                            hub_repo="Harvard/gigaword", hub_config="default",
                            hub_revision="refs/convert/parquet", max_len_ratio=None,
                            vocab_size=30_000, token_map={"UNK": "<unk>"})


def multi30k_en_de() -> PreprocessConfig:
    """Multi30k (WMT'16 multimodal task 1, text only): 29,000 short caption pairs.

    The hub copy is `bentrevett/multi30k` (En-De; columns `en` / `de`), read from its parquet
    conversion. Captions are short and clean: no length-ratio filter (one-word differences are
    large ratios at five words). Joint BPE over all of train with full character coverage.
    """
    return PreprocessConfig(task="multi30k_en_de", source="hub", src_lang="en", tgt_lang="de",
                            row_shape="columns", hub_repo="bentrevett/multi30k",
                            hub_config="default", hub_revision="refs/convert/parquet",
                            max_len_ratio=None, vocab_size=8000, spm_sample_pairs=29_000,
                            character_coverage=1.0, max_tokens=4000, shuffle_window=29_000,
                            block_rows=10_000)


def translation() -> PreprocessConfig:
    """Any language pair (workflows/translation.py): the paper's filters (175 words, length
    ratio 1.5) and a joint BPE; the languages and the data come from the command line
    (`--src`, `--tgt`, `--data DIR` with `--split`, or `--data hub` with --set data.hub_*)."""
    return PreprocessConfig(task="translation", source="hub", src_lang="en", tgt_lang="fr",
                            vocab_size=8000, spm_sample_pairs=200_000, max_tokens=4000,
                            shuffle_window=50_000, block_rows=10_000)


def demo() -> PreprocessConfig:
    """Smoke run on the embedded synthetic En->Fr corpus: small vocabulary, small windows."""
    return PreprocessConfig(task="demo", source="demo", vocab_size=1000, spm_sample_pairs=20_000,
                            max_tokens=2000, shuffle_window=5_000, block_rows=5_000)


def demo_summarization() -> PreprocessConfig:
    """Smoke run on the embedded synthetic document -> summary corpus."""
    return demo().replace(task="demo_summarization", src_lang="document", tgt_lang="summary",
                          row_shape="columns", max_len_ratio=None)


def with_demo_source(cfg: PreprocessConfig, task: str = "translation") -> PreprocessConfig:
    """`cfg` with the embedded demo corpus as its source (a workflow's `--data demo`).

    The demo corpus brings what describes its data and what is sized to it: its languages
    (en -> fr, or document -> summary for task "summarization"), row shape, rows per split
    (`demo_rows`), filters and small-corpus recipe (1k BPE vocabulary, 2000-token batches, small
    windows and blocks), all from `demo()` / `demo_summarization()`. Where and how `cfg` runs is
    kept: `root`, `encode_tasks`, `exchange`.
    """
    base = demo_summarization() if task == "summarization" else demo()
    return base.replace(root=cfg.root, encode_tasks=cfg.encode_tasks, exchange=cfg.exchange)


PRESETS = {
    "wmt14_en_fr": wmt14_en_fr,
    "wmt14_en_de": wmt14_en_de,
    "wmt16_en_ro": wmt16_en_ro,
    "gigaword": gigaword,
    "multi30k_en_de": multi30k_en_de,
    "translation": translation,
    "demo": demo,
    "demo_summarization": demo_summarization,
}
