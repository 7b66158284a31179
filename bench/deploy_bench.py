"""Deploy cost on the Molecule fleet: first deploy, no-op re-run, tool overhead beside engine starts.

Uses the `multicluster` scenario's simulated Ascend hosts (two clusters of 1 prefill + 1 decode host)
and the stand-in engine with a fixed start delay (PD_STANDIN_START_DELAY), so that the time the
engines take is known and the rest is the tool's own cost: the first deploy of the fleet (clusters in
turn, then in parallel), the first deploy of one cluster (--limit) and the no-op re-run, against the ping
floor; and the CPU each first deploy cost on the controller and inside each simulated host (the hosts
share this machine's cores, a fleet's do not). Prints figures; asserts nothing about timing. It does check what must hold whatever the speed: the no-op re-run reports changed=0 and
restarts no container.

    .venv/bin/python bench/deploy_bench.py [--delay 20] [--repeat 3] [--keep] [--profile]

Needs root and a Docker engine (tests/harness/ensure-docker.sh installs one); it runs
`molecule create` / `destroy` for the scenario, so do not run Molecule tests at the same time.
"""

import argparse
import copy
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

from bench import aggregate, profile_sections  # bench/bench.py, next to this script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = "multicluster"
CLUSTERS = ("mc_a", "mc_b")
BIN = os.path.dirname(sys.executable)


def children_cpu():
    """CPU seconds (user + system) of every finished child of this process and their children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def container_cpu(names):
    """{name: CPU seconds} of running containers, from their cgroup (v1 cpuacct or v2 cpu.stat): what
    runs inside, docker exec'd module runs included; None where the cgroup cannot be read."""
    out = {}
    for name in names:
        _, proc = sh(["docker", "inspect", "-f", "{{.Id}}", name], check=False)
        cid = proc.stdout.strip()
        value = None
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6),
                            (f"/sys/fs/cgroup/docker/{cid}/cpu.stat", 1e-6)):
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            match = re.search(r"usage_usec (\d+)", text) if path.endswith("cpu.stat") else re.match(r"(\d+)", text)
            if match:
                value = int(match.group(1)) * scale
                break
        out[name] = value
    return out


def sh(argv, env=None, check=True):
    """Run a command from the repository root; return (seconds, completed process)."""
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if check and proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}")
    return took, proc


def recap(text):
    """{host: {ok, changed, failed, ...}} from a PLAY RECAP."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if match and "changed=" in match.group(2):
            out[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return out


def containers():
    """{name: (id, started at)} of every pd-deploy container of the two clusters."""
    out = {}
    for cluster in CLUSTERS:
        _, proc = sh(["docker", "ps", "-q", "--filter", f"label=pd.cluster={cluster}"])
        ids = proc.stdout.split()
        if ids:
            _, info = sh(["docker", "inspect", *ids])
            for item in json.loads(info.stdout):
                out[item["Name"].lstrip("/")] = (item["Id"], item["State"]["StartedAt"])
    return out


def timed(argv, env, hosts):
    """sh() and the CPU it cost: {controller: seconds of the finished command's process tree, hosts:
    {host: seconds inside that host's container}} (the hosts' cgroups read before and after)."""
    cpu0, hosts0 = children_cpu(), container_cpu(hosts)
    took, proc = sh(argv, env)
    cpu1, hosts1 = children_cpu(), container_cpu(hosts)
    return took, proc, {
        "controller": cpu1 - cpu0,
        "hosts": {h: None if hosts0[h] is None or hosts1[h] is None else hosts1[h] - hosts0[h] for h in hosts}}


def scenario_hosts():
    """The scenario's simulated hosts (its Molecule platforms)."""
    with open(os.path.join(REPO, "molecule", SCENARIO, "molecule.yml"), encoding="utf-8") as handle:
        return [platform["name"] for platform in yaml.safe_load(handle)["platforms"]]


def delayed_inventory(delay, workdir):
    """Copy of the scenario inventory whose engines take `delay` seconds to start."""
    src = os.path.join(REPO, "molecule", SCENARIO, "inventory")
    dst = os.path.join(workdir, "inventory")
    shutil.copytree(src, dst, symlinks=False)
    for cluster in CLUSTERS:
        path = os.path.join(dst, "group_vars", f"{cluster}.yml")
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        cfg = copy.deepcopy(data["pd_cluster"])
        for role in ("prefill", "decode"):
            cfg[role].setdefault("env", {})["PD_STANDIN_START_DELAY"] = str(delay)
        cfg["health_timeout_s"] = max(60, 4 * delay)
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump({"pd_cluster": cfg}, handle)
    return dst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=int, default=20, help="stand-in engine start delay in seconds (20)")
    parser.add_argument("--repeat", type=int, default=3, help="no-op re-runs and ping floors timed (3; medians)")
    parser.add_argument("--keep", action="store_true", help="keep the simulated hosts and containers")
    parser.add_argument("--profile", type=int, nargs="?", const=15, default=0, metavar="TOP",
                        help="time the tasks of the first deploys and of one more (untimed) no-op re-run with "
                             "profile_tasks and print the TOP (15) slowest of each")
    args = parser.parse_args(argv)

    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    env.setdefault("PD_ASCEND_ROOT", "/var/lib/pd-test/ascend")
    for step in (["bash", "tests/harness/ensure-docker.sh"], ["bash", "tests/harness/build-images.sh"],
                 ["bash", "tests/harness/ascend-root.sh", env["PD_ASCEND_ROOT"], "8"]):
        sh(step, env)
    molecule = os.path.join(BIN, "molecule")
    sh([molecule, "destroy", "-s", SCENARIO], env, check=False)
    sh([molecule, "create", "-s", SCENARIO], env)
    sh([molecule, "prepare", "-s", SCENARIO], env)
    workdir = tempfile.mkdtemp(prefix="pd-deploy-bench-")
    try:
        inventory = delayed_inventory(args.delay, workdir)
        hosts = scenario_hosts()
        play = [os.path.join(BIN, "ansible-playbook"), "playbooks/deploy_pd.yml", "-i", inventory,
                "-e", f"pd_plan_build_dir={workdir}/build", "-e", "pd_container_health_delay=1"]
        ping = [os.path.join(BIN, "ansible"), "pd_clusters", "-m", "ansible.builtin.ping", "-i", inventory]
        # the ping floor and the no-op re-run are a few seconds each, so one run of either swings by a
        # third on a shared machine: each is run --repeat times, alternating, and the medians compared
        pings = [sh(ping, env)[0]]
        first_env = dict(env, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
                         PROFILE_TASKS_TASK_OUTPUT_LIMIT="all") if args.profile else env
        t_first, first, cpu_first = timed(play, first_env, hosts)
        before = containers()
        noops = []
        for _ in range(args.repeat):
            took, noop = sh(play, env)
            noops.append(took)
            pings.append(sh(ping, env)[0])
        after = containers()
        # the timed no-op above runs without the callback; a second one is profiled (same state: no-op)
        noop_profiled = sh(play, first_env)[1] if args.profile else None
        stop = [os.path.join(BIN, "ansible-playbook"), "playbooks/stop_pd.yml", "-i", inventory,
                "-e", "pd_stop_confirm=yes"]
        sh(stop, env)
        t_par, par, cpu_par = timed(play + ["-e", "pd_parallel_clusters=true"], first_env, hosts)
        # issue 24's first "Done when": the first deploy of one cluster (the other left as it runs)
        sh(stop + ["--limit", CLUSTERS[0]], env)
        t_one, one, cpu_one = timed(play + ["--limit", CLUSTERS[0]], first_env, hosts)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not args.keep:
            sh([molecule, "destroy", "-s", SCENARIO], env, check=False)

    t_ping, t_noop = statistics.median(pings), statistics.median(noops)
    changed = {h: r.get("changed", 0) for h, r in recap(noop.stdout).items()}
    tasks_first = {h: r.get("ok", 0) for h, r in recap(first.stdout).items()}
    tasks_noop = {h: r.get("ok", 0) for h, r in recap(noop.stdout).items()}
    restarted = sorted(n for n in before if after.get(n) != before[n])
    # The limit each figure is measured against: the slowest engine start of each wave. A first deploy
    # starts a cluster's prefill and decode ranks in one wave (roles/pd_rollout/tasks/roll.yml), so a
    # cluster costs its slowest engine start, not the sum of its roles' (the decode-first rollout paid
    # 2 start delays per cluster); clusters in turn add up, clusters in parallel are one wave.
    waves = {cluster: [{"prefill": args.delay, "decode": args.delay}] for cluster in CLUSTERS}
    per_cluster = {cluster: sum(max(wave.values()) for wave in cluster_waves)
                   for cluster, cluster_waves in waves.items()}
    floor_serial = sum(per_cluster.values())
    floor_parallel = max(per_cluster.values())
    print(f"\npd-deploy deploy bench: {len(CLUSTERS)} clusters x (1 P + 1 D host), stand-in start delay "
          f"{args.delay} s, {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.2f}")
    print("engine floor = the slowest engine start of each wave (P and D of a cluster start in one wave);"
          " clusters in turn add their waves up")
    print(f"{'run':42} {'wall s':>8} {'engine floor s':>15} {'overhead s':>11}")
    print(f"{'ping floor (ansible -m ping, 4 hosts)':42} {t_ping:8.1f}   median of {len(pings)}: "
          + " ".join(f"{t:.1f}" for t in pings))
    for label, took, floor in (("first deploy of one cluster (--limit)", t_one, per_cluster[CLUSTERS[0]]),
                               ("first deploy, one cluster at a time", t_first, floor_serial),
                               ("first deploy, pd_parallel_clusters=true", t_par, floor_parallel),
                               ("no-op re-run", t_noop, 0)):
        print(f"{label:42} {took:8.1f} {floor:15.1f} {took - floor:11.1f}")
    # The simulated hosts share this machine's cores with the controller and the engines; on a fleet each
    # host runs its module runs on its own CPU. Where the tool's CPU goes, per first deploy:
    print("CPU seconds of each first deploy: controller (ansible-playbook, its workers, the docker CLI of the"
          " docker connection) and inside the simulated hosts (the module runs), per host")
    for label, cpu in (("one cluster", cpu_one), ("clusters in turn", cpu_first), ("clusters in parallel", cpu_par)):
        per_host = " ".join(f"{h} {v:.1f}" if v is not None else f"{h} n/a" for h, v in cpu["hosts"].items())
        known = [v for v in cpu["hosts"].values() if v is not None]
        print(f"  {label:22} controller {cpu['controller']:5.1f}   hosts {sum(known):5.1f} ({per_host})")
    print(f"no-op re-runs (median above): {' '.join(f'{t:.1f}' for t in noops)}")
    print(f"tasks run per host (recap ok), first deploy: {tasks_first}")
    print(f"tasks run per host (recap ok), no-op re-run: {tasks_noop}")
    print(f"no-op re-run: changed per host {changed}; restarted containers: {restarted or 'none'}")
    print(f"no-op / ping floor (medians): {t_noop / t_ping:.2f}x (issue 24's limit: 1.3x); containers: {len(before)}")
    if args.profile:
        print("first deploy, slowest tasks (profile_tasks, same-named tasks summed, n = runs):")
        for total, count, name in aggregate(profile_sections(first.stdout).get("TASKS", []))[:args.profile]:
            print(f"  {total:8.2f}s  n={count:<3} {name[:100]}")
        for label, proc in (("first deploy, clusters in parallel", par), ("first deploy of one cluster", one)):
            print(f"{label}, slowest tasks:")
            for total, count, name in aggregate(profile_sections(proc.stdout).get("TASKS", []))[:args.profile]:
                print(f"  {total:8.2f}s  n={count:<3} {name[:100]}")
        print("no-op re-run (a second, profiled one), slowest tasks:")
        for total, count, name in aggregate(profile_sections(noop_profiled.stdout).get("TASKS", []))[:args.profile]:
            print(f"  {total:8.2f}s  n={count:<3} {name[:100]}")
    ok = all(v == 0 for v in changed.values()) and not restarted and len(before) == 6
    print("no-op re-run check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
