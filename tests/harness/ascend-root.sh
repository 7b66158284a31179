#!/usr/bin/env bash
# Create a fake Ascend host tree under DIR, on the REAL machine.
#
#   tests/harness/ascend-root.sh DIR [NPUS]        (NPUS default 8; A3 hosts have 16)
#
# Why on the real machine: the engine containers the roles start are siblings created
# by the real Docker daemon (Molecule hosts only hold its socket), and the daemon
# resolves every --device and bind-mount source on the real machine. The roles prefix
# each Ascend path with the variable `pd_ascend_root` (default "" on real hosts);
# Molecule sets it to DIR and mounts DIR at the same path inside its hosts.
#
# Tree (all fakes; device nodes are char 1:3 like /dev/null, so harmless):
#   DIR/dev/davinci0 .. davinci<NPUS-1>, davinci_manager, devmm_svm, hisi_hdc
#   DIR/usr/local/dcmi/                              (placeholder file inside)
#   DIR/usr/local/bin/npu-smi                        fake, tests/fixtures/ascend/npu-smi
#   DIR/usr/local/bin/npu-smi.fake.conf              PD_FAKE_NPUS=<NPUS> for that fake
#   DIR/usr/local/Ascend/driver/lib64/               (placeholder file inside)
#   DIR/usr/local/Ascend/driver/version.info         Version=24.1.rc3 ...
#   DIR/usr/local/Ascend/driver/tools/hccn_tool      fake, tests/fixtures/ascend/hccn_tool
#   DIR/usr/local/Ascend/driver/tools/hccn_tool.fake.conf   no broken variant (a test writes PD_FAKE_HCCN_* keys)
#   DIR/etc/ascend_install.info
#   DIR/etc/hccn.conf                                one address block per NPU
#   DIR/models/DeepSeek-V4-Flash/config.json         tiny model config (no weights)
#   DIR/.pd-fake-ascend-root                         marker: this tree is a fake
#
# Idempotent: re-running rewrites the files, keeps correct device nodes, and removes
# davinciN nodes beyond NPUS. Refuses a DIR that is "/" or a non-empty directory
# without the marker, so it never writes into a real system tree.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FIXTURES="$(cd "$HERE/../fixtures/ascend" && pwd)"
MARKER=".pd-fake-ascend-root"

die() { printf '[ascend-root] %s\n' "$*" >&2; exit 1; }

# put DEST MODE < content: replace DEST only when its content differs, by a rename (atomic): scenarios
# of another run (another lane, another worktree) may run npu-smi or read version.info at any moment,
# and a truncated or half-copied file made one of them fail its prechecks
put() {
  local dest="$1" mode="$2" tmp
  tmp="$(mktemp "$dest.XXXXXX")" || die "cannot write next to $dest"
  cat >"$tmp"
  if cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    chmod "$mode" "$dest"
  else
    chmod "$mode" "$tmp" && mv -f "$tmp" "$dest"
  fi
}

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 DIR [NPUS]"
DIR="$1"
NPUS="${2:-8}"
[[ "$NPUS" =~ ^[0-9]+$ && "$NPUS" -ge 1 && "$NPUS" -le 64 ]] || die "NPUS must be 1..64, got '$NPUS'"
[[ "$DIR" == /* ]] || die "DIR must be an absolute path (the Docker daemon resolves it), got '$DIR'"
DIR="${DIR%/}"
[[ -n "$DIR" ]] || die "refusing DIR=/"
if [[ -d "$DIR" && ! -e "$DIR/$MARKER" && -n "$(ls -A "$DIR")" ]]; then
  die "$DIR is not empty and has no $MARKER: refusing to write a fake Ascend tree into it"
fi
[[ "$(id -u)" == 0 ]] || die "must run as root (mknod)"

mkdir -p "$DIR"
echo "fake Ascend host tree made by tests/harness/ascend-root.sh; NPUS=$NPUS" | put "$DIR/$MARKER" 0644

# --- device nodes: char 1:3, the same numbers as /dev/null
mkdir -p "$DIR/dev"
chardev() {
  local path="$1"
  if [[ -c "$path" && "$(stat -c '%t:%T' "$path")" == "1:3" ]]; then
    return
  fi
  rm -rf "$path"
  mknod -m 0666 "$path" c 1 3
}
for ((i = 0; i < NPUS; i++)); do chardev "$DIR/dev/davinci$i"; done
for name in davinci_manager devmm_svm hisi_hdc; do chardev "$DIR/dev/$name"; done
# Fewer NPUs than last time: drop the extra davinciN nodes.
for node in "$DIR"/dev/davinci[0-9]*; do
  [[ -e "$node" ]] || continue
  n="${node##*/davinci}"
  if [[ "$n" =~ ^[0-9]+$ ]] && ((n >= NPUS)); then rm -f "$node"; fi
done

# --- driver, tools and config files
mkdir -p "$DIR/usr/local/dcmi" "$DIR/usr/local/bin" \
  "$DIR/usr/local/Ascend/driver/lib64" "$DIR/usr/local/Ascend/driver/tools" "$DIR/etc"
echo "placeholder: fake DCMI directory (tests/harness/ascend-root.sh)" | put "$DIR/usr/local/dcmi/FAKE_DCMI" 0644
echo "placeholder: fake driver libraries (tests/harness/ascend-root.sh)" \
  | put "$DIR/usr/local/Ascend/driver/lib64/FAKE_DRIVER_LIB64" 0644
put "$DIR/usr/local/bin/npu-smi" 0755 <"$FIXTURES/npu-smi"
printf 'PD_FAKE_NPUS=%s\nPD_FAKE_NPU_NAME=910B3\nPD_FAKE_HBM_MB=65536\n' "$NPUS" \
  | put "$DIR/usr/local/bin/npu-smi.fake.conf" 0644
put "$DIR/usr/local/Ascend/driver/tools/hccn_tool" 0755 <"$FIXTURES/hccn_tool"
echo "# broken variants of the fake hccn_tool (PD_FAKE_HCCN_* keys, see its header); none by default" \
  | put "$DIR/usr/local/Ascend/driver/tools/hccn_tool.fake.conf" 0644

put "$DIR/usr/local/Ascend/driver/version.info" 0644 <<'INFO'
Version=24.1.rc3
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=V100R001C19SPC002B211
compatible_version=[V100R001C15],[V100R001C17],[V100R001C18],[V100R001C19],[V100R001C20]
compatible_version_fw=[7.0.0,7.5.99]
package_version=24.1.rc3
INFO

put "$DIR/etc/ascend_install.info" 0644 <<'INFO'
UserName=HwHiAiUser
UserGroup=HwHiAiUser
Driver_Install_Type=full
Driver_Install_Path_Param=/usr/local/Ascend
Driver_Install_For_All=no
Driver_Install_Mode=normal
Driver_Install_Status=complete
INFO

# hccn.conf: one block per NPU, addresses from the documentation range (never routed),
# the same ones the fake hccn_tool reports.
{
  for ((i = 0; i < NPUS; i++)); do
    printf 'address_%d=198.51.100.%d\nnetmask_%d=255.255.255.0\n' "$i" "$((10 + i))" "$i"
    printf 'netdetect_%d=198.51.100.1\ngateway_%d=198.51.100.1\n' "$i" "$i"
    printf 'send_arp_status_%d=1\ntls_%d=0\n' "$i" "$i"
  done
} | put "$DIR/etc/hccn.conf" 0644

# --- a model directory with a tiny config.json (the stand-in engine reads
# max_position_embeddings from it when --max-model-len is not given)
mkdir -p "$DIR/models/DeepSeek-V4-Flash"
put "$DIR/models/DeepSeek-V4-Flash/config.json" 0644 <<'JSON'
{
  "_comment": "TEST FIXTURE: tiny stand-in config, no weights (tests/harness/ascend-root.sh)",
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "max_position_embeddings": 163840,
  "torch_dtype": "bfloat16",
  "vocab_size": 129280
}
JSON

printf '[ascend-root] fake Ascend tree ready: %s (%s NPUs)\n' "$DIR" "$NPUS" >&2
