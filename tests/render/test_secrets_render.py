"""issue 12 #3: a vault-encrypted pd_api_key never appears in clear in what the playbooks write or print.

The example inventory is copied, cluster_a gets ``pd_api_key: !vault`` (encrypted here with the test
vault password tests/fixtures/secrets/vault-pass.txt, so the ciphertext is not a checked-in copy of
the code's output), then a render-only deploy (-vv) and a capacity report run; every file they write
and everything they print is searched for the key.
"""

import json
import os
import shutil
import subprocess

import pytest

from pd_render_helpers import BIN, REPO, assert_no_traceback, files_under, run_playbooks

pytestmark = pytest.mark.ansible

KEY = "sk-pd-render-test-5a4b3c2d1e0f9a8b7c6d5e4f"
VAULT_PASS = os.path.join(REPO, "tests", "fixtures", "secrets", "vault-pass.txt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    root = tmp_path_factory.mktemp("secrets")
    inv = root / "inv"
    shutil.copytree(os.path.join(REPO, "inventories", "example"), inv)
    vaulted = subprocess.run(
        [os.path.join(BIN, "ansible-vault"), "encrypt_string", "--vault-password-file", VAULT_PASS,
         "--name", "pd_api_key", KEY],
        cwd=REPO, capture_output=True, text=True, check=True, env=dict(os.environ, ANSIBLE_HOME=str(ansible_home)))
    assert KEY not in vaulted.stdout and "!vault" in vaulted.stdout
    with open(inv / "group_vars" / "cluster_a.yml", "a", encoding="utf-8") as handle:
        handle.write(vaulted.stdout)
    vault = ["--vault-password-file", VAULT_PASS]
    wrong = root / "wrong-pass.txt"
    wrong.write_text("not-the-password\n")
    out = run_playbooks({
        "render": ["playbooks/deploy_pd.yml", "-i", str(inv), "-e", "pd_render_only=true", "-vv",
                   "-e", f"pd_plan_build_dir={root / 'build'}", *vault],
        "no_password": ["playbooks/validate.yml", "-i", str(inv)],
        "wrong_password": ["playbooks/validate.yml", "-i", str(inv), "--vault-password-file", str(wrong)],
        "capacity": ["playbooks/capacity_report.yml", "-i", str(inv), "-e", f"pd_ops_reports_dir={root / 'reports'}",
                     "-e", f"pd_plan_build_dir={root / 'build-capacity'}", *vault],
    }, ansible_home)
    return root, out


def test_runs_succeed(runs):
    _, out = runs
    for name, run in out.items():
        assert run.rc == (2 if name.endswith("_password") else 0), str(run)
        assert_no_traceback(run)


def test_without_the_vault_password_validation_says_so(runs):
    _, out = runs
    run = out["no_password"]
    assert "pd_api_key: the key cannot be read" in run.output and "--ask-vault-pass" in run.output, str(run)
    assert "no vault password was given" in run.output and "group_vars/cluster_a.yml:" in run.output, str(run)


def test_a_wrong_vault_password_is_told_apart_from_a_missing_one(runs):
    """issue 21: both got "a vault value without its password?"."""
    _, out = runs
    run = out["wrong_password"]
    assert "the vault password given does not decrypt it" in run.output, str(run)
    assert "no vault password was given" not in run.output and "encrypted with" in run.output, str(run)


def test_no_written_file_holds_the_key(runs):
    root, _ = runs
    written = [p for d in ("build", "build-capacity", "reports") for p in
               (os.path.join(d, f) for f in files_under(root / d))]
    assert any(p.startswith("build/render/") for p in written) and any(p.startswith("reports/") for p in written)
    leaks = [p for p in written if KEY.encode() in (root / p).read_bytes()]
    assert leaks == []


def test_nothing_printed_holds_the_key(runs):
    _, out = runs
    for name, run in out.items():
        assert KEY not in run.output, name


def test_renders_show_the_redaction_where_the_key_goes(runs):
    root, _ = runs
    render = root / "build" / "render"
    specs = {f: json.loads((render / host / f).read_text()) for host in os.listdir(render)
             for f in os.listdir(render / host) if f.startswith("pd-cluster_") and f.endswith(".json")}
    keyed = {f: s for f, s in specs.items() if f.startswith("pd-cluster_a-")}
    assert len(keyed) == 5  # cluster_a: 2 prefill + 2 decode ranks and the proxy
    for name, spec in keyed.items():
        var = "OPENAI_API_KEY" if name.endswith("-proxy.json") else "VLLM_API_KEY"
        assert spec["env"][var].startswith("<redacted: sha256:"), name
    for name, spec in specs.items():
        if name.startswith("pd-cluster_b-"):  # no key in its group_vars
            assert "VLLM_API_KEY" not in spec["env"] and "OPENAI_API_KEY" not in spec["env"], name
