"""The package's data files (pd_deploy/data/*.yml, schemas/*.json), read once, handed out as copies.

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

# this file is pd_deploy/shared/datafiles.py: the package is one level up, the repository two
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIRS = {"data": os.path.join(_PACKAGE, "data"), "schemas": os.path.join(os.path.dirname(_PACKAGE), "schemas")}


@functools.lru_cache(maxsize=None)
def _text(folder, name):
    with open(os.path.join(_DIRS[folder], name), encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=None)
def _frozen(folder, name):
    text = _text(folder, name)
    return pickle.dumps(json.loads(text) if folder == "schemas" else yaml.safe_load(text))


def yaml_data(name):
    """A fresh copy of ``pd_deploy/data/<name>``."""
    return pickle.loads(_frozen("data", name))


def schema(name):
    """A fresh copy of ``schemas/<name>``."""
    return pickle.loads(_frozen("schemas", name))
