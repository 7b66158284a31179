#!/usr/bin/env bash
# The collection as an operator installs it (issue 22 #2), with nothing but what it declares:
# - the tarball of `ansible-galaxy collection build` at the top of the checkout (make collection);
# - a controller venv holding ansible-core (the version requirements-dev.txt pins, with its cryptography) and the Python
#   requirements the TARBALL declares (meta/execution-environment.yml -> dependencies.python);
# - the collections its MANIFEST.json declares (galaxy.yml dependencies: community.docker, and what that
#   one declares), rebuilt offline from the ansible wheel of the project venv (tools/wheel_collections.py),
#   all installed with `ansible-galaxy collection install --offline` into <dir>/collections.
# A dependency the collection forgets is missing here, so the deploy that uses it fails. No Ansible
# Galaxy; the venv needs PyPI (or pip's cache) once, then is reused while its inputs are the same.
#
#   tests/harness/collection-venv.sh <dir>
# Prints the venv's bin directory and the collections path, one a line.
set -euo pipefail
DIR="${1:?usage: collection-venv.sh <dir>}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROJECT_BIN="$(dirname "${PD_PROJECT_PYTHON:-$REPO/.venv/bin/python}")"
# ansible-core, and the cryptography it runs with (requirements-dev.txt says why it is pinned)
CORE="$(grep -E '^(ansible-core|cryptography)==' "$REPO/requirements-dev.txt")"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
TARBALLS="$DIR/tarballs"
rm -rf "$TARBALLS" "$DIR/collections" "$DIR/declared"
mkdir -p "$TARBALLS" "$DIR/declared"
(cd "$REPO" && "$PROJECT_BIN/ansible-galaxy" collection build --force --output-path "$TARBALLS" . >/dev/null)
TARBALL="$(ls "$TARBALLS"/pd-deploy-*.tar.gz)"

# what the tarball declares: collection dependencies, and the Python requirements file ansible-builder reads
"$PROJECT_BIN/python" - "$TARBALL" "$DIR/declared" <<'PY'
import json, sys, tarfile, yaml
tarball, out = sys.argv[1], sys.argv[2]
with tarfile.open(tarball) as tar:
    names = tar.getnames()
    manifest = json.load(tar.extractfile("MANIFEST.json"))
    ee = yaml.safe_load(tar.extractfile("meta/execution-environment.yml")) if "meta/execution-environment.yml" in names else {}
    python = ((ee or {}).get("dependencies") or {}).get("python")
    text = tar.extractfile(python).read().decode() if python and python in names else ""
with open(f"{out}/requirements.txt", "w") as handle:
    handle.write(text)
with open(f"{out}/collections.txt", "w") as handle:
    handle.write("\n".join(sorted(manifest["collection_info"].get("dependencies") or {})) + "\n")
PY

VENV="$DIR/venv"
STAMP="$(cat "$DIR/declared/requirements.txt"; echo "$CORE")"
if [[ ! -x "$VENV/bin/ansible-playbook" || "$(cat "$VENV/.pd-inputs" 2>/dev/null)" != "$STAMP" ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086  # one requirement a line
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $CORE -r "$DIR/declared/requirements.txt"
  printf '%s' "$STAMP" > "$VENV/.pd-inputs"
fi
# ansible-core only: the ansible package (and the collections it bundles) must not be there
if "$VENV/bin/pip" show --quiet ansible >/dev/null 2>&1 \
   || "$VENV/bin/python" -c 'import ansible_collections.community.docker' 2>/dev/null; then
  echo "collection-venv.sh: $VENV holds the ansible package; it must hold ansible-core only" >&2
  exit 1
fi

mapfile -t deps < <(grep -v '^$' "$DIR/declared/collections.txt" || true)
if ((${#deps[@]})); then
  "$PROJECT_BIN/python" "$REPO/tools/wheel_collections.py" --out "$TARBALLS" "${deps[@]}" >/dev/null
fi
# from outside the checkout, with no ansible.cfg of its (that one points at collections/ of the checkout)
(cd "$DIR" && env -u ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH="$DIR/collections" "$VENV/bin/ansible-galaxy" \
  collection install --offline -p "$DIR/collections" "$TARBALLS"/*.tar.gz >/dev/null)
echo "$VENV/bin"
echo "$DIR/collections"
