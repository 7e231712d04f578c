"""What a reader's shard cache downloaded and built, counted across its local copies and live shards."""

from __future__ import annotations

import threading

__all__ = ["CacheStats"]


class CacheStats:
    """What a cache downloaded and built; ``ShardedReader.last_refresh`` reports the part one refresh caused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.layers_downloaded = 0
        self.bytes_downloaded = 0
        self.shards_built = 0
        self.layers_reused = 0
        self.shards_compacted = 0

    def layer_downloaded(self, size: int) -> None:
        with self._lock:
            self.layers_downloaded += 1
            self.bytes_downloaded += size

    def shard_built(self, *, reused_layers: int) -> None:
        with self._lock:
            self.shards_built += 1
            self.layers_reused += reused_layers

    def shard_compacted(self) -> None:
        with self._lock:
            self.shards_compacted += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"layers_downloaded": self.layers_downloaded, "bytes_downloaded": self.bytes_downloaded,
                    "shards_built": self.shards_built, "layers_reused": self.layers_reused,
                    "shards_compacted": self.shards_compacted}
