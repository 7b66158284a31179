#!/usr/bin/env python3
"""Build tarballs of collections the ``ansible`` wheel ships, offline, so they install beside pd.deploy.

pd.deploy depends on community.docker (galaxy.yml). The ansible 12.3.0 wheel of requirements-dev.txt
holds the version the tests run, installed under site-packages/ansible_collections/, but not as a tarball
and without a galaxy.yml (the wheel keeps the MANIFEST.json of the release and leaves out its tests and
CI files). This copies each installed collection, writes the galaxy.yml its MANIFEST.json describes and
runs ``ansible-galaxy collection build``: no Galaxy, no network.

Usage: python tools/wheel_collections.py [--out build/collection] [NAME ...]
Default names: community.docker and what it depends on. Prints each tarball's path.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ("community.docker",)
# MANIFEST.json collection_info keys that galaxy.yml takes as they are
_KEYS = ("namespace", "name", "version", "authors", "readme", "tags", "description", "license", "license_file",
         "dependencies", "repository", "documentation", "homepage", "issues")


def installed_dir(fqcn):
    """site-packages/ansible_collections/<ns>/<name> of this Python's ansible wheel."""
    import ansible_collections
    namespace, name = fqcn.split(".")
    for base in ansible_collections.__path__:
        path = os.path.join(base, namespace, name)
        if os.path.isfile(os.path.join(path, "MANIFEST.json")):
            return path
    raise SystemExit(f"{fqcn}: not installed with this Python's ansible package (pip install -r requirements-dev.txt)")


def galaxy_yml(manifest):
    info = manifest["collection_info"]
    data = {key: info[key] for key in _KEYS if info.get(key) not in (None, "", [])}
    data.setdefault("readme", "README.md")
    data.setdefault("authors", ["unknown"])
    data["dependencies"] = info.get("dependencies") or {}
    if not data.get("license") and not data.get("license_file"):
        data["license"] = ["GPL-3.0-or-later"]
    return data


def build(fqcn, out):
    """(tarball path, dependencies) of one installed collection."""
    source = installed_dir(fqcn)
    with open(os.path.join(source, "MANIFEST.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    data = galaxy_yml(manifest)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, fqcn)
        shutil.copytree(source, root, ignore=shutil.ignore_patterns("MANIFEST.json", "FILES.json", "__pycache__",
                                                                    "*.pyc"))
        if data.get("license_file") and not os.path.exists(os.path.join(root, data["license_file"])):
            data.pop("license_file")
            data.setdefault("license", ["GPL-3.0-or-later"])
        if not os.path.exists(os.path.join(root, data["readme"])):
            with open(os.path.join(root, data["readme"]), "w", encoding="utf-8") as handle:
                handle.write(f"# {fqcn}\n\nRebuilt from the ansible wheel by pd-deploy's tools/wheel_collections.py.\n")
        with open(os.path.join(root, "galaxy.yml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(data, handle, sort_keys=False)
        galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
        result = subprocess.run([galaxy if os.path.exists(galaxy) else "ansible-galaxy", "collection", "build",
                                 "--force", "--output-path", out, root], capture_output=True, text=True,
                                check=False, cwd=tmp)
        if result.returncode:
            raise SystemExit(f"{fqcn}: ansible-galaxy collection build failed:\n{result.stdout}{result.stderr}")
    tarball = os.path.join(out, f"{data['namespace']}-{data['name']}-{data['version']}.tar.gz")
    return tarball, sorted(data["dependencies"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "build", "collection"))
    parser.add_argument("names", nargs="*", default=list(DEFAULT))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    todo, done = list(args.names), set()
    while todo:
        fqcn = todo.pop(0)
        if fqcn in done:
            continue
        tarball, deps = build(fqcn, os.path.abspath(args.out))
        done.add(fqcn)
        todo.extend(deps)
        print(tarball)
    return 0


if __name__ == "__main__":
    sys.exit(main())
