"""WMT'14 English->French with ConvS2S (paper §5.1, Table 1: 40.51 BLEU single model).

Preprocess (175-word / 1.5-ratio filters, joint 40k BPE) -> train (reference fconv_wmt_en_fr
recipe) -> score newstest2014 with beam 5 as parallel Ray tasks (best checkpoint and the average
of the last 5), everything tracked under one MLflow parent run.

    python workflows/wmt14_en_fr.py --preset smoke                # demo corpus, CPU, < 10 min
    python workflows/wmt14_en_fr.py --preset paper --num-workers 8 --use-gpu \\
        --storage-path /mnt/efs/convs2s/ray_results --tracking-uri http://mlflow:5000
    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python workflows/wmt14_en_fr.py --preset smoke --storage-path /tmp/convs2s \\
        --tracking-uri sqlite:////tmp/convs2s/mlflow.db

The same --run-name resumes a stopped run (finished stages are skipped).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from convs2s import config as models
from convs2s.config import SearchConfig, TrainConfig
from preprocessing import config as data
from workflows.orchestrate import main
from workflows.workflow_config import EnsembleConfig, WorkflowConfig


def paper() -> WorkflowConfig:
    """The reference implementation's En-Fr recipe (fairseq's fconv_wmt_en_fr, its examples'
    command; the published model's archive states lr 1.0, 4,000 tokens and --force-anneal 30
    (its lr shrunk from epoch 31) for it, docs/reference.md; that model scores 40.83 BLEU, the
    paper 40.51: README, the paper's published models) on 8 GPUs (§4.2); how it differs from
    the paper's text: docs/reference.md, "Where the paper presets differ"."""
    return WorkflowConfig(
        name="wmt14_en_fr",
        # 40.8M pairs from the hub; drop > 175 words and ratio > 1.5 (§4.1); joint BPE 40k.
        # max-tokens 3000: the reference En-Fr recipe (the 15-layer, 4096-wide model is big).
        preprocess=data.wmt14_en_fr().replace(max_tokens=3000),
        data="hub",
        model=models.wmt14_en_fr(),  # dropout 0.1 (reference recipe)
        # NAG 0.99, clip 0.1 (§4.2); reference recipe: lr 0.5, label smoothing 0.1, lr fixed,
        # then x0.1 per epoch from epoch 50 until it falls below 1e-4.
        train=TrainConfig(lr=0.5, momentum=0.99, clip_norm=0.1, label_smoothing=0.1,
                          lr_schedule="fixed", anneal_from_epoch=50, max_epochs=100,
                          checkpoint_interval=2000, keep_last=5),
        # hub split "test" = newstest2014 (3,003 lines); the champion is chosen on "validation"
        # (newstest2013), the scores reported on newstest2014
        test_sets={"test": "newstest2014", "valid": "newstest2013"},
        local_splits={"train": "train", "valid": "newstest2013", "test": "newstest2014"},
        search=SearchConfig(beam=5, lenpen=1.0),  # §4.3: beam 5, score / |y|
        # The paper's 8-model ensemble (41.44) is EnsembleConfig(runs=8): 8x the training.
        ensemble=EnsembleConfig(runs=1, average_last=5),
        num_workers=8,  # §4.2: up to eight GPUs, synchronous, one machine
        # The update: the reference recipe's 3,000 tokens on each of the paper's 8 GPUs (the
        # paper gives sentences: "batch size 32 on each worker", §5.1). Fewer GPUs keep it by
        # accumulating micro-batches (4 GPUs: 2 each), as the reference's --update-freq does.
        update_tokens=8 * 3000,
        use_gpu=True,
    )


def smoke() -> WorkflowConfig:
    """The embedded demo corpus and the `small` model on CPU: learns it in minutes."""
    return paper().replace(
        data="demo",
        # `--data hub|DIR` with the smoke preset: the real corpus, a small vocabulary.
        preprocess=data.wmt14_en_fr().replace(vocab_size=8000, spm_sample_pairs=100_000),
        model=models.small(),
        # Paper §4.2 optimizer (NAG 0.99, lr 0.25, clip 0.1; TrainConfig's default `plateau`).
        train=TrainConfig(max_epochs=6, log_interval=50, checkpoint_interval=50, keep_last=2),
        search=SearchConfig(beam=5),
        ensemble=EnsembleConfig(runs=1, average_last=2),
        num_workers=2,
        update_tokens=0,  # a pipeline check, not the paper preset's update
        use_gpu=False,
    )


# The presets `--preset` chooses from (default smoke); workflows.catalog finds this file by them.
PRESETS = {"paper": paper, "smoke": smoke}


if __name__ == "__main__":
    sys.exit(main(PRESETS, __doc__))
