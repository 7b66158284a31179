"""The deploy lock file (plugins/module_utils/pd_lock.py), shared by pd_deploy_lock and pd_container_logs."""

import json

from ansible_collections.pd.deploy.plugins.module_utils import pd_lock


def test_create_is_exclusive_and_read_holder_tells_absent_from_unreadable(tmp_path):
    path = str(tmp_path / "c.lock")
    assert pd_lock.read_holder(path) is None
    assert pd_lock.create(path, {"run_id": "a"}) and not pd_lock.create(path, {"run_id": "b"})
    assert pd_lock.read_holder(path) == {"run_id": "a"}
    (tmp_path / "torn.lock").write_text('{"run_id": ')  # a run killed mid-write
    assert pd_lock.read_holder(str(tmp_path / "torn.lock")) == {}


def test_release_gives_back_only_the_named_runs_lock(tmp_path):
    path = tmp_path / "c.lock"
    path.write_text(json.dumps({"run_id": "other"}))
    assert pd_lock.release(str(path), "mine") == (False, {"run_id": "other"}) and path.exists()
    path.write_text(json.dumps({"run_id": "mine", "pid": 7}))
    assert pd_lock.release(str(path), "mine") == (True, {"run_id": "mine", "pid": 7}) and not path.exists()
    # gone (given back already, e.g. by the log read before a rescue): nothing to do
    assert pd_lock.release(str(path), "mine") == (False, None)
