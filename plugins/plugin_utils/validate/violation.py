# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one shape every check of pd-deploy reports in (docs/design.md "Violations").

A violation is a plain dict, so that Jinja, JSON reports and ``rules.format_violation`` read it
without knowing this module: ``{level, where, field, message, fix}``. ``Violation`` names that shape
for readers and type checkers; ``violation`` and ``error`` build one. Errors block the deploy,
warnings are printed.
"""

from typing import TypedDict

#: The levels a violation can have, most severe first.
LEVELS = ("error", "warning")


class Violation(TypedDict):
    """``level``: "error" or "warning"; ``where``: ``<cluster>/<role>[/instance i][@host]`` (or a host,
    a playbook); ``field``: the operator's field; ``message``: what is wrong; ``fix``: what to do."""

    level: str
    where: str
    field: str
    message: str
    fix: str


def violation(level, where, field, message, fix) -> Violation:
    """One violation of ``level`` ("error" or "warning")."""
    return Violation(level=level, where=where, field=field, message=message, fix=fix)


def error(where, field, message, fix) -> Violation:
    """One violation that blocks the deploy."""
    return violation("error", where, field, message, fix)
