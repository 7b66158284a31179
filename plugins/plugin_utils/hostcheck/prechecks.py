# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Judge what the prechecks role read on one host against what its launch specs need.

The role reads the host with one pd_host_probe run (paths, npu-smi, /proc/meminfo, listening ports,
free disk, Docker, images, health of containers already running their spec); every decision is here,
as a pure function returning one message per problem, each naming what is missing and what to do.
"""

import base64
import re

from ..rollout.containers import PREVIOUS, port_conflicts, running_previous, sick_current
from ..shared import sizes


def required_paths(specs):
    """Host paths the specs' devices and read-only mounts come from (order kept, no repeats)."""
    out = []
    for spec in specs:
        for entry in list(spec.get("devices") or []) + list(spec.get("volumes") or []):
            src = entry.split(":", 1)[0]
            if src not in out:
                out.append(src)
    return out


_NPU_DEVICE = re.compile(r"davinci[0-9]")


def npus_needed(specs):
    """How many NPUs the specs use: their distinct /dev/davinciN device entries (davinci_manager is none)."""
    return len({d for s in specs or [] for d in s.get("devices") or [] if _NPU_DEVICE.search(d)})


def npu_count(npu_smi_stdout):
    """Logical NPU count from ``npu-smi info -l``; None when absent.

    ``Total Count`` counts cards; an A3 card carries two chips (``Chip Count : 2``), each its own
    /dev/davinciN and its own rank device, so the count is the sum of the cards' chip counts (16 on
    an Atlas 800T A3, 8 on an A2): Total Count x the largest Chip Count listed (1 when none is).
    """
    text = npu_smi_stdout or ""
    match = re.search(r"Total Count\s*:\s*(\d+)", text)
    if not match:
        return None
    chips = [int(c) for c in re.findall(r"Chip Count\s*:\s*(\d+)", text)]
    return int(match.group(1)) * max(chips or [1])


_STATUS_ROW = re.compile(r"^\|\s*(\d+)\s+((?=\S*[A-Za-z])\S+)\s*\|\s*\S+\s*\|")
_CHIP_ROW = re.compile(r"^\|\s*(\d+)(?:\s+(\d+))?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Za-z]{2}:[0-9A-Fa-f]{2}\.\d\s*\|")
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


def npu_table(npu_smi_info_stdout):
    """Chips of the ``npu-smi info`` status table: ``[{npu, chip, name, hbm_mb}]`` in table order.

    Each chip takes two rows: ``| NPU  Name | Health | Power ...`` then ``| Chip [Phy-ID] | Bus-Id
    | AICore  Memory-Usage  HBM-Usage |``; HBM is the total of the last ``used / total`` pair (MB).
    A2 (Atlas 800T A2, vllm-project/vllm-ascend issues 975 and 1903) shows one chip per NPU; A3
    (issues 2035 and 2534) shows two chip rows per NPU, both named ``Ascend910``. The process table
    below is not read. An empty list when nothing parses.
    """
    out = []
    pending = None
    for line in (npu_smi_info_stdout or "").splitlines():
        line = line.strip()
        if "Process id" in line or "Process name" in line:
            break
        status = _STATUS_ROW.match(line)
        if status:
            pending = (int(status.group(1)), status.group(2))
            continue
        chip = _CHIP_ROW.match(line)
        if chip and pending:
            pairs = _USAGE.findall(line)
            out.append({"npu": pending[0], "chip": int(chip.group(1)), "name": pending[1],
                        "hbm_mb": int(pairs[-1][1]) if pairs else None})
            pending = None
    return out


def _chip_key(name):
    """910B3 / Ascend910B3 / ascend910b3 compare equal; Ascend910 (A3) is 910."""
    text = str(name or "").strip().lower()
    return text[len("ascend"):].strip() if text.startswith("ascend") else text


def npu_model_problems(table, chip, hbm_per_npu_bytes):
    """Chip name and HBM per NPU of the ``npu-smi info`` table against the host's inventory values.

    ``chip`` is pd_npu_chip (the Name column), ``hbm_per_npu_bytes`` pd_hbm_per_npu. The table's MB
    are MiB (65536 on a 64 GB NPU). A difference of more than 1% in HBM is a problem: the weight-fit
    check and the KV estimate were computed for the inventory's value.
    """
    out = []
    if not table:
        return ["npu-smi info printed no NPU status rows — check the driver (the prechecks read the chip "
                "name and HBM per NPU from that table)"]
    names = sorted({row["name"] for row in table})
    if chip and any(_chip_key(n) != _chip_key(chip) for n in names):
        out.append(f"npu-smi info reports chip {', '.join(names)} but the inventory says pd_npu_chip "
                   f"{chip} — set pd_npu_chip: {names[0]} in this host's host_vars (and pd_hbm_per_npu to "
                   "its HBM), or fix the inventory's host list")
    sizes_mb = sorted({row["hbm_mb"] for row in table if row["hbm_mb"] is not None})
    if hbm_per_npu_bytes and sizes_mb:
        want_mb = hbm_per_npu_bytes / 1024 ** 2
        wrong = [mb for mb in sizes_mb if abs(mb - want_mb) > want_mb / 100]
        if wrong:
            found = " / ".join(f"{mb} MB" for mb in sizes_mb)
            out.append(f"npu-smi info reports {found} of HBM per NPU ({names[0]}) but pd_hbm_per_npu is "
                       f"{sizes.to_human(hbm_per_npu_bytes)} — set pd_hbm_per_npu: {min(sizes_mb) // 1024}GiB in "
                       "this host's host_vars (the weight-fit check and KV estimate use it) and re-run")
    return out


def mem_total_bytes(meminfo):
    """MemTotal from /proc/meminfo text (or its base64 as ansible's slurp returns it)."""
    text = meminfo or ""
    if "MemTotal" not in text:
        try:
            text = base64.b64decode(text).decode()
        except ValueError:
            return None
    match = re.search(r"MemTotal:\s*(\d+)\s*kB", text)
    return int(match.group(1)) * 1024 if match else None


def problems(facts):
    """Every problem of one host as a list of ``host: what — what to do`` strings.

    ``facts``: host, specs, model_path, npus_needed, ram_reserve_bytes, min_free_disk_bytes, npu_chip and
    hbm_per_npu_bytes (the inventory's pd_npu_chip / pd_hbm_per_npu), probe (the pd_host_probe result),
    checks (false with pd_prechecks_skip: only Docker and the health of
    containers already running their spec are judged). A probe that is an unreachable or failed task
    result (read nothing) is that one problem.
    """
    host = facts["host"]
    specs = facts["specs"]
    probe = facts.get("probe") or {}
    if probe.get("failed") and probe.get("argument_errors"):
        # pd_host_check refused the role's variables before it probed (check_role_options): not the host's fault
        return [f"{host}: {e} — fix that variable (inventory or -e; each is listed in "
                "roles/pd_prechecks/meta/argument_specs.yml) and run again" for e in probe["argument_errors"]]
    if probe.get("unreachable") or probe.get("failed"):
        # the probe's own task result (deploy-pd.yml goes on past it to report): nothing was read
        why = " ".join(str(probe.get("msg") or "no answer").split())[:300]
        if probe.get("unreachable"):
            return [f"{host}: unreachable: {why} — bring the host back (ssh, its address, the deploy user) or "
                    "leave its cluster out with --limit"]
        return [f"{host}: its probe failed: {why} — fix what the message names (sudo for the deploy user, "
                "Python on the host) and run again"]
    docker = probe.get("docker") or {}
    out = []
    if not docker.get("ok"):
        out.append(f"Docker engine not reachable ({docker.get('msg') or 'no answer'}) — install and "
                   "start Docker (systemctl start docker) or set pd_docker_socket (inventory or -e) to its socket")
    if facts.get("checks", True):
        out.extend(_host_problems(facts, probe))
    found = probe.get("containers") if isinstance(probe.get("containers"), list) else []
    kept = {c.get("name") for c in found}
    # a rank beside its kept previous container is an interrupted replacement: the rollout health-waits
    # it and restores the previous one if it does not answer, so it does not stop the deploy here
    out.extend(sick_current([s for s in specs if s["name"] + PREVIOUS not in kept], probe))
    for name in running_previous(found):
        out.append(f"{name} is running: a kept previous container must stay stopped (it uses the same port "
                   "and NPUs as its rank; a restart policy or a daemon restart started it) — stop it "
                   f"(docker stop {name}); the next deploy then restores it or removes it")
    return [f"{host}: {p}" for p in out]


def driver_problems(facts, probe):
    """The Ascend device and driver problems of one host: device nodes and driver paths of its launch specs,
    ``npu-smi info -l`` (NPU count) and ``npu-smi info`` (chip name, HBM per NPU) against the inventory.

    The prechecks (problems) and the host bootstrap (playbooks/bootstrap_hosts.yml) both judge with this
    one function; ``facts`` as for problems() (host, specs, model_path, npu_chip, hbm_per_npu_bytes;
    npus_needed, when not given, is what the specs use: npus_needed()), ``probe`` the pd_host_probe
    result. Returns ``host: what — what to do`` strings.
    """
    return [f"{facts['host']}: {p}" for p in _driver_problems(facts, probe or {})]


def _driver_problems(facts, probe):
    specs = facts["specs"]
    out = []
    stats = probe.get("stats") or {}
    model = facts.get("model_path")
    for path in required_paths(specs):
        if path == model:
            continue  # the model directory is judged below, with its own message
        st = stats.get(path) or {}
        if not st.get("exists"):
            kind = "device node" if "/dev/" in path else "driver path"
            out.append(f"{kind} {path} is missing — install the Ascend driver/firmware on this host "
                       "(or fix pd_ascend_root / pd_npus / pd_npu_first in its host_vars)")
        elif "/dev/" in path and not st.get("ischr"):
            out.append(f"{path} exists but is not a character device — check the Ascend driver installation")
    npu_smi = probe.get("npu_smi") or {}
    if probe.get("npu_smi") is None and probe.get("skipped_checks"):
        pass  # a settled host (every rank runs its spec): the probe ran no npu-smi, nothing starts here
    elif npu_smi.get("rc") != 0:
        why = (npu_smi.get("stderr") or "").strip().splitlines()[-1:] or ["no output"]
        out.append(f"npu-smi info -l failed ({why[0]}) — check the driver (npu-smi is in /usr/local/bin "
                   "on Ascend hosts)")
    else:
        count = npu_count(npu_smi.get("stdout"))
        if count is None:
            out.append("npu-smi info -l printed no 'Total Count' — check the driver version")
        elif count < facts.get("npus_needed", npus_needed(specs)):
            needed = facts.get("npus_needed", npus_needed(specs))
            out.append(f"npu-smi reports {count} NPUs but this host's ranks use {needed} — "
                       "fix pd_npus in host_vars or move ranks to another host")
    info = probe.get("npu_smi_info")
    if info is not None and (facts.get("npu_chip") or facts.get("hbm_per_npu_bytes")):
        if info.get("rc") != 0:
            why = (info.get("stderr") or "").strip().splitlines()[-1:] or ["no output"]
            out.append(f"npu-smi info failed ({why[0]}) — check the driver")
        else:
            out.extend(npu_model_problems(npu_table(info.get("stdout")), facts.get("npu_chip"),
                                          facts.get("hbm_per_npu_bytes")))
    return out


def _host_problems(facts, probe):
    specs = facts["specs"]
    out = _driver_problems(facts, probe)
    stats = probe.get("stats") or {}
    model = facts.get("model_path")
    pinned = sum(s.get("pinned_offload_bytes") or 0 for s in specs)
    mem = mem_total_bytes(probe.get("meminfo"))
    reserve = facts.get("ram_reserve_bytes") or 0
    if mem is None:
        out.append("could not read MemTotal from /proc/meminfo")
    elif mem < pinned + reserve:
        out.append(f"RAM {sizes.to_human(mem)} < pinned CPU offload {sizes.to_human(pinned)} + reserve "
                   f"{sizes.to_human(reserve)} — lower cpu_offload of this role or pd_host_ram_reserve, "
                   "or use a host with more RAM")
    if model:
        st = stats.get(model) or {}
        if not st.get("isdir"):
            out.append(f"model directory {model} is missing — copy the model there or fix pd_cluster.model.path")
        avail = probe.get("disk_free_bytes")
        need = facts.get("min_free_disk_bytes") or 0
        if avail is not None and avail < need:
            out.append(f"only {sizes.to_human(avail)} free on the filesystem of {model}, need "
                       f"{sizes.to_human(need)} — free disk space or lower pd_prechecks_min_free_disk")
    own = [c["name"] for c in probe.get("containers") or [] if c.get("running")]
    out.extend(port_conflicts(specs, probe.get("listening_ports") or [], own))
    for image in probe.get("images_missing") or []:
        out.append(f"image {image} is not on this host — ship it from the controller: docker save {image} "
                   "-o vllm-ascend.tar, then ansible-playbook playbooks/images.yml -i <inventory> "
                   "-e pd_image_archive=$PWD/vllm-ascend.tar (air-gapped sites), or let the deploy pull it: "
                   "pd_image_pull: missing in the cluster's group_vars (registry login: docs/guide/pull.md)")
    return out
