"""docs/cli.md, the full command reference, rendered from the commands' own --help.

    python -m localspec.cli_reference > docs/cli.md

tests/test_repository.py fails when the file and the help differ, so the reference cannot drift.
"""

from __future__ import annotations

import click

WIDTH = 100  # help is wrapped at a fixed width, so the file does not depend on the terminal


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    settings = {**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    return click.Context(command, info_name=name, parent=parent, **settings)


def _sections(command: click.Command, path: list[str], parent: click.Context | None) -> list[str]:
    ctx = _context(command, path[-1], parent)
    out = [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`\n\n```\n{command.get_help(ctx)}\n```\n"]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _sections(sub, [*path, name], ctx)
    return out


def render() -> str:
    from localspec.cli import cli

    head = ("# Command reference\n\nEvery command's `--help`, as the CLI prints it (generated: "
            "`python -m localspec.cli_reference > docs/cli.md`). The README lists the commands in a line each.\n\n")
    return head + "\n".join(_sections(cli, ["localspec"], None))


if __name__ == "__main__":
    print(render(), end="")
