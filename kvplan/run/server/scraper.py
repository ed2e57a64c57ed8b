"""Reads a server's ``/metrics`` every few milliseconds during a target run's levels and appends
one ``ServerSample`` per read to ``server_metrics.jsonl`` (kvplan.results.stats.server_samples).

A thread of its own, so a slow read never delays the load client. Reads happen only inside a
level (``start_level`` .. ``end_level``), each of which also reads once at once (``boundary``),
so counters are differenced exactly across the level. A failed read is written with its error
and no values.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvplan.results.records import LevelKey, level_fields
from kvplan.results.stats.server_samples import ServerSample
from kvplan.run.server.preflight import get
from kvplan.run.server.server_metrics import parse_metrics


class Scraper:
    """See the module docstring. ``interval_s``: seconds between reads."""

    def __init__(self, url: str, key: str | None, interval_s: float, path: Path):
        self.url, self.key, self.interval_s = url, key, interval_s
        self._file = open(path, "a", encoding="utf-8")
        self._level: LevelKey | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvplan-scraper", daemon=True)
        self._thread.start()

    def start_level(self, key: LevelKey) -> None:
        self._level = key
        self._read(boundary=True)

    def end_level(self) -> None:
        self._read(boundary=True)
        self._level = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._level is not None:
                self._read(boundary=False)

    def _read(self, boundary: bool) -> None:
        with self._lock:
            key = self._level
            if key is None:
                return
            values: dict[str, Any] = {}  # ServerSample's metric fields (float or None)
            error = ""
            try:
                status, body = get(self.url, self.key, timeout_s=max(1.0, 5 * self.interval_s))
                if status != 200:
                    error = f"http {status}"
                else:
                    values = parse_metrics(body.decode("utf-8", "replace")).values
            except (OSError, ValueError) as err:
                error = f"{type(err).__name__}: {err}"[:200]
            sample = ServerSample(
                time=time.perf_counter(), **level_fields(key), boundary=boundary, error=error, **values
            )
            self._file.write(json.dumps(asdict(sample)) + "\n")
            self._file.flush()
