"""Engines that run a model's stages in this process."""
