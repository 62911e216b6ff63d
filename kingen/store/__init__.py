"""The HDF5 run file: everything a fit knows, written as the run goes.

One module per job: :mod:`~kingen.store.runstore` (:class:`RunStore`: create, append,
read), :mod:`~kingen.store.encode` (the scheme, protocols, recordings and targets as HDF5
groups and back), :mod:`~kingen.store.datasets` (checksummed datasets, tables, verified
reads), :mod:`~kingen.store.integrity` (the writer lock, opening and repair of a file a
killed writer left, consistency checks), :mod:`~kingen.store.layout` (the layout as
data, from which the documentation's page "The run file" is generated) and
:mod:`~kingen.store.view` (:class:`RunView`: the one read-only view of a run that plots,
report, export and the fit's result read).
"""

from kingen.store.integrity import WriterLock, is_run_file
from kingen.store.layout import LAYOUT_DOC, LAYOUT_VERSION, MARKER, REQUIRED_GROUPS
from kingen.store.runstore import RunStore, as_store
from kingen.store.view import RunView

__all__ = ["LAYOUT_DOC", "LAYOUT_VERSION", "MARKER", "REQUIRED_GROUPS", "RunStore",
           "RunView", "WriterLock", "as_store", "is_run_file"]
