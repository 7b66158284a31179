"""pd-deploy core library: pure functions behind the Ansible filter plugins.

Everything here is plain Python (no Ansible objects in, plain data out) so that it can be unit
tested directly and reused by the playbooks through ``filter_plugins/pd.py``.
"""
