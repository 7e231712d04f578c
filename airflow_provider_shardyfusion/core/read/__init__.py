"""The reader: a published snapshot followed through its pointer, with a local shard cache."""
