"""Issue 12 #5: build output per inventory, stale files removed.

Before, every run wrote build/plan.json and build/render/<host>/, whatever the inventory: a render of
one fleet after another left both fleets' launch specs side by side, and a host removed from the
inventory kept its old launch specs there. Now the default is build/<inventory>/ and the directory
holds exactly the files of the last run (only files pd-deploy wrote are removed).
"""

import json
import os
import pathlib
import shutil
import uuid

import pytest
import yaml

from pd_render_helpers import REPO, assert_no_traceback, files_under, run_playbooks

pytestmark = pytest.mark.ansible

EXAMPLE = os.path.join(REPO, "inventories", "example")


def _inventory(path, drop_cluster=None):
    """A copy of inventories/example at ``path``, without the cluster ``drop_cluster`` and its hosts."""
    shutil.copytree(EXAMPLE, path)
    if drop_cluster:
        hosts_yml = os.path.join(path, "hosts.yml")
        with open(hosts_yml, encoding="utf-8") as handle:
            inv = yaml.safe_load(handle)
        groups = inv["all"]["children"]
        gone = set(groups["pd_clusters"]["children"].pop(drop_cluster)["hosts"])
        for role in ("prefill", "decode"):
            groups[role]["hosts"] = {h: v for h, v in groups[role]["hosts"].items() if h not in gone}
        with open(hosts_yml, "w", encoding="utf-8") as handle:
            yaml.safe_dump(inv, handle)
    return path


def _render(path, home, *extra):
    run = run_playbooks({"r": ["playbooks/deploy_pd.yml", "-i", str(path), "-e", "pd_render_only=true", *extra]},
                        home)["r"]
    assert run.rc == 0, str(run)
    assert_no_traceback(run)
    return run


def _expected(build):
    """The files a render-only run of plan.json's plan writes: plan, capacity per cluster, spec per container."""
    plan = json.loads((build / "plan.json").read_text())
    out = {"plan.json"} | {f"render/{c}/capacity.{x}" for c in plan["clusters"] for x in ("json", "md")}
    for host, entry in plan["hosts"].items():
        out |= {f"render/{host}/{s['name']}.json" for s in entry["specs"]}
        if entry.get("proxy"):
            out.add(f"render/{host}/{entry['proxy']['name']}.json")
    return out


def test_two_inventories_rendered_one_after_the_other_do_not_mix(tmp_path, ansible_home):
    tag = uuid.uuid4().hex[:8]
    east = _inventory(tmp_path / f"pdtest-{tag}-east")
    west = _inventory(tmp_path / f"pdtest-{tag}-west", drop_cluster="cluster_b")
    builds = [os.path.join(REPO, "build", os.path.basename(p)) for p in (east, west)]
    try:
        _render(east, ansible_home)
        run = _render(west, ansible_home)
        east_b, west_b = (pathlib.Path(b) for b in builds)
        assert json.loads((east_b / "plan.json").read_text())["clusters"].keys() == {"cluster_a", "cluster_b"}
        assert json.loads((west_b / "plan.json").read_text())["clusters"].keys() == {"cluster_a"}
        assert set(files_under(west_b)) - {".pd-deploy-files.json"} == _expected(west_b)
        assert set(files_under(east_b)) - {".pd-deploy-files.json"} == _expected(east_b)
        assert not any(f.startswith("render/b-") for f in files_under(west_b))
        assert f"{builds[1]}/render/<host>/" in run.output   # the summary names the real directory
    finally:
        for build in builds:
            shutil.rmtree(build, ignore_errors=True)


def test_a_host_removed_from_the_inventory_leaves_no_stale_file(tmp_path, ansible_home):
    build = tmp_path / "build"
    fleet = _inventory(tmp_path / "fleet")
    _render(fleet, ansible_home, "-e", f"pd_plan_build_dir={build}")
    before = set(files_under(build))
    assert any(f.startswith("render/b-d1/") for f in before)
    # files pd-deploy did not write stay where they are, even in a folder it empties
    for mine in ("notes.md", "render/b-d1/operator-notes.txt"):
        (build / mine).write_text("mine\n")
    shutil.rmtree(fleet)
    _inventory(fleet, drop_cluster="cluster_b")
    _render(fleet, ansible_home, "-e", f"pd_plan_build_dir={build}")
    after = set(files_under(build)) - {".pd-deploy-files.json", "notes.md", "render/b-d1/operator-notes.txt"}
    assert after == _expected(build)
    assert not [f for f in after if f.startswith(("render/b-", "render/cluster_b"))]
    assert (build / "render" / "b-d1" / "operator-notes.txt").read_text() == "mine\n"
    assert not (build / "render" / "b-p0").exists()   # emptied folders go too
