"""Shared fixtures: one local Ray instance per test session, real data from ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (small real corpora); the test is skipped when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (../shared/data beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs) shared by every test of the session."""
    import ray

    # Keep small parquet reads light (reference-facts §8) and quiet Ray's progress bars.
    os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()
