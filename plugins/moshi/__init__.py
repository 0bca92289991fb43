"""Kyutai's Moshi served in-process, many conversations batched on one device (the ``moshi`` extra)."""
