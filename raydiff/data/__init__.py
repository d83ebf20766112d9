"""Data plane: prepare image sources into Parquet shards, and stream them with Ray Data.

Importing this package does not import Ray or torch: ``pipeline`` imports them lazily, inside
the functions that need them, so the unit tier and ``raydiff prepare`` stay Ray-free.
"""

from raydiff.data.config import DataConfig
from raydiff.data.manifest import Manifest, check_compatible, load_manifest, verify_shards
from raydiff.data.pipeline import (
    build_datasets,
    decoded_bytes,
    execution_options,
    iterate_batches,
)
from raydiff.data.prepare import PrepareOptions, PrepareSummary, prepare_dataset

__all__ = [
    "DataConfig",
    "Manifest",
    "PrepareOptions",
    "PrepareSummary",
    "build_datasets",
    "check_compatible",
    "decoded_bytes",
    "execution_options",
    "iterate_batches",
    "load_manifest",
    "prepare_dataset",
    "verify_shards",
]
