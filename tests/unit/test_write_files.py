"""The pd_write_files action plugin writes only what changed, creating folders."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "action_plugins", "pd_write_files.py")
_spec = importlib.util.spec_from_file_location("pd_write_files", _PATH)
pd_write_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd_write_files)


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
