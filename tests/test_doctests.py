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
    "kingen.model.scheme": True,
    "kingen.model.temperature": True,
    "kingen.fitting.temperature": True,
    "kingen.outputs.interop.nmodl.constants": True,
    "kingen.base.files": True,
    "kingen.experiment.protocol": True,
    "kingen.experiment.recordings.registry": True,
    "kingen.experiment.recordings.types": True,
    "kingen.model.shipped": True,
    "kingen.experiment.recordings.targets": True,
    "kingen.runs.simulate": True,
    "kingen.fitting.objective": True,
    "kingen.fitting.scores": True,
    "kingen.fitting.scales": True,
    "kingen.fitting.config": True,
    "kingen.experiment.chain": True,
    "kingen.experiment.exchange": True,
    "kingen.store.runstore": True,
    "kingen.store.datasets": True,
    "kingen.experiment.measures": True,
    "kingen.codegen.stage": True,
    "kingen.codegen.propagator": True,
    "kingen.codegen.matrix_build": True,
    "kingen.solve.cuda": True,
    "kingen.solve.rest": True,
    "kingen.solve.inputs": True,
    "kingen.solve.schedule": True,
    "kingen.solve.plan": True,
    "kingen.solve.batch": True,
    "kingen.solve.gnsums": True,
    "kingen.solve.staging": True,
    "kingen.solve.gpu_call": True,
    "kingen.solve.warp_order": True,
    "kingen.base.console": True,
    "kingen.outputs.interop": True,
    "kingen.outputs.interop.exported": True,
    "kingen.outputs.interop.nmodl.lexer": True,
    "kingen.outputs.interop.nmodl.parser": True,
    "kingen.outputs.interop.nmodl.reader": True,
    "kingen.outputs.interop.nmodl.declared": True,
    "kingen.outputs.interop.nmodl.writer": True,
    "kingen.outputs.interop.myokit.writer": True,
    "kingen.fitting.operators": True,
    "kingen.fitting.selection": True,
    "kingen.fitting.state": True,
    "kingen.fitting.engine": True,
    "kingen.fitting.evaluator": True,
    "kingen.fitting.gpus": True,
    "kingen.fitting.algorithms": True,
    "kingen.fitting.algorithms.base": True,
    "kingen.fitting.algorithms.deap_types": True,
    "kingen.fitting.algorithms.mu_plus_lambda": True,
    "kingen.fitting.algorithms.cmaes": True,
    "kingen.runs.result": True,
    "kingen.runs.fit": False,
    "kingen.store.view": False,
    "kingen.identify.noise": True,
    "kingen.identify.fisher": True,
    "kingen.identify.table": True,
    "kingen.identify.likelihood": True,
    "kingen.identify.refine": True,
    "kingen.identify.gauss_newton": True,
    "kingen.runs.profile": False,
    "kingen.outputs.plot": True,
    "kingen.outputs.figstyle": True,
    "kingen.outputs.searchplots": True,
    "kingen.outputs.report": False,
    "kingen.scaleout.cluster": True,
    "kingen.scaleout.settings": True,
    "kingen.scaleout.manifest": True,
    "kingen.scaleout.tomlout": True,
    "kingen.scaleout.summary": True,
    "kingen.scaleout.shard": False,
    "kingen.scaleout.worker": True,
    "kingen.base.allocator": True,
    "kingen.scaleout.batch": True,
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
