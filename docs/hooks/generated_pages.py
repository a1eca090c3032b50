"""mkdocs hook: the pages made from the code at build time, so that they keep up with it.

- `reference/cli.md`: one entry per command of `latentcode`, walked from the argument parsers that
  `latentcode.cli.build_parser` builds (usage, description, every argument with its help).
- `reference/api/*.md`: one page per package, one mkdocstrings entry (`::: module.name`) per name of
  its `__all__` (`latentcode` first), so every public name has an entry.
- the search shim of the offline plugin (`docs/assets/iframe-worker-shim.js`) in place of its CDN address;
- `results.md`: `analyses/RESULTS.md` as it is in the repository, the figures and tables it links to
  copied beside it; links to what a page cannot show (folders, Markdown notes) become paths.

Nothing is written into docs/: the pages exist only in the build (`mkdocs.structure.files.File.generated`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# The packages whose `__all__` the API reference lists, each on its own page (title, module).
API_PACKAGES = [
    ("latentcode", "latentcode"),
    ("Tasks", "latentcode.tasks"),
    ("Models", "latentcode.models"),
    ("Sources: sites and selectors", "latentcode.sources"),
    ("Extraction", "latentcode.extraction"),
    ("Codes files", "latentcode.store"),
    ("Training", "latentcode.training"),
    ("Interventions", "latentcode.intervention"),
    ("Patching, search and attribution", "latentcode.intervention.patching"),
    ("Analysis", "latentcode.analysis"),
    ("Relations of a pretrained model", "latentcode.relations"),
    ("Demo", "latentcode.demo"),
]
# Files that the results page may link to and that a browser shows.
RESULT_SUFFIXES = {".png", ".csv", ".html", ".svg", ".json", ".txt"}


def on_config(config):
    """The API reference in the navigation: its index, then one page per package."""
    api = [{"Overview": "reference/api/index.md"}] + [{title: f"reference/api/{module}.md"}
                                                      for title, module in API_PACKAGES]
    _replace_in_nav(config["nav"], "reference/api/index.md", api)
    return config


def _replace_in_nav(nav: list, target: str, replacement: list) -> bool:
    for entry in nav:
        for title, value in entry.items():
            if value == target:
                entry[title] = replacement
                return True
            if isinstance(value, list) and _replace_in_nav(value, target, replacement):
                return True
    return False


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/api/index.md", content=api_index()))
    for title, module in API_PACKAGES:
        files.append(File.generated(config, f"reference/api/{module}.md", content=api_page(title, module)))
    page, linked = results_page()
    files.append(File.generated(config, "results.md", content=page))
    for relative in linked:
        files.append(File.generated(config, f"results/{relative}",
                                    abs_src_path=str(ROOT / "analyses" / "results" / relative)))
    return files


# The search shim that material's offline plugin loads from a CDN; the site serves its own copy.
REMOTE_SHIM = "https://unpkg.com/iframe-worker/shim"
LOCAL_SHIM = "assets/iframe-worker-shim.js"


def on_post_page(output: str, page, config) -> str:
    """No script from elsewhere: the offline plugin's CDN shim is replaced by the site's copy."""
    depth = page.file.url.count("/")
    return output.replace(REMOTE_SHIM, "../" * depth + LOCAL_SHIM)


def on_post_template(output: str, template_name: str, config) -> str:
    """The same for the pages made from templates alone (404.html, at the site's root)."""
    return output.replace(REMOTE_SHIM, LOCAL_SHIM)


# --- the command line ---------------------------------------------------------------------------------

def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
            name = ", ".join(f"`{flag}{' ' + metavar if metavar else ''}`" for flag in action.option_strings)
        else:
            name = f"`{formatter._format_args(action, action.dest)}`"
        help_text = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and not isinstance(action.choices, dict):
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| {_escape(name)} | {_escape(help_text)} |")
    return rows


def cli_page() -> str:
    from latentcode.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command-line reference",
        "",
        "Generated when the site is built, from the argument parsers of `latentcode` "
        "(`latentcode.cli.build_parser`): what `latentcode COMMAND --help` prints, one section per command.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        parser.description or "",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name in parser.commands.parsers:
        lines.append(f"| [`{name}`](#{name}) | {_escape(summaries.get(name) or '')} |")
    for name, command_parser in parser.commands.parsers.items():
        lines += ["", f"## `latentcode {name}` {{#{name}}}", "", "```text",
                  command_parser.format_usage().strip(), "```", ""]
        if command_parser.description:
            lines += [_escape_markdown(command_parser.description), ""]
        rows = _argument_rows(command_parser)
        if rows:
            lines += ["| argument | meaning |", "| --- | --- |", *rows, ""]
        epilog = command_parser.epilog() if callable(command_parser.epilog) else command_parser.epilog
        if epilog:
            lines += ["```text", epilog.strip(), "```", ""]
    return "\n".join(lines) + "\n"


def _escape_markdown(text: str) -> str:
    """argparse prose as Markdown text: angle brackets shown, not read as HTML."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


# --- the Python API ---------------------------------------------------------------------------------

def api_index() -> str:
    lines = ["# API reference", "",
             "Generated when the site is built from the docstrings of every name in each package's `__all__`. "
             "`import latentcode` gives the names most programs need; the packages below hold the rest.", "",
             "| package | names |", "| --- | --- |"]
    for title, module in API_PACKAGES:
        names = public_names(module)
        lines.append(f"| [{title}]({module}.md) (`{module}`) | {len(names)} |")
    return "\n".join(lines) + "\n"


def public_names(module: str) -> list[str]:
    return [name for name in importlib.import_module(module).__all__ if not name.startswith("__")]


def first_page() -> dict[str, str]:
    """For each public class and function, the first package (in API_PACKAGES order) that lists it."""
    pages: dict[str, str] = {}
    for _, module in API_PACKAGES:
        imported = importlib.import_module(module)
        for name in public_names(module):
            value = getattr(imported, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                pages.setdefault(f"{value.__module__}.{value.__qualname__}", module)
    return pages


def api_page(title: str, module: str) -> str:
    """One entry per public name: classes and functions through mkdocstrings, at the module that defines
    them (re-exports are not followed by static analysis); constants as their value."""
    imported = importlib.import_module(module)
    lines = [f"# {title}: `{module}`", ""]
    if imported.__doc__:
        lines += [f"::: {module}", "    options:", "      members: false", "      show_root_heading: false",
                  "      show_source: false", ""]
    for name in public_names(module):
        value = getattr(imported, name)
        defined_in = getattr(value, "__module__", None)
        qualified = getattr(value, "__qualname__", None)
        first = first_page().get(f"{defined_in}.{qualified}")
        if (inspect.isclass(value) or inspect.isfunction(value)) and first not in (None, module):
            # One entry per object across the reference (mkdocs' cross-references need one primary URL):
            # a name another package re-exports points to its entry.
            lines += [f"## `{name}`", "", f"`from {module} import {name}`: documented under "
                      f"[`{first}`]({first}.md#{defined_in}.{qualified}).", ""]
        elif inspect.isclass(value) or inspect.isfunction(value):
            lines += [f"::: {defined_in}.{qualified}", "    options:", "      show_root_heading: true",
                      "      show_root_full_path: false", "      heading_level: 2", ""]
            if f"{defined_in}.{qualified}" != f"{module}.{name}":
                lines += [f"Import it as `from {module} import {name}`.", ""]
        else:
            shown = repr(value)
            shown = shown if len(shown) <= 400 else shown[:400] + " ..."
            lines += [f"## `{name}`", "", f"`from {module} import {name}`: a constant.", "", "```python",
                      f"{name} = {shown}", "```", ""]
    return "\n".join(lines) + "\n"


# --- the results page ---------------------------------------------------------------------------------

LINK = re.compile(r"(!?)\[([^\]]*)\]\((results/[^)\s]+)\)")


def results_page() -> tuple[str, list[str]]:
    """`analyses/RESULTS.md` with its links into `analyses/results/` kept where the site copies the
    file (returned: the paths copied, relative to that folder) and turned into paths elsewhere."""
    text = (ROOT / "analyses" / "RESULTS.md").read_text(encoding="utf-8")
    linked: list[str] = []

    def replace(match: re.Match) -> str:
        bang, label, target = match.groups()
        path = target.split("#")[0]
        relative = path[len("results/"):]
        source = ROOT / "analyses" / path
        if source.is_file() and source.suffix in RESULT_SUFFIXES:
            if relative not in linked:
                linked.append(relative)
            return match.group(0)
        return f"{label} (`analyses/{path}`)" if label and label != path else f"`analyses/{path}`"

    body = LINK.sub(replace, text)
    preface = ("!!! note \"Where this page comes from\"\n    This page is `analyses/RESULTS.md` of the repository, "
               "included when the site is built (regenerate it with `python analyses/reproduce.py page`); "
               "the figures and tables it links are copied beside it.\n\n")
    # The file's first heading stays the page's title.
    first_line, _, rest = body.partition("\n")
    return (first_line + "\n\n" + preface + rest if first_line.startswith("# ") else preface + body), linked
