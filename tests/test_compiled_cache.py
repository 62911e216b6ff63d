"""kingen's on-disk cache under concurrent processes: one folder, no lost tuning entries."""

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "models" / "jonas_1993.toml"


def _folders(root: str) -> set[str]:
    import os

    os.environ["KINGEN_CACHE"] = root
    from kingen.solve.compiled import cache_dir

    return {str(cache_dir()) for _ in range(200)}


def _tune(args) -> None:
    import os

    root, i = args
    os.environ["KINGEN_CACHE"] = root
    from kingen.model.scheme import Scheme
    from kingen.solve.cuda import LaunchConfig, record_tuning

    scheme = Scheme.load(MODEL)
    for j in range(10):
        record_tuning(f"gpu{i}-{j}", scheme, "float64", LaunchConfig(64), {})


def test_concurrent_processes_use_the_same_cache_folder(tmp_path):
    with ProcessPoolExecutor(6) as pool:
        folders = set().union(*pool.map(_folders, [str(tmp_path)] * 6))
    assert folders == {str(tmp_path)}  # a shared probe file sent some to the temp folder


def test_concurrent_tuning_records_keep_every_entry(tmp_path):
    with ProcessPoolExecutor(6) as pool:
        list(pool.map(_tune, [(str(tmp_path), i) for i in range(6)]))
    table = json.loads((tmp_path / "solver_tuning.json").read_text())
    assert len(table) == 60
