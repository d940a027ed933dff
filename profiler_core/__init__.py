"""Shared by host and server: the wire code, the event model, stack signatures, configuration."""

__version__ = "0.1.0"
