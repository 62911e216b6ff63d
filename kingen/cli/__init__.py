"""The ``kingen`` command: a thin shell over the same functions a notebook calls.

One module per group of subcommands, each adding its parsers and handlers:

=====================  ==============================================================
module                 subcommands
=====================  ==============================================================
:mod:`.command`        the parser, ``main``, and ``info``, ``simulate``, ``tune``/``analyze``
                       wiring; how errors and Ctrl-C end a command
:mod:`.fit`            ``fit`` and ``resume``
:mod:`.outputs`        ``plot``, ``report``, ``export`` and ``import``
:mod:`.batch`          ``batch``
:mod:`.profile`        ``profile``
:mod:`.analysis`       ``analyze`` and ``tune`` (the performance lab)
=====================  ==============================================================
"""

from kingen.cli.command import main

__all__ = ["main"]
