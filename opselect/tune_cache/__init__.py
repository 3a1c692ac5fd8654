"""The on-disk tune cache: pydantic records in a text-only sqlite3 file (textdb.py)."""

from .storage import TuneStore, default_directory, reset, store

__all__ = ["TuneStore", "default_directory", "reset", "store"]
