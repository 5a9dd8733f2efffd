"""The command line: ``dpaudit <command>`` (the parser in :mod:`~dpaudit.cli.parser`, the
commands in :mod:`~dpaudit.cli.commands`).

Exit status (:class:`dpaudit.errors.ExitCode`): 0 = done (every audit consistent, or nothing
to audit), 1 = an audit found a violation, 2 = bad input or usage, 3 = an audit is
inconclusive (it could not have seen a violation of the claim), 4 = a model of the run failed
(its error is in the report).
With ``--json`` a command prints exactly one JSON object on stdout; progress bars, logs
and warnings go to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from dpaudit.allocator import keep_freed_memory
from dpaudit.cli.parser import build_parser
from dpaudit.errors import ExitCode, InputError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(message)s")
    if not args.verbose:  # tracebacks go to run.log (and to stderr with -v), not onto the user's terminal
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and handler.stream is sys.stderr:
                handler.setFormatter(_NoTraceback("%(message)s"))
    if sys.stderr.isatty():  # the bars show progress there; its log lines go to run.log only
        logging.getLogger().handlers[0].addFilter(lambda record: record.name != "dpaudit.progress")
    logging.captureWarnings(True)
    if argv is None:  # the command itself owns its process: freed tensors stay for the next step
        keep_freed_memory()
    if args.command != "accountant":
        from dpaudit.progress import quiet_libraries

        quiet_libraries()
    try:
        if not getattr(args, "json", False):
            return args.handler(args)
        # --json: stdout holds the one JSON object; whatever a plug-in or a user's loop prints goes to stderr
        args.stdout = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return args.handler(args)
    except InputError as err:
        print(f"dpaudit {args.command}: error: {err}", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as err:
        if err.errno is None:  # not the file system's: a bug, keep its traceback
            raise
        where = f": {err.filename}" if err.filename else ""
        print(f"dpaudit {args.command}: error: {err.strerror or err}{where} (nothing half-written is left; "
              "finished artifacts are kept)", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        hint = ""
        if args.command in ("run", "train") and args.out:
            again = "the same command without --force" if args.force else "the same command"
            hint = f" (finished stages are kept: rerun {again} with --out {args.out} to resume)"
        elif args.command == "attack":
            hint = " (finished stages are kept: rerun the same command to resume)"
        print(f"dpaudit {args.command}: interrupted{hint}", file=sys.stderr)
        if argv is None:  # the command itself: every artifact is settled, skip the slow teardown of torch & co
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(130)
        return 130


class _NoTraceback(logging.Formatter):
    """A log line without the traceback of the error it reports."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
