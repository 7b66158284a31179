# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Strings that reach argv, env, labels, paths and file names, and names as messages print them.

- ``shown(name)``: a host, cluster or key name as every message prints it: printable ASCII as is,
  anything else escaped (``b-d1\\u200b``), so an operator never reads "b-d1" for a name that is not.
- ``unsafe(value)``: the characters of a string no launch spec may carry: control characters (line
  breaks, tabs, NUL, DEL, C1), format characters (zero-width, bidirectional overrides) and the
  Unicode line / paragraph separators. A line break in an env value splits the env file Docker and
  the shell read; an invisible one makes two names that print alike.
- ``string_violations(value, where, prefix)``: one violation per string (key or value) of a YAML
  value that holds such a character, naming its dotted path.
"""

import unicodedata

from ..validate.violation import violation

#: Unicode categories refused in strings: control, format, line separator, paragraph separator
UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def _escaped(char):
    return char.encode("unicode_escape").decode("ascii")


def shown(name):
    """``name`` as messages print it: printable ASCII kept, every other character escaped."""
    name = str(name)
    if all(" " <= c <= "~" for c in name):
        return name
    return "".join(c if " " <= c <= "~" else _escaped(c) for c in name)


def unsafe(value):
    """The refused characters of ``value`` (a str), in order, no repeats; [] for a clean string."""
    found = []
    for char in value if isinstance(value, str) else ():
        if unicodedata.category(char) in UNSAFE_CATEGORIES and char not in found:
            found.append(char)
    return found


def visible(line):
    """``line`` with every refused character escaped (the rest, — or ³ included, kept)."""
    return "".join(_escaped(c) if unicodedata.category(c) in UNSAFE_CATEGORIES else c for c in str(line))


def _what(chars):
    names = []
    for char in chars:
        label = {"\n": "a line break", "\r": "a carriage return", "\t": "a tab"}.get(char)
        names.append(label or f"{_escaped(char)} ({unicodedata.name(char, 'a control character').lower()})")
    return ", ".join(names)


def string_violations(value, where, prefix, level="error"):
    """Violations for every key or string value below ``value`` holding a refused character."""
    out = []

    def walk(item, path):
        if isinstance(item, dict):
            for key, sub in item.items():
                sub_path = f"{path}.{shown(key)}" if path else shown(key)
                if unsafe(key):
                    out.append(_violation(level, where, sub_path, f"the key {shown(key)!s} holds", unsafe(key)))
                walk(sub, sub_path)
        elif isinstance(item, list):
            for index, sub in enumerate(item):
                walk(sub, f"{path}[{index}]")
        elif unsafe(item):
            out.append(_violation(level, where, path, f"'{shown(item)}' holds" if len(item) <= 60 else "the value holds",
                                  unsafe(item)))

    walk(value, prefix)
    return out


def _violation(level, where, field, head, chars):
    return violation(level, where, field,
                     f"{head} {_what(chars)}, which breaks the argv, env file, label or path it reaches "
                     "(or prints like another name)",
                     "retype the value without it (look for a pasted line break or an invisible character)")
