"""docs/reference/variables.md is what tools/variable_reference.py makes from the argument specs, the
schemas and the data files: CI fails while it is stale (`make docs` rewrites it)."""

import importlib.util
import os

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("variable_reference", os.path.join(REPO, "tools", "variable_reference.py"))
tool = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(tool)
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
