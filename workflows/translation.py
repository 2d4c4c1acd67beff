"""Any language pair with ConvS2S: a folder of line-aligned files (or a hub dataset) in, a
trained, scored and registered translation model out, no Python to write.

    python workflows/translation.py --preset cpu --src fr --tgt en \\
        --data ../shared/data/news-commentary-5k --split 'train=nc-5k[:4500]' \\
        --split 'valid=nc-5k[4500:4750]' --split 'test=nc-5k[4750:]' --max-time 20m
    python workflows/translation.py --preset gpu --src de --tgt en --data /data/de-en \\
        --split valid=newstest2013 --split test=newstest2014 --num-workers 8

--src / --tgt name the languages (the files' suffixes: STEM.<src>, STEM.<tgt>, optionally .gz;
or .tsv / .jsonl / parquet); --split SPLIT=STEM names the files of train, valid and test
(default: train, valid, test), and STEM[a:b] cuts one corpus into splits by lines. The run is
the experiment `translation_<src>_<tgt>`, its best model registered as
`models:/translation_<src>_<tgt>-<test set>@champion`, each evaluation set named after its file
(`test`, `newstest2014`, `nc-5k_4750-end` for nc-5k[4750:]). Presets:

- cpu: the `small` model (3 + 3 layers of 128) with the Multi30k CPU recipe's training (Adam
  3e-3, warmup, a cosine decay over the time budget, 60 minutes by default; dropout 0.3, or 0.4
  where the budget would pass over the data 30 times or more: `train.dropout_by_passes`, which
  `--set model.dropout=...` turns off), one worker, batches of 4,000 tokens on every host;
- gpu: the WMT'14 En-De paper preset's model and recipe (the reference's: NAG, lr 0.5, 4,000
  tokens per GPU), a 40k joint BPE, one GPU (--num-workers N --use-gpu for more);
- smoke: the embedded demo corpus (English -> French), minutes.

Without --data, cpu and gpu read the hub's wmt/wmt14 fr-en (English -> French; --src fr --tgt
en for the other direction); --data DIR reads your files.

Any other setting with --set (model.*, train.*, data.*, search.*), e.g. --set
data.vocab_size=16000 --set model.dropout=0.3; --dry-run shows the resolved run.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from convs2s import config as models
from convs2s.config import TrainConfig
from preprocessing import config as data
from workflows import multi30k_en_de, wmt14_en_de
from workflows.orchestrate import main
from workflows.workflow_config import EnsembleConfig, WorkflowConfig


def gpu() -> WorkflowConfig:
    """The WMT'14 En-De paper preset's model and recipe (the reference's;
    `workflows/wmt14_en_de.py`, `paper`) on any pair: a 40k joint BPE, the paper's filters, one
    GPU."""
    return wmt14_en_de.paper().replace(
        name="translation_{src}_{tgt}",  # the languages the run resolves to
        preprocess=data.translation().replace(vocab_size=40_000, spm_sample_pairs=1_000_000),
        test_sets={"test": "test", "valid": "valid"},
        local_splits={"train": "train", "valid": "valid", "test": "test"})


def cpu() -> WorkflowConfig:
    """The `small` model with the 60-minute CPU recipe of `workflows/multi30k_en_de.py`
    (`cpu`, chosen on Multi30k's validation set; docs/benchmarks.md), one worker: its
    optimizer, schedule and dropout by the passes the budget reaches, not its float32 batch
    size (float32_cpu_max_tokens, measured on Multi30k only)."""
    recipe = multi30k_en_de.cpu()
    return gpu().replace(
        preprocess=data.translation(),  # joint BPE 8k, 4,000 tokens
        model=models.small().replace(dropout=0.3), train=recipe.train,
        ensemble=recipe.ensemble, use_gpu=False, num_workers=recipe.num_workers,
        cpus_per_worker=recipe.cpus_per_worker, update_tokens=0)


def smoke() -> WorkflowConfig:
    """The embedded demo corpus (English -> French) and the `small` model, minutes."""
    return cpu().replace(data="demo", train=TrainConfig(max_epochs=2, log_interval=50,
                                                        keep_last=2),
                         ensemble=EnsembleConfig(runs=1, average_last=2))


# The presets `--preset` chooses from (default smoke); workflows.catalog finds this file by them.
PRESETS = {"cpu": cpu, "gpu": gpu, "smoke": smoke}


if __name__ == "__main__":
    sys.exit(main(PRESETS, __doc__))
