"""Pages generated from kingen itself, so that they cannot drift from the code.

``kingen-cli``
    Every subcommand of ``kingen``: walks the parser of :func:`kingen.cli.command.build_parser`
    (argparse's own objects, no other dependency) and writes one section per subcommand with
    its usage, description and arguments.
``kingen-run-file-layout``
    The run file's layout, :func:`kingen.store.layout.markdown` (the text every run file
    carries as its ``layout`` attribute), less its title, parsed as MyST: the page
    docs/reference/run_file.md.
``kingen-namespace``
    The public names of ``kingen`` (its ``__all__``), each linked to the object it stands
    for.
"""

from __future__ import annotations

import argparse

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps no public list of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    # argparse fills %(default)s and friends and un-doubles %%; do the same
    params = {**vars(action), "prog": "kingen"}
    for key in ("choices",):
        if params.get(key) is not None:
            params[key] = ", ".join(map(str, params[key]))
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text.replace("%%", "%")


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices
        else action.dest.upper())
    if action.nargs == "?":
        metavar = f"[{metavar}]"
    elif action.nargs in ("*", "+") or isinstance(action.nargs, int):
        metavar = f"{metavar} ..."
    return ", ".join(f"{opt} {metavar}" for opt in action.option_strings)


def _arguments(parser: argparse.ArgumentParser) -> nodes.definition_list:
    items = nodes.definition_list()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        item = nodes.definition_list_item()
        item += nodes.term("", "", nodes.literal(text=_invocation(action)))
        body = nodes.definition()
        help_text = _help(action)
        if action.required and action.option_strings:
            help_text = f"{help_text} (required)".strip()
        body += nodes.paragraph(text=help_text or "")
        item += body
        items += item
    return items


def _section(name: str, parser: argparse.ArgumentParser, summary: str) -> nodes.section:
    section = nodes.section(ids=[f"kingen-{name}"], names=[f"kingen {name}"])
    section += nodes.title(text=f"kingen {name}")
    usage = parser.format_usage().removeprefix("usage: ").strip()
    section += nodes.literal_block(usage, usage, language="text")
    text = parser.description or summary
    if text:
        section += nodes.paragraph(text=text)
    section += _arguments(parser)
    return section


class CliDirective(SphinxDirective):
    """``kingen-cli``: one section per subcommand of the ``kingen`` command."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from kingen.cli.command import build_parser

        parser = build_parser()
        summaries = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                summaries = {a.dest: a.help or "" for a in action._choices_actions}
        usage = parser.format_usage().removeprefix("usage: ").strip()
        out: list[nodes.Node] = [nodes.literal_block(usage, usage, language="text"),
                                 _arguments(parser)]
        for name, sub in _subcommands(parser).items():
            out.append(_section(name, sub, summaries.get(name, "")))
        return out


def run_file_layout_text() -> str:
    """What the ``kingen-run-file-layout`` directive renders: the layout less its title."""
    from kingen.store import layout

    return layout.markdown().removeprefix(layout.TITLE + "\n")


class RunFileLayoutDirective(SphinxDirective):
    """``kingen-run-file-layout``: :func:`kingen.store.layout.markdown` without its title."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        text = run_file_layout_text()
        container = nodes.container()
        self.state.nested_parse(StringList(text.splitlines(), source="kingen.store.layout"),
                                self.content_offset, container)
        return container.children


class NamespaceDirective(SphinxDirective):
    """``kingen-namespace``: each public name of ``kingen`` and the object it stands for."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        import kingen

        lines = []
        for name in kingen.__all__:
            if name.startswith("_"):
                continue
            obj = getattr(kingen, name)
            target = f"{obj.__module__}.{obj.__qualname__}"
            lines.append(f"- `kingen.{name}`: {{py:obj}}`{target}`")
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="kingen.__all__"),
                                self.content_offset, container)
        return container.children


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("kingen-cli", CliDirective)
    app.add_directive("kingen-run-file-layout", RunFileLayoutDirective)
    app.add_directive("kingen-namespace", NamespaceDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
