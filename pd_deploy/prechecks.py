"""Judge what the prechecks role read on one host against what its launch specs need.

The role reads the host with one pd_host_probe run (paths, npu-smi, /proc/meminfo, listening ports,
free disk, Docker, images, health of containers already running their spec); every decision is here,
as a pure function returning one message per problem, each naming what is missing and what to do.
"""

import base64
import re

from pd_deploy import sizes
from pd_deploy.containers import port_conflicts, sick_current


def required_paths(specs):
    """Host paths the specs' devices and read-only mounts come from (order kept, no repeats)."""
    out = []
    for spec in specs:
        for entry in list(spec.get("devices") or []) + list(spec.get("volumes") or []):
            src = entry.split(":", 1)[0]
            if src not in out:
                out.append(src)
    return out


def npu_count(npu_smi_stdout):
    """NPU count from ``npu-smi info -l`` (``Total Count : 8``); None when absent."""
    match = re.search(r"Total Count\s*:\s*(\d+)", npu_smi_stdout or "")
    return int(match.group(1)) if match else None


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

    ``facts``: host, specs, model_path, npus_needed, ram_reserve_bytes, min_free_disk_bytes, probe (the
    pd_host_probe result), checks (false with pd_prechecks_skip: only Docker and the health of
    containers already running their spec are judged).
    """
    host = facts["host"]
    specs = facts["specs"]
    probe = facts.get("probe") or {}
    docker = probe.get("docker") or {}
    out = []
    if not docker.get("ok"):
        out.append(f"Docker engine not reachable ({docker.get('msg') or 'no answer'}) — install and "
                   "start Docker (systemctl start docker) or point pd_container_docker_socket at its socket")
    if facts.get("checks", True):
        out.extend(_host_problems(facts, probe))
    out.extend(sick_current(specs, probe))
    return [f"{host}: {p}" for p in out]


def _host_problems(facts, probe):
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
    if npu_smi.get("rc") != 0:
        why = (npu_smi.get("stderr") or "").strip().splitlines()[-1:] or ["no output"]
        out.append(f"npu-smi info -l failed ({why[0]}) — check the driver (npu-smi is in /usr/local/bin "
                   "on Ascend hosts)")
    else:
        count = npu_count(npu_smi.get("stdout"))
        if count is None:
            out.append("npu-smi info -l printed no 'Total Count' — check the driver version")
        elif count < facts.get("npus_needed", 0):
            out.append(f"npu-smi reports {count} NPUs but this host's ranks use {facts['npus_needed']} — "
                       "fix pd_npus in host_vars or move ranks to another host")
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
        out.append(f"image {image} is not on this host — docker load it (registries may be unreachable) "
                   "or run with -e pd_container_pull=missing to pull it")
    return out


FILTERS = {
    "pd_required_paths": required_paths,
    "pd_precheck_problems": problems,
}
