"""The fake Ascend host pieces: the fake npu-smi and hccn_tool (tests/fixtures/ascend/)
and the tree tests/harness/ascend-root.sh builds for Molecule. No Docker."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest

from tests.fixtures.standin_procs import ASCEND_FIXTURES, REPO, clean_env

NPU_SMI = ASCEND_FIXTURES / "npu-smi"
HCCN_TOOL = ASCEND_FIXTURES / "hccn_tool"
ASCEND_ROOT_SH = REPO / "tests" / "harness" / "ascend-root.sh"


def npu_smi(*args: str, path=NPU_SMI, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=10, check=False)


class TestFakeNpuSmi:
    def test_info_l_lists_the_npus_like_the_real_tool(self):
        r = npu_smi("info", "-l")
        assert r.returncode == 0
        assert re.search(r"^\s*Total Count\s+: 8$", r.stdout, re.M)
        ids = re.findall(r"^\s*NPU ID\s+: (\d+)$", r.stdout, re.M)
        assert ids == [str(i) for i in range(8)]
        assert len(re.findall(r"^\s*Chip Count\s+: 1$", r.stdout, re.M)) == 8
        # the common shell idiom: npu-smi info -l | grep ID | awk '{print $4}'
        ids_awk = [line.split()[3] for line in r.stdout.splitlines() if "ID" in line]
        assert ids_awk == [str(i) for i in range(8)]

    def test_count_from_env(self):
        r = npu_smi("info", "-l", PD_FAKE_NPUS="16")
        assert "Total Count                    : 16" in r.stdout

    def test_count_from_the_file_next_to_it(self, tmp_path):
        copy = tmp_path / "npu-smi"
        copy.write_bytes(NPU_SMI.read_bytes())
        (tmp_path / "npu-smi.fake.conf").write_text("PD_FAKE_NPUS=4\n")
        assert "Total Count                    : 4" in npu_smi("info", "-l", path=copy).stdout
        # the environment wins over the file
        assert "Total Count                    : 2" in npu_smi("info", "-l", path=copy, PD_FAKE_NPUS="2").stdout

    def test_info_table_has_910b3_rows_with_64g_hbm(self):
        r = npu_smi("info")
        assert r.returncode == 0
        rows = re.findall(r"^\| (\d+)\s+(910B3)\s+\| OK", r.stdout, re.M)
        assert [int(n) for n, _ in rows] == list(range(8))
        assert len(re.findall(r"\d+\s*/ 65536\s", r.stdout)) == 8
        assert "Hugepages-Usage(page)" in r.stdout and "HBM-Usage(MB)" in r.stdout

    def test_a3_variant_lists_8_cards_of_2_chips_named_ascend910(self):
        """Atlas 800T A3 as public output shows it (vllm-project/vllm-ascend issues 2035, 2534)."""
        env = {"PD_FAKE_NPUS": "16", "PD_FAKE_CHIPS_PER_NPU": "2", "PD_FAKE_NPU_NAME": "Ascend910"}
        listing = npu_smi("info", "-l", **env).stdout
        assert re.search(r"^\s*Total Count\s+: 8$", listing, re.M)
        assert len(re.findall(r"^\s*Chip Count\s+: 2$", listing, re.M)) == 8
        table = npu_smi("info", **env).stdout
        assert "| Chip  Phy-ID" in table
        rows = re.findall(r"^\| (\d+)\s+Ascend910\s+\| OK", table, re.M)
        assert [int(n) for n in rows] == [i // 2 for i in range(16)]
        chips = re.findall(r"^\| (\d)\s+(\d+)\s+\| 0000:", table, re.M)
        assert [(int(a), int(b)) for a, b in chips] == [(i % 2, i) for i in range(16)]

    def test_910b4_variant_has_32g_hbm(self):
        table = npu_smi("info", PD_FAKE_NPU_NAME="910B4", PD_FAKE_HBM_MB="32768").stdout
        assert len(re.findall(r"^\| \d+\s+910B4\s+\| OK", table, re.M)) == 8
        assert len(re.findall(r"\d+\s*/ 32768\s", table)) == 8

    def test_mapping(self):
        lines = npu_smi("info", "-m", PD_FAKE_NPUS="2").stdout.splitlines()
        assert lines[0].split()[:2] == ["NPU", "ID"]
        assert [line.split()[-1] for line in lines[1:]] == ["910B3", "Mcu", "910B3", "Mcu"]

    @pytest.mark.parametrize("args", [("foo",), ("info", "-x"), ("set", "-t", "x"), ()])
    def test_unknown_commands_fail_with_usage(self, args):
        r = npu_smi(*args)
        assert r.returncode == 1
        assert r.stdout.startswith("Usage: npu-smi info")

    def test_device_queries(self):
        assert "HBM Capacity(MB)               : 65536" in npu_smi("info", "-t", "memory", "-i", "3").stdout
        assert npu_smi("info", "-t", "usages", "-i", "8").returncode == 1


class TestFakeHccnTool:
    def test_ip_matches_hccn_conf_layout(self):
        r = subprocess.run([str(HCCN_TOOL), "-i", "2", "-ip", "-g"], capture_output=True, text=True, check=False)
        assert r.returncode == 0
        assert "ipaddr:198.51.100.12" in r.stdout

    def test_bad_usage(self):
        r = subprocess.run([str(HCCN_TOOL), "-i", "x", "-ip", "-g"], capture_output=True, text=True, check=False)
        assert r.returncode == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="ascend-root.sh needs root (mknod)")
class TestAscendRootScript:
    def run(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ASCEND_ROOT_SH), *map(str, args)], capture_output=True,
                              text=True, timeout=30, check=False)

    def test_builds_the_tree_the_roles_mount(self, tmp_path):
        root = tmp_path / "ascend"
        assert self.run(root, 4).returncode == 0
        for name in ["davinci0", "davinci3", "davinci_manager", "devmm_svm", "hisi_hdc"]:
            st = os.stat(root / "dev" / name)
            assert stat.S_ISCHR(st.st_mode)
            assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
        assert not (root / "dev" / "davinci4").exists()
        for path in ["usr/local/dcmi", "usr/local/Ascend/driver/lib64"]:
            assert (root / path).is_dir()
        for path in ["usr/local/bin/npu-smi", "usr/local/Ascend/driver/tools/hccn_tool"]:
            assert os.access(root / path, os.X_OK)
        assert "Version=24.1.rc3" in (root / "usr/local/Ascend/driver/version.info").read_text()
        assert (root / "etc/ascend_install.info").is_file()
        assert "address_3=" in (root / "etc/hccn.conf").read_text()
        assert '"max_position_embeddings"' in (root / "models/DeepSeek-V4-Flash/config.json").read_text()
        r = subprocess.run([str(root / "usr/local/bin/npu-smi"), "info", "-l"], capture_output=True,
                           text=True, env=clean_env(), check=False)
        assert "Total Count                    : 4" in r.stdout

    def test_idempotent_and_shrinks(self, tmp_path):
        root = tmp_path / "ascend"
        assert self.run(root, 8).returncode == 0
        assert self.run(root, 8).returncode == 0
        assert self.run(root, 2).returncode == 0
        assert sorted(p.name for p in (root / "dev").glob("davinci[0-9]*")) == ["davinci0", "davinci1"]

    @pytest.mark.parametrize("target", ["/", "relative/path"])
    def test_refuses_dangerous_targets(self, target):
        assert self.run(target).returncode == 1

    def test_refuses_a_foreign_non_empty_directory(self, tmp_path):
        (tmp_path / "something").write_text("x")
        r = self.run(tmp_path)
        assert r.returncode == 1 and "refusing" in r.stderr
