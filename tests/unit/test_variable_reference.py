"""docs/reference/variables.md is what tools/variable_reference.py makes from the argument specs, the
schemas and the data files: CI fails while it is stale (`make docs` rewrites it)."""

import os

import yaml

from tools import variable_reference as tool  # tools/ is a plain folder of the checkout (pythonpath ".")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "reference", "variables.md")


def test_the_checked_in_page_is_current():
    assert tool.main(["--check"]) == 0, "docs/reference/variables.md is stale: run `make docs` and commit it"


def test_check_fails_on_a_stale_page_and_writing_fixes_it(tmp_path, capsys):
    out = tmp_path / "variables.md"
    out.write_text(tool.render().replace("pd_prechecks_skip", "pd_prechecks_skipped"), encoding="utf-8")
    assert tool.main(["--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
    assert tool.main(["--out", str(out)]) == 0
    assert tool.main(["--check", "--out", str(out)]) == 0


def test_every_source_variable_is_on_the_page():
    text = tool.render()
    for role in sorted(os.listdir(os.path.join(REPO, "roles"))):
        specs = os.path.join(REPO, "roles", role, "meta", "argument_specs.yml")
        with open(specs, encoding="utf-8") as handle:
            for entry in yaml.safe_load(handle)["argument_specs"].values():
                for name in entry.get("options") or {}:
                    assert f"`{name}`" in text, (role, name)
    for name in ("`pd_host_ram`", "`pd_cluster.model.path`", "`pd_cluster.decode.engine.max_num_seqs`",
                 "`pd_render_only`", "`pd_api_key`"):
        assert name in text
    assert "| `pd_cluster.decode.engine.max_num_seqs` | integer (>= 1) | `48` |" in text  # defaults.yml


def test_the_core_reads_the_role_variables_of_the_roles_without_reading_roles():
    # plugins/plugin_utils/data/role_variables.yml (written by `make docs`) is what validation accepts;
    # the first test fails while it differs from roles/, this one checks the core reads exactly it
    from ansible_collections.pd.deploy.plugins.plugin_utils.validate import inventory
    expected = {name for names in tool.role_variables().values() for name in names}
    assert inventory.role_defaults() == expected
    assert "pd_plan_build_dir" in expected and "pd_container_docker_socket" in expected


def test_a_stale_role_variables_file_fails_the_check(tmp_path, monkeypatch, capsys):
    roles = tmp_path / "roles"
    (roles / "pd_new" / "defaults").mkdir(parents=True)
    (roles / "pd_new" / "defaults" / "main.yml").write_text("---\npd_new_knob: 1\n", encoding="utf-8")
    assert tool.role_variables(str(roles)) == {"pd_new": ["pd_new_knob"]}
    monkeypatch.setattr(tool, "role_variables", lambda roles_dir=str(roles): {"pd_new": ["pd_new_knob"]})
    assert tool.main(["--check"]) == 1
    assert "role_variables.yml is stale" in capsys.readouterr().err
