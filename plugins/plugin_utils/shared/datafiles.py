# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The package's data files (plugins/plugin_utils/data/*.yml, plugins/plugin_utils/schemas/*.json), read once,
handed out as copies. Both folders sit inside the package (plugin_utils), so the checkout and the installed
collection read them at the same place.

Each file is parsed once and cached as pickled bytes (immutable); every caller unpickles a fresh
object it may mutate, so no call can change what the next one sees. Parsing the YAML again on every
call was most of a fleet plan's time (ports.yml and models.yml are read per host and per rank), and
unpickling is several times cheaper than copy.deepcopy of the parsed object.
"""

import functools
import json
import pickle
import os

import yaml

# this file is plugins/plugin_utils/shared/datafiles.py: the package (plugin_utils) is one level up
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIRS = {"data": os.path.join(_PACKAGE, "data"), "schemas": os.path.join(_PACKAGE, "schemas")}


@functools.lru_cache(maxsize=None)
def _text(folder, name):
    with open(os.path.join(_DIRS[folder], name), encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=None)
def _frozen(folder, name):
    text = _text(folder, name)
    return pickle.dumps(json.loads(text) if folder == "schemas" else yaml.safe_load(text))


def yaml_data(name):
    """A fresh copy of ``plugins/plugin_utils/data/<name>``."""
    return pickle.loads(_frozen("data", name))


def schema(name):
    """A fresh copy of ``plugins/plugin_utils/schemas/<name>``."""
    return pickle.loads(_frozen("schemas", name))
