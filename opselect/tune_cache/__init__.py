"""The on-disk tune cache (diskcache + pydantic records). See store.py."""

from .storage import TuneStore, default_directory, reset, store

__all__ = ["TuneStore", "default_directory", "reset", "store"]
