#!/usr/bin/env bash
# Lint and document-check the BUILT collection, as Galaxy / Automation Hub would see it (issue 22 #4):
# the tarball of `ansible-galaxy collection build`, installed offline with its declared dependencies into
# a lean venv (tests/harness/collection-venv.sh), then
# - ansible-lint (production profile, offline) inside the installed ansible_collections/pd/deploy;
# - ansible-doc of every module, action and filter page the artifact ships, with the lean venv;
# - ansible-test sanity (the lean venv's ansible-core) inside the installed ansible_collections/pd/deploy.
#   Each sanity test runs in a venv of its own that ansible-test makes and bootstraps with get-pip.py from
#   ci-files.testing.ansible.com, out of reach here; tests/harness/get_pip_from_wheel.py stands in for it
#   from ansible-test's cache in a HOME of this script's own (<dir>/sanity-home), with the pip wheel of
#   the version ansible-test pins, downloaded from PyPI. The sanity venvs then take ansible-test's own
#   pinned requirements from PyPI, once: they are kept in <dir>/sanity-home between runs.
#
#   tests/harness/check-artifact.sh [dir]      (make check-collection; default dir /tmp/pd-check-collection)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-/tmp/pd-check-collection}"
mapfile -t out < <(bash "$REPO/tests/harness/collection-venv.sh" "$DIR")
BIN="${out[0]}"; COLLECTIONS="${out[1]}"
ROOT="$COLLECTIONS/ansible_collections/pd/deploy"
LINT="$(dirname "${PD_PROJECT_PYTHON:-$REPO/.venv/bin/python}")/ansible-lint"
export ANSIBLE_COLLECTIONS_PATH="$COLLECTIONS"
unset ANSIBLE_CONFIG

echo "== ansible-lint of the installed artifact ($ROOT)"
(cd "$ROOT" && "$LINT" --offline --profile production --nocolor)

echo "== ansible-doc of every module, action and filter page of the artifact"
mapfile -t modules < <(cd "$ROOT/plugins/modules" && ls pd_*.py | sed 's/\.py$//; s/^/pd.deploy./')
mapfile -t filters < <(cd "$ROOT/plugins/filter" && ls pd_*.yml | sed 's/\.yml$//; s/^/pd.deploy./')
(cd "$DIR" && "$BIN/ansible-doc" --json "${modules[@]}" >/dev/null)
(cd "$DIR" && "$BIN/ansible-doc" -t filter --json "${filters[@]}" >/dev/null)
echo "ok: ${#modules[@]} modules, ${#filters[@]} filters render"

# every test of `ansible-test sanity --list-tests` (validate-modules, ansible-doc, import, compile, pep8, pylint,
# yamllint, ...); nothing is ignored (no tests/sanity/ignore-*.txt): a finding fails
echo "== ansible-test sanity of the installed artifact"
SANITY_HOME="$DIR/sanity-home"
CACHE="$SANITY_HOME/.ansible/test/cache"
TEST_LIB="$("$BIN/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')"
# the pip version ansible-test bootstraps (python_requirements.get_venv_packages: pip='<version>')
PIP_VERSION="$(sed -n "s/^ *pip='\([0-9.]*\)',\{0,1\}\$/\1/p" "$TEST_LIB/_internal/python_requirements.py")"
[[ -n "$PIP_VERSION" ]] || { echo "check-artifact.sh: no pip version in $TEST_LIB/_internal/python_requirements.py" >&2; exit 1; }
mkdir -p "$CACHE"
if [[ ! -f "$CACHE/pip-$PIP_VERSION-py3-none-any.whl" ]]; then
  "$BIN/pip" download --quiet --disable-pip-version-check --no-deps --only-binary :all: --dest "$CACHE" "pip==$PIP_VERSION"
fi
cp "$REPO/tests/harness/get_pip_from_wheel.py" "$CACHE/get_pip_${PIP_VERSION//./_}.py"
PYTHON_VERSION="$("$BIN/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
(cd "$ROOT" && HOME="$SANITY_HOME" "$BIN/ansible-test" sanity --color no --python "$PYTHON_VERSION")
