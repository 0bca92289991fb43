"""Helpers every model shares: the VAD, process-wide model loading, model errors."""
