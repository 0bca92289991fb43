"""Duplex voice agent."""
