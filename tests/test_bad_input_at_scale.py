"""Bad input and bad luck at scale, on real Ray Data: a corrupt parquet file among hundreds, a
file with the wrong schema among hundreds, a disk that fills up mid-stage. Each gives one clear
error naming the file and the fix, leaves nothing half written that a rerun could take as
complete, and (disk full) a rerun with space resumes from the finished stages.

    timeout 900 .venv/bin/python -m pytest tests/test_bad_input_at_scale.py -q
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocessing.config import PreprocessConfig
from preprocessing.errors import PreprocessError
from preprocessing.pipeline import run_pipeline

N_FILES = 240  # "hundreds" of hub-shaped files, 20 pairs each: cheap to write, many read tasks


def hub_folder(root: Path, n_files: int = N_FILES, rows: int = 20) -> list[Path]:
    """`<root>/fr-en/train-XXXXX-of-NNNNN.parquet`, rows {"translation": {"en", "fr"}}."""
    folder = root / "fr-en"
    folder.mkdir(parents=True)
    paths = []
    for i in range(n_files):
        en = [f"the house number {i} {j} is small" for j in range(rows)]
        fr = [f"la maison numero {i} {j} est petite" for j in range(rows)]
        path = folder / f"train-{i:05d}-of-{n_files:05d}.parquet"
        pq.write_table(pa.table({"translation": pa.StructArray.from_arrays(
            [pa.array(en), pa.array(fr)], names=["en", "fr"])}), path, compression="zstd")
        paths.append(path)
    return paths


def cfg_for(source: Path, out: Path, **kw) -> PreprocessConfig:
    return PreprocessConfig(task="scale", source=str(source), hub_config="fr-en",
                            splits={"train": "train"}, root=str(out), vocab_size=300,
                            spm_sample_pairs=2000, **kw)


def corrupt_first_page(path: Path) -> None:
    """Overwrite the start of the first data page; the footer (row counts, schema) stays valid,
    so the file passes the driver's footer check and fails only when a task reads its data."""
    data = bytearray(path.read_bytes())
    data[4:40] = b"\xff" * 36
    path.write_bytes(bytes(data))


def nothing_complete(out: Path) -> None:
    """The failed stage is not in place, and nothing it left is marked complete. (A write task
    still finishing when the driver removes the partial folder can leave a file in it; the next
    run removes any `.partial-*` folder before it starts the stage.)"""
    assert not (out / "scale" / "clean" / "train").exists()
    for partial in out.rglob(".*.partial-*"):
        assert not (partial / "manifest.json").exists()


def test_a_corrupt_parquet_file_among_hundreds_is_named(ray_session, tmp_path):
    paths = hub_folder(tmp_path / "src")
    bad = paths[137]
    corrupt_first_page(bad)
    with pytest.raises(PreprocessError) as err:
        run_pipeline(cfg_for(tmp_path / "src", tmp_path / "out"))
    msg = str(err.value)
    assert str(bad) in msg and "row group 0" in msg and "re-download or re-export" in msg, msg
    assert "Traceback" not in msg
    nothing_complete(tmp_path / "out")


def test_a_file_with_the_wrong_schema_among_hundreds_is_named_before_any_work(tmp_path):
    paths = hub_folder(tmp_path / "src")
    bad = paths[201]
    pq.write_table(pa.table({"en": ["a"], "fr": ["b"]}), bad)  # flat columns, not the struct
    with pytest.raises(PreprocessError, match=rf"{bad}: parquet file has columns \(en: string, "
                                              r"fr: string\) but the task needs a struct column"):
        run_pipeline(cfg_for(tmp_path / "src", tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # found on the driver: no stage started


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB tmpfs (needs mount rights: root in a container, or a password-less sudo, as
    CI runners have it); grown with `grow(size)`."""
    import shutil

    mnt = tmp_path / "disk"
    mnt.mkdir()
    as_root = [] if os.geteuid() == 0 or not shutil.which("sudo") else ["sudo", "-n"]
    proc = subprocess.run([*as_root, "mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs",
                           str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip()}): the disk-full "
                    "test needs mount rights (root, or sudo without a password)")
    if as_root:  # (a tmpfs mounted by root is root's: the test's process writes into it)
        subprocess.run(["sudo", "-n", "chmod", "777", str(mnt)], check=True)

    def grow(size: str) -> None:
        subprocess.run([*as_root, "mount", "-o", f"remount,size={size}", str(mnt)], check=True)

    try:
        yield mnt, grow
    finally:
        subprocess.run([*as_root, "umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_stops_with_a_clear_error_and_the_rerun_resumes(ray_session, tmp_path,
                                                                    small_disk):
    mnt, grow = small_disk
    hub_folder(tmp_path / "src", n_files=60, rows=200)  # 12,000 pairs: more than 400 KiB out
    cfg = cfg_for(tmp_path / "src", mnt / "out")
    with pytest.raises(PreprocessError, match=r"no space left on the device writing .*"
                                              r"free disk space .* and rerun"):
        run_pipeline(cfg)
    assert not any((x / "manifest.json").exists() for x in (mnt / "out").rglob(".*.partial-*"))
    assert not (mnt / "out" / "scale" / "batches").exists()
    done = {p: p.read_bytes() for p in (mnt / "out").rglob("manifest.json")}
    assert done, "the disk should fill up after the first stage, so that a rerun can resume"
    grow("64m")
    out = run_pipeline(cfg)
    assert all(p.read_bytes() == b for p, b in done.items())  # finished stages were kept
    m = out.manifests["batches/train"]
    assert m["rows_in"] == out.manifests["clean/train"]["rows_kept"] == 12_000
