"""The ``factstream`` command.

Built-in commands live in this package, one module per command or group (:mod:`.run`,
:mod:`.migrate`, :mod:`.tokens`, ...), and are added to the root's ``app`` (:mod:`.root`) below, in
the order ``--help`` lists them; plugins add theirs through ``register_commands``. Every
:class:`~factstream.errors.FactstreamError` is shown as one paragraph on stderr with exit code 2; an
unexpected exception is reported in one line (``FACTSTREAM_DEBUG=1`` shows the traceback).

``factstream.cli.state`` is the invocation's :class:`State` (:data:`.session.state`, which every
command reads when it runs); assigning it replaces that one, as a test's fresh invocation does.
"""

from __future__ import annotations

import logging
import os
import sys
import types

import typer

from factstream.cli import demo, export, migrate, new_stream, plugins, run, session, tokens
from factstream.cli.helptext import plain_metavars, plain_type, reflow_help
from factstream.cli.log_setup import setup_logging
from factstream.cli.root import app, lift_config_option
from factstream.cli.session import BUILTIN_COMMANDS, INTERRUPTED, State, err, out
from factstream.errors import FactstreamError, PluginError

__all__ = [
    "BUILTIN_COMMANDS",
    "INTERRUPTED",
    "State",
    "app",
    "err",
    "lift_config_option",
    "main",
    "out",
    "plain_metavars",
    "plain_type",
    "reflow_help",
]

# The built-in commands. ``--help`` lists commands in the order they are added here, then the groups.
app.command("plugins")(plugins.plugins_command)
app.add_typer(migrate.migrate_app, name="migrate")
app.add_typer(tokens.tokens_app, name="tokens")
app.command("run")(run.run_command)
app.command("demo")(demo.demo_command)
app.command("export")(export.export_command)
app.command("new-stream")(new_stream.new_stream_command)


class _Package(types.ModuleType):
    """This package as a module object whose ``state`` is :data:`.session.state`, read and assigned
    through: the commands read the state there, and a test that assigns ``factstream.cli.state`` (a
    fresh invocation) must replace the one they read, not add a second one beside it."""

    @property
    def state(self) -> State:
        return session.state

    @state.setter
    def state(self, value: State) -> None:
        session.state = value


sys.modules[__name__].__class__ = _Package


def _add_plugin_commands() -> None:
    state = session.state
    try:
        host = state.plugins
        commands = list(host.registry.commands)
    except PluginError as exc:
        state.plugin_error = exc
        return
    for reg in commands:
        spec = reg.spec
        if isinstance(spec.app, typer.Typer):
            app.add_typer(spec.app, name=spec.name, help=spec.help or None)
        else:
            app.command(spec.name, help=spec.help or None)(spec.app)


def _say_interrupted() -> None:
    """The one line an interrupted command ends with, with what the command had to add."""
    interrupted = session.state.interrupted
    err.print("interrupted" if interrupted is None else f"interrupted: {interrupted}", highlight=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    debug = os.environ.get("FACTSTREAM_DEBUG", "").lower() in {"1", "true", "yes"}
    try:
        if os.environ.get("FACTSTREAM_TRACE_HOOKS"):
            setup_logging(logging.WARNING)
        _add_plugin_commands()
        reflow_help(app)
        app(args=argv, prog_name="factstream")
    except FactstreamError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SystemExit as exc:
        if exc.code == INTERRUPTED:  # typer turns a command's KeyboardInterrupt into Exit(130), silently
            _say_interrupted()
        raise
    except KeyboardInterrupt:
        _say_interrupted()
        sys.exit(INTERRUPTED)
    except Exception as exc:
        if debug:
            raise
        err.print(
            f"[bold red]internal error:[/bold red] {type(exc).__name__}: {exc}\n"
            "This is a bug in factstream or a plugin; rerun with FACTSTREAM_DEBUG=1 for the traceback.",
            highlight=False,
        )
        sys.exit(1)
