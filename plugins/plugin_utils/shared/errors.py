# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one exception the core raises.

It subclasses Ansible's ``AnsibleFilterError`` so that a bad value turns into a clean task failure
(no traceback) when it surfaces through a filter, while staying an ordinary ``ValueError``-like
exception for direct Python callers and tests.
"""

from ansible.errors import AnsibleFilterError


class PdError(AnsibleFilterError):
    """A configuration value the core cannot accept.

    The message always names where the problem is, the field, what is wrong and what to do:
    ``pd_split_per_rank: total: 200GiB does not divide over 7 ranks (remainder 2 bytes) — ...``.
    """

    def __init__(self, where, field, problem, fix=None):
        self.where = where
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{where}: {field}: {problem}"
        if fix:
            text += f" — {fix}"
        super().__init__(text)
