"""Gigaword headline generation with ConvS2S (paper §5.7, Table 6: ROUGE-1/2/L F1 35.88 / 17.48 /
33.29 on the Gigaword test set).

Preprocess (no ratio filter, 30k joint vocabulary) -> train (six 256-unit layers per side,
paper §4.2 optimizer, batches of 128) -> generate with beam 5 and at least 14 output tokens ->
ROUGE as parallel Ray tasks, tracked under one MLflow parent run.

    python workflows/gigaword.py --preset smoke                   # demo summaries, CPU, minutes
    python workflows/gigaword.py --preset paper --use-gpu \\
        --storage-path /mnt/efs/convs2s/ray_results --tracking-uri http://mlflow:5000
    # the paper's one GPU; on 4, the same 128-sentence update: --num-workers 4 \\
    #     --set data.max_sentences=32
    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python workflows/gigaword.py --preset smoke --storage-path /tmp/convs2s \\
        --tracking-uri sqlite:////tmp/convs2s/mlflow.db

Two approximations, both stated here: the paper asks for outputs "at least 14 words long"
while search counts BPE pieces (`min_len=14` pieces, about 10-14 words); and the paper's
vocabulary is 30k words while this project uses a 30k joint BPE. The paper's DUC-2004 recall
numbers need the DUC data (not on the hub); the hub's test split has 1,951 pairs (paper: 2,000)
and spells an unknown word `UNK` where the training data writes `<unk>`: mapped to `<unk>` in
every split (preprocessing.config.gigaword, `token_map`).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from convs2s import config as models
from convs2s.config import TrainConfig, summarization_search
from preprocessing import config as data
from workflows.orchestrate import main
from workflows.workflow_config import EnsembleConfig, WorkflowConfig


def paper() -> WorkflowConfig:
    """Paper §4.1: 3.8M training pairs; §5.7: one GPU "in one night"."""
    return WorkflowConfig(
        name="gigaword",
        # Harvard/gigaword (parquet conversion); no ratio filter (documents >> titles);
        # 30k vocabulary (§4.1); §5.7 "batch size 128": 128 sentences a batch, under a token
        # budget that does not close one first (128 documents of up to 256 pieces; on
        # ../shared/data/gigaword-sample with a 2,000-piece BPE the default 4,000 closed
        # batches at 77 sentences on average, none at 128; this budget, all but the last at
        # 128), and an update of 128 sentences (update_sentences: fewer sentences a batch on
        # several GPUs keep it, --set data.max_sentences=128/N, as the run's note says).
        preprocess=data.gigaword().replace(max_sentences=128, max_tokens=128 * 256),
        update_sentences=128,
        data="hub",
        model=models.gigaword(),  # 6 + 6 layers, 256 units
        # §4.2 optimizer: NAG 0.99, lr 0.25, clip 0.1; once the validation perplexity stops
        # improving, lr / 10 after each epoch until below 1e-4 (lr_schedule "anneal").
        train=TrainConfig(lr=0.25, momentum=0.99, clip_norm=0.1, lr_schedule="anneal",
                          min_lr=1e-4, max_epochs=100, checkpoint_interval=2000, keep_last=5),
        # hub "test": 1,951 pairs; the champion is chosen on "validation" (all of it)
        test_sets={"test": "gigaword_test", "valid": "gigaword_valid"},
        local_splits={"train": "train", "valid": "valid", "test": "test"},
        task_kind="summarization",  # ROUGE-1/2/L (F1 and recall)
        search=summarization_search(),  # beam 5 (§4.3), min_len 14 (§4.1)
        ensemble=EnsembleConfig(runs=1, average_last=0),
        num_workers=1,
        use_gpu=True,
    )


def smoke() -> WorkflowConfig:
    """Embedded demo summaries (3-6 word headlines, so a 3-token floor), `small` model, CPU."""
    return paper().replace(
        data="demo",
        preprocess=data.gigaword().replace(vocab_size=8000, spm_sample_pairs=100_000),
        model=models.small(),
        train=TrainConfig(max_epochs=4, log_interval=50, keep_last=2),
        search=summarization_search(min_len=3),
        ensemble=EnsembleConfig(runs=1, average_last=2),
        num_workers=2,
        use_gpu=False,
        update_sentences=0,  # a pipeline check, not the paper preset's update
    )


# The presets `--preset` chooses from (default smoke); workflows.catalog finds this file by them.
PRESETS = {"paper": paper, "smoke": smoke}


if __name__ == "__main__":
    sys.exit(main(PRESETS, __doc__))
