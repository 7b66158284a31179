"""tools/build-collection.py: the rewrites that turn the checkout's playbooks and roles into collection content."""

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("build_collection", os.path.join(REPO, "tools", "build-collection.py"))
build = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(build)


@pytest.fixture
def rewrite():
    return build.fqcn_rewriter("pd.deploy", {"pd_to_bytes": None, "pd_to_bytes_x": None, "pd_plan": None},
                               ["pd_plan", "pd_container"], ["pd_http_wait", "pd_write_files"],
                               {"deploy-pd.yml": "deploy_pd.yml", "validate.yml": "validate.yml"})


def test_playbook_names_become_python_identifiers():
    assert build.playbook_name("deploy-pd.yml") == "deploy_pd.yml"
    assert build.playbook_name("capacity-report.yml") == "capacity_report.yml"
    assert build.playbook_name("validate.yml") == "validate.yml"
    with pytest.raises(SystemExit):
        build.playbook_name("1st-run.yml")


def test_filters_in_pipes_and_map_get_the_collection_prefix(rewrite):
    assert rewrite("{{ x | pd_to_bytes }}") == "{{ x | pd.deploy.pd_to_bytes }}"
    assert rewrite("{{ x |pd_to_bytes_x(1) }}") == "{{ x |pd.deploy.pd_to_bytes_x(1) }}"
    assert rewrite("{{ xs | map('pd_to_bytes', 2) }}") == "{{ xs | map('pd.deploy.pd_to_bytes', 2) }}"
    # variables of the same spelling outside a pipe, and names already qualified, stay
    assert rewrite("{{ pd_to_bytes + 1 }}") == "{{ pd_to_bytes + 1 }}"
    assert rewrite("{{ x | pd.deploy.pd_to_bytes }}") == "{{ x | pd.deploy.pd_to_bytes }}"
    assert rewrite("{{ x | pd_to_bytes_total }}") == "{{ x | pd_to_bytes_total }}"


def test_roles_modules_and_imports_are_rewritten(rewrite):
    text = ("- name: Plan\n  ansible.builtin.include_role:\n    name: pd_plan\n"
            "- name: Wait\n  pd_http_wait:\n    checks: []\n"
            "- name: Validate\n  ansible.builtin.import_playbook: deploy-pd.yml\n"
            "- name: pd_plan is also a task title\n  pd_write_files:\n    files: []\n")
    assert rewrite(text) == (
        "- name: Plan\n  ansible.builtin.include_role:\n    name: pd.deploy.pd_plan\n"
        "- name: Wait\n  pd.deploy.pd_http_wait:\n    checks: []\n"
        "- name: Validate\n  ansible.builtin.import_playbook: deploy_pd.yml\n"
        "- name: pd_plan is also a task title\n  pd.deploy.pd_write_files:\n    files: []\n")


def test_build_output_moves_from_the_install_to_the_working_directory(rewrite):
    assert rewrite('pd_plan_build_dir: "{{ playbook_dir }}/../build"') == \
        "pd_plan_build_dir: \"{{ 'build' | pd.deploy.pd_abspath }}\""
    assert rewrite("{{ pd_ops_reports_dir | default(playbook_dir ~ '/../build/reports') }}") == \
        "{{ pd_ops_reports_dir | default(('build' | pd.deploy.pd_abspath) ~ '/reports') }}"


def test_filter_doc_comes_from_the_docstring_and_signature():
    def pd_demo(value, where="x", *, field=None):
        """One line.

        More text
        on two lines.
        """
    doc = build.filter_doc("pd_demo", pd_demo, "pd.deploy", "1.0.0")
    assert doc["DOCUMENTATION"]["short_description"] == "One line"
    assert doc["DOCUMENTATION"]["description"] == ["More text on two lines."]
    assert doc["DOCUMENTATION"]["options"]["_input"]["required"] is True
    assert doc["DOCUMENTATION"]["options"]["where"]["default"] == "x"
    assert "pd.deploy.pd_demo(where)" in doc["EXAMPLES"]
    assert doc["DOCUMENTATION"]["positional"] == "where"  # keyword-only field is not positional

    def pd_bare(value):
        pass
    with pytest.raises(SystemExit):
        build.filter_doc("pd_bare", pd_bare, "pd.deploy", "1.0.0")


def test_public_filter_page_is_the_checked_in_one_with_fqcn_examples(rewrite):
    checked_in = build._read(os.path.join(REPO, "filter_plugins", "pd_to_bytes.yml"))
    page = build.filter_page("pd_to_bytes", None, "pd.deploy", "1.0.0", rewrite)
    assert page == rewrite(checked_in) and page != checked_in
    assert "| pd.deploy.pd_to_bytes" in page and "type: raw" not in page

    def pd_private(value):
        """A filter no role uses."""
    assert "type: raw" in build.filter_page("pd_private", pd_private, "pd.deploy", "1.0.0", rewrite)
