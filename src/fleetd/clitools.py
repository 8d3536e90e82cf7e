"""
The frame both command-line tools share: C{fleetctl} (the owner's, in
L{fleetd.cli}) and C{fleetd-agent} (the node's, in L{fleetd.agent}).

A usage mistake or a failure is one line on stderr naming the tool, and a
non-zero exit status, never a traceback; C{--json} prints one JSON
document on one line instead of the lines meant for people (and, where a
tool asks for it, a failure as one too: L{errorDocument}). Both tools
import this module; it imports neither.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any, ClassVar, NoReturn


class CLIError(Exception):
    """
    A failure to report as one line on stderr, exiting with C{status}.

    @ivar fields: more members of the failure's JSON document
        (L{errorDocument}), e.g. the HTTP status fleetd answered with.
    """

    def __init__(
        self, message: str, status: int = 1, *, fields: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.fields = {} if fields is None else fields


class Parser(argparse.ArgumentParser):
    """
    An argument parser whose usage mistakes are one L{CLIError} line:
    C{PROG: message}, exit status L{usageStatus}. Pass it as the
    C{parser_class} of subcommands, so they answer the same way.
    """

    usageStatus: ClassVar[int] = 2
    # Whether the line names the subcommand (C{fleetctl device add: ...})
    # or only the tool (C{fleetd-agent: ...}).
    namesCommand: ClassVar[bool] = True

    def error(self, message: str) -> NoReturn:
        where = self.prog if self.namesCommand else self.prog.split()[0]
        raise CLIError(f"{where}: {message}", self.usageStatus)


def addJSONOption(parser: argparse.ArgumentParser, *, after: bool = False) -> None:
    """
    C{--json} on C{parser}: the tool's global flag, or (C{after}) the same
    flag accepted again after a subcommand's action; absent there, the
    global one stands.
    """
    if after:
        parser.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
        )
    else:
        parser.add_argument("--json", action="store_true", help="print JSON")


def acceptJSONAnywhere(parser: argparse.ArgumentParser) -> None:
    """
    C{--json} before or after any subcommand (C{fleetctl --json status w1},
    C{fleetctl status w1 --json}, C{fleetctl device --json list}): the flag
    on every subcommand parser below C{parser} that lacks it, as
    L{addJSONOption}'s C{after} form. Call once all subcommands exist.
    """
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in action.choices.values():
            if "--json" not in sub._option_string_actions:
                addJSONOption(sub, after=True)
            acceptJSONAnywhere(sub)


def writeJSON(out: IO[str], document: Any, *, sortKeys: bool = False) -> None:
    """The C{--json} output: C{document} on one line."""
    out.write(json.dumps(document, sort_keys=sortKeys) + "\n")


def errorDocument(error: CLIError) -> dict[str, Any]:
    """
    A failure as C{--json} prints it: C{{"error": LINE, "status": EXIT}}
    and the error's own L{fields <CLIError.fields>}; C{status} is the exit
    status, as C{$?} has it.
    """
    return {"error": str(error), "status": error.status, **error.fields}


def runMain(
    tool: str,
    body: Callable[[], int],
    out: IO[str],
    err: IO[str],
    *,
    jsonErrors: Callable[[], bool] | None = None,
) -> int:
    """
    Run a tool's C{body} and return its exit status. A L{CLIError} is one
    line on C{err} (prefixed with C{tool} unless it names it already) and
    its status; an interrupt is one line and 130; a reader that went away
    (C{fleetctl journal | head}) is not an error. When C{jsonErrors()} says
    so (C{--json} was given), the failure is also its L{errorDocument} on
    C{out}, so that C{out} always holds one JSON document.
    """
    try:
        return body()
    except CLIError as e:
        return _fail(tool, e, out, err, jsonErrors)
    except KeyboardInterrupt:
        return _fail(tool, CLIError("interrupted", 130), out, err, jsonErrors)
    except BrokenPipeError:
        if out is sys.stdout:  # keep the interpreter's final flush quiet
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            finally:
                os.close(devnull)
        return 0


def _fail(
    tool: str,
    error: CLIError,
    out: IO[str],
    err: IO[str],
    jsonErrors: Callable[[], bool] | None,
) -> int:
    line = str(error)
    err.write(f"{line}\n" if line.startswith(tool) else f"{tool}: {line}\n")
    if jsonErrors is not None and jsonErrors():
        try:
            writeJSON(out, errorDocument(error))
        except BrokenPipeError:
            pass  # the reader went away: the line on err stands
    return error.status
