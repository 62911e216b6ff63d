"""Scale-out with Dask: one fit across several workers, and batches of many fits.

One module per job: :mod:`~kingen.distributed.cluster` (the ``[cluster]`` table and
``--cluster`` option, and the Dask cluster they build), :mod:`~kingen.distributed.worker`
(the worker plugin that builds a fit's solver once per worker, and the shard task),
:mod:`~kingen.distributed.shard` (a generation's candidates split into one shard per
worker), :mod:`~kingen.distributed.fitting` (``kingen fit --cluster``: a fit with that
evaluator), :mod:`~kingen.distributed.manifest` (the batch manifest),
:mod:`~kingen.distributed.batch` (one Dask task per fit, resumable),
:mod:`~kingen.distributed.summary` (``batch_summary.csv``, the HTML page, AIC/BIC) and
:mod:`~kingen.distributed.tomlout` (the per-fit configuration files the batch writes).

Dask (``pip install 'kingen[dask]'``) is imported only when one of these is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ClusterSettings": "kingen.distributed.cluster",
    "cluster_settings": "kingen.distributed.cluster",
    "parse_cluster_option": "kingen.distributed.cluster",
    "open_client": "kingen.distributed.cluster",
    "ShardedEvaluator": "kingen.distributed.shard",
    "fit_on_cluster": "kingen.distributed.fitting",
    "resume_on_cluster": "kingen.distributed.fitting",
    "load_manifest": "kingen.distributed.manifest",
    "run_batch": "kingen.distributed.batch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kingen.distributed' has no attribute {name!r}"
                             ) from None
    return getattr(importlib.import_module(module), name)
