"""The package's data files (pd_deploy/data/*.yml, schemas/*.json), read once, handed out as copies.

The parsed text is cached, never the object: every caller gets a fresh copy it may mutate, so no
call can change what the next one sees.
"""

import functools
import json
import os

import yaml

_HERE = os.path.dirname(os.path.abspath(__file__))
_DIRS = {"data": os.path.join(_HERE, "data"), "schemas": os.path.join(os.path.dirname(_HERE), "schemas")}


@functools.lru_cache(maxsize=None)
def _text(folder, name):
    with open(os.path.join(_DIRS[folder], name), encoding="utf-8") as handle:
        return handle.read()


def yaml_data(name):
    """A fresh copy of ``pd_deploy/data/<name>``."""
    return yaml.safe_load(_text("data", name))


def schema(name):
    """A fresh copy of ``schemas/<name>``."""
    return json.loads(_text("schemas", name))
