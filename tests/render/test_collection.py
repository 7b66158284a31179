"""The Ansible collection pd.deploy: built from the checkout, installed offline, run from elsewhere.

What the collection must give (issue 12 #2): `ansible-playbook pd.deploy.deploy_pd -i <inventory>`
from any directory, with no checkout, no repository ansible.cfg and the inventory outside the
package, rendering the same launch specs as the checkout; `ansible-doc` for every filter; and the
checkout's own top-level `ansible-playbook deploy-pd.yml`.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from pd_render_helpers import BIN, REPO

pytestmark = pytest.mark.ansible

TIMEOUT_S = 300


def _run(cmd, cwd, env):
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT_S, check=False)
    return proc.returncode, proc.stdout


def _clean_env(home, **extra):
    """The caller's environment without any ANSIBLE_* setting (no repository ansible.cfg reaches the run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"), "ANSIBLE_NOCOLOR": "1",
                "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}, **extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the tarball with `ansible-galaxy collection build` at the top of the checkout (what `make
    collection` runs: the checkout is the collection, nothing is copied or rewritten first) and install it
    offline into a temp dir."""
    base = tmp_path_factory.mktemp("collection")
    rc, out = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                    str(base / "build"), "."], REPO, _clean_env(base))
    assert rc == 0, out
    tarball = glob.glob(str(base / "build" / "pd-deploy-*.tar.gz"))[0]
    rc, out = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", tarball,
                    "-p", str(base / "collections")], str(base), _clean_env(base))
    assert rc == 0, out
    assert os.path.isfile(base / "collections" / "ansible_collections" / "pd" / "deploy" / "MANIFEST.json")
    return base


def _renders(build_dir):
    """{relative path: parsed JSON} of every launch spec and capacity file a render-only run wrote."""
    root = os.path.join(build_dir, "render")
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "*.json"))):
        with open(path, encoding="utf-8") as handle:
            out[os.path.relpath(path, root)] = json.load(handle)
    return out


def _spec_hashes(renders):
    return {path: doc["labels"]["pd.spec-hash"] for path, doc in renders.items() if "labels" in doc}


def test_collection_renders_the_checkouts_specs_from_another_directory(installed, tmp_path):
    # the inventory is a copy outside the repository, as /etc/pd/prod would be
    inventory = tmp_path / "etc-pd-prod"
    shutil.copytree(os.path.join(REPO, "inventories", "example"), inventory)
    elsewhere = tmp_path / "xyz"
    elsewhere.mkdir()
    env = _clean_env(tmp_path / "home", ANSIBLE_COLLECTIONS_PATH=str(installed / "collections"))

    rc, out = _run([os.path.join(BIN, "ansible-playbook"), "pd.deploy.validate", "-i", str(inventory)], str(elsewhere), env)
    assert rc == 0, out
    assert "failed=0" in out and "a-p0" in out, out

    # without the checkout's ansible.cfg a mistyped inventory path still fails (no cluster), exit non-zero
    rc, out = _run([os.path.join(BIN, "ansible-playbook"), "pd.deploy.validate", "-i", str(tmp_path / "etc-pd-prd")],
                   str(elsewhere), env)
    assert rc != 0 and "holds no cluster" in out, out

    rc, out = _run([os.path.join(BIN, "ansible-playbook"), "pd.deploy.deploy_pd", "-i", str(inventory),
                    "-e", "pd_render_only=true"], str(elsewhere), env)
    assert rc == 0, out
    # output lands in <working directory>/build/<inventory>, not inside the installed collection
    assert os.listdir(elsewhere / "build") == ["etc-pd-prod"]
    collection_build = _renders(elsewhere / "build" / "etc-pd-prod")
    assert not os.path.exists(installed / "collections" / "ansible_collections" / "pd" / "deploy" / "build")
    assert not glob.glob(str(installed / "collections" / "**" / "plan.json"), recursive=True)

    # the checkout's own top-level entry point, with the repository's ansible.cfg, is the reference
    repo_build = tmp_path / "repo-build"
    rc, out = _run([os.path.join(BIN, "ansible-playbook"), "deploy-pd.yml", "-i", "inventories/example",
                    "-e", "pd_render_only=true", "-e", f"pd_plan_build_dir={repo_build}"],
                   REPO, _clean_env(tmp_path / "home-repo", ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg")))
    assert rc == 0, out
    repo_renders = _renders(repo_build)

    # every host of the example inventory (inventories/example/hosts.yml) has its launch specs
    hosts = {path.split(os.sep)[0] for path in _spec_hashes(repo_renders)}
    assert hosts == {"a-p0", "a-d0", "b-p0", "b-d0", "b-d1"}
    assert _spec_hashes(collection_build) == _spec_hashes(repo_renders)
    assert collection_build == repo_renders


def test_top_level_entry_playbooks_import_the_playbooks_directory():
    # `ansible-playbook deploy-pd.yml` at the top of the checkout is the documented usage
    for name in ("deploy-pd.yml", "validate.yml", "stop-pd.yml", "bootstrap-hosts.yml", "prechecks.yml", "remove-hosts.yml"):
        with open(os.path.join(REPO, name), encoding="utf-8") as handle:
            text = handle.read()
        # the collection's playbook of that name: an identifier (pd.deploy.deploy_pd), so deploy_pd.yml
        assert f"ansible.builtin.import_playbook: playbooks/{name.replace('-', '_')}" in text, name
        assert os.path.isfile(os.path.join(REPO, "playbooks", name.replace("-", "_"))), name


def test_every_filter_has_ansible_doc(installed, tmp_path):
    env = _clean_env(tmp_path / "home", ANSIBLE_COLLECTIONS_PATH=str(installed / "collections"))
    rc, out = _run([os.path.join(BIN, "ansible-doc"), "-t", "filter", "-l", "pd.deploy", "-j"], str(tmp_path), env)
    assert rc == 0, out
    listed = set(json.loads(out))
    # the installed collection's filters are exactly those with a checked-in page (plugins/filter/<name>.yml;
    # tests/unit/plugins/filter/test_filter_docs.py: one for each filter, and a filter only for a use), and render
    pages = glob.glob(os.path.join(REPO, "plugins", "filter", "pd_*.yml"))
    expected = {f"pd.deploy.{os.path.basename(p)[:-4]}" for p in pages}
    assert len(expected) > 40 and "pd.deploy.pd_abspath" in expected
    assert listed == expected

    rc, out = _run([os.path.join(BIN, "ansible-doc"), "-t", "filter", "-j", *sorted(expected)], str(tmp_path), env)
    assert rc == 0, out
    docs = json.loads(out)
    assert set(docs) == expected
    for name, entry in docs.items():
        doc = entry["doc"]
        assert doc["short_description"] and doc["description"], name
        assert "_input" in doc["options"], name
        assert name in entry["examples"], name

    rc, out = _run([os.path.join(BIN, "ansible-doc"), "-t", "filter", "pd.deploy.pd_to_bytes"], str(tmp_path), env)
    assert rc == 0 and "200GiB" in out, out
