"""The argument parser of every ``repro`` command: a usage error is one line on stderr
(``repro <command>: error: ...; see --help``), not the usage block followed by the error."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)
