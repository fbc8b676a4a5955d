"""argparse with a mistake reported as one line (`UserError`) instead of a usage block."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

from .errors import UserError


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one `UserError` line naming the command's help."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
        raise UserError(f"{message}; see `{self.prog} --help`")
