#!/usr/bin/env bash
# Lint and document-check the BUILT collection, as Galaxy / Automation Hub would see it (issue 22 #4):
# the tarball of `ansible-galaxy collection build`, installed offline with its declared dependencies into
# a lean venv (tests/harness/collection-venv.sh), then
# - ansible-lint (production profile, offline) inside the installed ansible_collections/pd/deploy;
# - ansible-doc of every module, action and filter page the artifact ships, with the lean venv.
# ansible-test sanity is not run here: each sanity test makes its own venv and bootstraps pip from
# ci-files.testing.ansible.com, which this machine cannot reach (docs/development.md).
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
