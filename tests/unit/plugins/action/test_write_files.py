"""The pd_write_files action plugin writes only what changed, creating folders."""

import os

from ansible_collections.pd.deploy.plugins.action import pd_write_files


def test_writes_new_files_in_new_folders_with_the_mode(tmp_path):
    files = [{"path": str(tmp_path / "render" / "h1" / "a.json"), "content": "{}\n"},
             {"path": str(tmp_path / "plan.json"), "content": "plan\n"}]
    changed = pd_write_files.write_files(files, 0o640)
    assert changed == [f["path"] for f in files]
    assert (tmp_path / "render" / "h1" / "a.json").read_text() == "{}\n"
    assert oct((tmp_path / "plan.json").stat().st_mode & 0o777) == "0o640"


def test_second_write_of_the_same_content_changes_nothing_and_a_changed_file_is_rewritten(tmp_path):
    files = [{"path": str(tmp_path / "x" / "a"), "content": "1"}, {"path": str(tmp_path / "b"), "content": "2"}]
    pd_write_files.write_files(files)
    assert pd_write_files.write_files(files) == []
    files[1]["content"] = "3"
    assert pd_write_files.write_files(files) == [files[1]["path"]]
    assert (tmp_path / "b").read_text() == "3"
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def _files(root, names):
    return [{"path": str(root / n), "content": n + "\n"} for n in names]


def test_sync_removes_files_of_the_last_run_it_does_not_write_again_and_nothing_else(tmp_path):
    first = ["plan.json", "render/h1/a.json", "render/h2/b.json", "render/h2/c.json"]
    changed, removed, owner = pd_write_files.sync_files(_files(tmp_path, first), str(tmp_path), "inv1")
    assert (sorted(changed), removed, owner) == (sorted(str(tmp_path / n) for n in first), [], None)
    (tmp_path / "render" / "h1" / "notes.txt").write_text("mine")   # not written by pd_write_files
    (tmp_path / "outside.txt").write_text("mine")
    second = ["plan.json", "render/h2/b.json"]
    changed, removed, owner = pd_write_files.sync_files(_files(tmp_path, second), str(tmp_path), "inv1")
    assert changed == [] and owner == "inv1"
    assert sorted(removed) == sorted(str(tmp_path / n) for n in ("render/h1/a.json", "render/h2/c.json"))
    assert (tmp_path / "render" / "h1" / "notes.txt").exists() and (tmp_path / "outside.txt").exists()
    assert sorted(os.listdir(tmp_path / "render")) == ["h1", "h2"]
    # a folder left empty goes
    pd_write_files.sync_files(_files(tmp_path, ["plan.json"]), str(tmp_path), "inv2")
    assert not (tmp_path / "render" / "h2").exists() and (tmp_path / "render" / "h1" / "notes.txt").exists()
    assert pd_write_files.read_manifest(str(tmp_path)) == ("inv2", ["plan.json"])


def test_sync_never_removes_outside_its_root_and_refuses_to_write_there(tmp_path):
    root = tmp_path / "build"
    root.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (root / pd_write_files.MANIFEST).write_text('{"owner": "x", "files": ["../victim.txt", "' + str(victim) + '"]}')
    pd_write_files.sync_files(_files(root, ["plan.json"]), str(root))
    assert victim.read_text() == "keep"
    try:
        pd_write_files.sync_files([{"path": str(victim), "content": "x"}], str(root))
    except ValueError as exc:
        assert "is not under" in str(exc)
    else:
        raise AssertionError("a file outside root was accepted")
    assert victim.read_text() == "keep"


def test_sync_with_an_unreadable_manifest_removes_nothing(tmp_path):
    (tmp_path / "old.json").write_text("old")
    (tmp_path / pd_write_files.MANIFEST).write_text("{not json")
    assert pd_write_files.sync_files(_files(tmp_path, ["plan.json"]), str(tmp_path))[1] == []
    assert (tmp_path / "old.json").exists()
