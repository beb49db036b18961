"""A small package used by the end-to-end tests."""
from .catalog import Item, CATALOG
from . import pricing

__all__ = ["Item", "CATALOG", "pricing"]
