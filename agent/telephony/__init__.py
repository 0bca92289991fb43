"""Telephone calls: outbound dial requests, their outcomes, and answering-machine detection."""
