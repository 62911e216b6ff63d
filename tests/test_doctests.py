"""The ``>>>`` examples in the docstrings of the public API run, from the repository root.

``doctest.testmod`` on an explicit list of modules rather than ``pytest --doctest-modules``,
which would import every module (GPU-only ones included).
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# module -> whether it has examples that run (the others' examples are all +SKIP: a fit)
PUBLIC_MODULES = {
    "kingen": True,
    "kingen.scheme": True,
    "kingen.files": True,
    "kingen.protocol": True,
    "kingen.experiment.chain": True,
    "kingen.data.registry": True,
    "kingen.data.targets": True,
    "kingen.simulation": True,
    "kingen.objective": True,
    "kingen.fit_config": True,
    "kingen.store.runstore": True,
    "kingen.codegen.stage": True,
    "kingen.codegen.propagator": True,
    "kingen.solve.cuda": True,
    "kingen.solve.rest": True,
    "kingen.solve.inputs": True,
    "kingen.solve.plan": True,
    "kingen.solve.batch": True,
    "kingen.console": True,
    "kingen.interop": True,
    "kingen.interop.exported": True,
    "kingen.interop.nmodl.lexer": True,
    "kingen.interop.nmodl.parser": True,
    "kingen.interop.nmodl.reader": True,
    "kingen.interop.nmodl.writer": True,
    "kingen.interop.myokit.writer": True,
    "kingen.search.operators": True,
    "kingen.search.state": True,
    "kingen.search.engine": True,
    "kingen.search.result": True,
    "kingen.search.run": False,
    "kingen.store.view": False,
    "kingen.identify.noise": True,
    "kingen.identify.fisher": True,
    "kingen.identify.table": True,
    "kingen.identify.run": False,
    "kingen.plot": True,
    "kingen.report": False,
    "kingen.distributed.cluster": True,
    "kingen.distributed.manifest": True,
    "kingen.distributed.tomlout": True,
    "kingen.distributed.summary": True,
    "kingen.distributed.shard": False,
    "kingen.distributed.worker": True,
    "kingen.allocator": True,
    "kingen.distributed.batch": True,
}


@pytest.mark.parametrize("name", list(PUBLIC_MODULES))
def test_docstring_examples(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the examples name files relative to the repository root
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for t in finder.find(module) if t.examples)
    assert examples > 0, f"{name} has no docstring examples"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} docstring examples of {name} failed"
    if PUBLIC_MODULES[name]:
        assert result.attempted > 0, f"no docstring example of {name} ran"
