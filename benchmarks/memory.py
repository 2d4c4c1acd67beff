"""Peak memory of a process tree over time, split by pipeline stage.

A thread samples, every 0.5 s, the driver (this process) and all its descendants (a local Ray:
raylet, GCS, workers): the driver's RSS and PSS, the PSS of Ray's worker processes (named
`ray::...`) and the PSS of everything together. PSS (proportional set size) splits each
shared page among the processes that map it, so the object store's shared memory and shared
libraries are counted once in a sum, where RSS would count them once per process.

Stage windows come from `mark(stage, "running" | "done")` calls, or from the preprocessing
pipeline's own log lines (`[clean/train] running`, `[clean/train] done in ...`) through a
`StageClock` logging handler.

    with MemorySampler() as mem, StageClock(mem):
        run_pipeline(cfg)
    mem.peaks_mib()          # {"driver_rss": ..., "workers_pss": ..., "total_pss": ..., ...}
    mem.stage_peaks_mib()    # {"clean/train": {...}, "spm": {...}, ...}
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time

import psutil  # noqa: E402,I001
import ray  # noqa: F401 - ray puts its bundled psutil on sys.path

KEYS = ("driver_rss", "driver_pss", "workers_pss", "total_pss")


class MemorySampler:
    """Samples the memory of this process and its descendants in a background thread."""

    def __init__(self, interval_s: float = 0.5, disk_path: str | None = None):
        self.interval_s = interval_s
        self.disk_path = disk_path  # also sample the used bytes of this path's file system
        self.disk_used: list[int] = []
        self.samples: list[tuple[float, dict]] = []  # (monotonic time, {key: bytes})
        self.marks: list[tuple[float, str, str]] = []  # (time, stage, "running" | "done")
        self.max_processes = 0
        self.by_name: dict[str, int] = {}  # process title -> its largest PSS seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def mark(self, stage: str, event: str) -> None:
        self.sample()  # a sample at each boundary, so a short stage still has one
        self.marks.append((time.monotonic(), stage, event))

    def sample(self) -> None:
        me = psutil.Process()
        driver = me.memory_full_info()
        workers = total = 0
        procs = me.children(recursive=True)
        for p in procs:
            try:
                pss, name = p.memory_full_info().pss, p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # a worker that exited between listing and reading
            total += pss
            if name.startswith("ray::"):
                workers += pss
            self.by_name[name] = max(self.by_name.get(name, 0), pss)
        self.max_processes = max(self.max_processes, len(procs) + 1)
        if self.disk_path:
            self.disk_used.append(shutil.disk_usage(self.disk_path).used)
        self.samples.append((time.monotonic(), {
            "driver_rss": driver.rss, "driver_pss": driver.pss, "workers_pss": workers,
            "total_pss": total + driver.pss}))

    @staticmethod
    def _peak(samples) -> dict:
        return {k: round(max((s[k] for _, s in samples), default=0) / 2**20, 1) for k in KEYS}

    def peaks_mib(self) -> dict:
        """Peak of each measure over the whole run, in MiB (peaks may come from different
        moments), and the most processes seen at once."""
        return {**self._peak(self.samples), "processes": self.max_processes}

    def disk_growth_mib(self) -> float | None:
        """Peak growth of the used disk space over the first sample (outputs + spill files)."""
        if not self.disk_used:
            return None
        return round((max(self.disk_used) - self.disk_used[0]) / 2**20, 1)

    def largest_processes_mib(self, n: int = 8) -> dict:
        """The n process titles with the largest single-process PSS (e.g. which actor grew)."""
        top = sorted(self.by_name.items(), key=lambda kv: -kv[1])[:n]
        return {name: round(v / 2**20, 1) for name, v in top}

    def stage_peaks_mib(self) -> dict:
        """Peaks within each marked stage window."""
        starts = {stage: t for t, stage, ev in self.marks if ev == "running"}
        out = {}
        for t_end, stage, ev in self.marks:
            if ev == "done" and stage in starts:
                window = [x for x in self.samples if starts[stage] <= x[0] <= t_end]
                out[stage] = self._peak(window)
        return out


class StageClock(logging.Handler):
    """Marks stage windows on a sampler from the preprocessing pipeline's log lines."""

    PATTERN = re.compile(r"^\[(?P<stage>[^\]]+)\] (?P<event>running|done)")

    def __init__(self, sampler: MemorySampler, logger: str = "preprocessing"):
        super().__init__(level=logging.INFO)
        self.sampler, self.logger = sampler, logging.getLogger(logger)
        self._old_level = self.logger.level

    def __enter__(self) -> "StageClock":
        self.logger.addHandler(self)
        if not self.logger.isEnabledFor(logging.INFO):
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._old_level)

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.match(record.getMessage())
        if m:
            self.sampler.mark(m["stage"], m["event"])
