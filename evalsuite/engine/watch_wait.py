"""Waiting for a training folder to change: file-system events through `watchdog`, polling otherwise.

Events only wake the watcher early: it looks at the folder again at least every `interval`
seconds whatever happens, because "no longer growing" is the absence of events, and network
file systems (NFS, Lustre) deliver none for writes made on other machines. `polling=True`
(`evalsuite watch --poll`) never starts an observer.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

READS = ("opened", "closed_no_write")  # watchdog's event types for a file read, not written


class Waiter:
    """`wait()` returns after a change under `folder` or after `interval` seconds."""

    def __init__(self, folder: Path, interval: float, polling: bool = False, ignore: Path | None = None):
        self.folder = folder
        self.ignore = str(ignore.resolve()) if ignore is not None else None  # our own writes wake nobody
        self.interval = interval
        self.changed = threading.Event()
        self.observer: Any = None
        self.mode = "polling" if polling else self._start()

    def _start(self) -> str:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            print('note: watching by polling; for file-system events: pip install "evalsuite[watch]"', file=sys.stderr)
            return "polling"
        changed, ignore = self.changed, self.ignore

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in READS:  # the watcher's own look opens the weights: no change
                    return
                if ignore is None or not str(event.src_path).startswith(ignore):
                    changed.set()

        observer = Observer()
        try:
            observer.schedule(Wake(), str(self.folder.resolve()), recursive=True)
            observer.start()
        except OSError as exc:  # inotify limits, a file system without events: polling still works
            print(f"note: watching by polling ({exc.strerror or exc})", file=sys.stderr)
            return "polling"
        self.observer = observer
        return "events"

    def wait(self, interval: float | None = None) -> bool:
        """True when a change woke it; False when the time ran out."""
        woke = self.changed.wait(self.interval if interval is None else interval)
        self.changed.clear()
        return woke

    def close(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
            self.observer = None

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
