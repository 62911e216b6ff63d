"""Scale-out with Dask: one fit across several workers, and batches of many fits.

One module per job: :mod:`~kingen.scaleout.cluster` (the ``[cluster]`` table and
``--cluster`` option, and the Dask cluster they build), :mod:`~kingen.scaleout.worker`
(the worker plugin that builds a fit's solver once per worker, and the shard task),
:mod:`~kingen.scaleout.shard` (a generation's candidates split into one shard per
worker), :mod:`~kingen.scaleout.fitting` (``kingen fit --cluster``: a fit with that
evaluator), :mod:`~kingen.scaleout.manifest` (the batch manifest),
:mod:`~kingen.scaleout.batch` (one Dask task per fit, resumable),
:mod:`~kingen.scaleout.summary` (``batch_summary.csv``, the HTML page, AIC/BIC) and
:mod:`~kingen.scaleout.tomlout` (the per-fit configuration files the batch writes).

Dask (``pip install 'kingen[dask]'``) is imported only when one of these is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ClusterSettings": "kingen.scaleout.cluster",
    "cluster_settings": "kingen.scaleout.cluster",
    "parse_cluster_option": "kingen.scaleout.cluster",
    "open_client": "kingen.scaleout.cluster",
    "ShardedEvaluator": "kingen.scaleout.shard",
    "fit_on_cluster": "kingen.scaleout.fitting",
    "resume_on_cluster": "kingen.scaleout.fitting",
    "load_manifest": "kingen.scaleout.manifest",
    "run_batch": "kingen.scaleout.batch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kingen.scaleout' has no attribute {name!r}"
                             ) from None
    return getattr(importlib.import_module(module), name)
