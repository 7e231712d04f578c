"""Streaming: one snapshot per micro-batch, the stream's owner and the job's contract."""
