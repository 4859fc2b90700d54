"""The decoder-only transformer, split into pipeline stages and tensor-parallel shards."""
