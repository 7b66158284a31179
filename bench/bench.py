#!/usr/bin/env python3
"""Time validate and render-only deploys of generated fleets against the `ansible ping` floor.

    make bench                                   # sizes 4 .. 1024 hosts; median of 3 runs (1 from 256 hosts)
    .venv/bin/python bench/bench.py --sizes 4,16,64 # the small sizes only (a few minutes)
    .venv/bin/python bench/bench.py --quick      # 1 run, sizes 4 and 16 (smoke)
    .venv/bin/python bench/bench.py --runs 5 --sizes 4,64 --profile

For every size it writes a fleet with bench/gen_fleet.py (clusters of P + D hosts, all of them this
machine through ansible_connection: local) and runs, from the repository root so ansible.cfg (forks,
callbacks) applies to all three:

    floor     ansible all -m ansible.builtin.ping -i <inv>
    validate  ansible-playbook playbooks/validate.yml -i <inv>
    render    ansible-playbook playbooks/deploy_pd.yml -i <inv> -e pd_render_only=true

Validate and render write into a fresh temporary build directory per run (-e pd_plan_build_dir),
never into build/; a render run that wrote no launch spec under <build>/render/<host>/ is an error,
so a render-only mode that silently stops rendering cannot pass as fast. Task counts come from the PLAY RECAP of the default
callback. Only figures are printed: nothing here passes or fails on timing. A command that fails is
an error (its output tail is shown and the exit code is 1), because its timing would mean nothing.
"""

import argparse
import configparser
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

import gen_fleet  # noqa: E402  (beside this script: Python puts the script's directory first on the path)

BIN = os.path.dirname(sys.executable)
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                   r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)"
                   r"(?:\s+rescued=(?P<rescued>\d+))?(?:\s+ignored=(?P<ignored>\d+))?", re.M)
# profile_tasks / profile_roles: "role : task name ------------------------- 1.23s"
PROFILE_LINE = re.compile(r"^(?P<name>.*?)\s-{3,}\s+(?P<secs>\d+\.\d+)s\s*$")
KINDS = ("floor", "validate", "render")
#: --ops: the controller-only playbooks, compared with validate (issue 12 #5: as fast as validate)
OPS_KINDS = ("capacity", "monitoring")
#: From this many hosts on a size is "large": --large-runs applies, and the issue-13 target is printed.
LARGE = 256


def tool(name):
    """Path of an Ansible entry point next to this Python (the venv), else from PATH."""
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else (shutil.which(name) or name)


def configured_forks():
    """forks as ansible.cfg / ANSIBLE_FORKS give it (what every command of the bench uses)."""
    if os.environ.get("ANSIBLE_FORKS"):
        return os.environ["ANSIBLE_FORKS"]
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(os.environ.get("ANSIBLE_CONFIG") or os.path.join(ROOT, "ansible.cfg"))
    return cfg.get("defaults", "forks", fallback="5 (Ansible default)")


def base_env():
    env = dict(os.environ)
    # the default callback keeps the recap parseable; no colour codes in it
    env.update(ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_RETRY_FILES_ENABLED="false", PYTHONDONTWRITEBYTECODE="1")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    return env


def command(kind, inventory, build, forks=None):
    """argv of one benchmarked command."""
    extra = ["-f", str(forks)] if forks else []
    if kind == "floor":
        return [tool("ansible"), "all", "-m", "ansible.builtin.ping", "-i", inventory] + extra
    out = ["-e", f"pd_plan_build_dir={build}"]
    if kind == "capacity":
        return [tool("ansible-playbook"), "playbooks/capacity_report.yml", "-i", inventory,
                "-e", f"pd_ops_reports_dir={build}/reports"] + out + extra
    if kind == "monitoring":
        return [tool("ansible-playbook"), "playbooks/monitoring.yml", "-i", inventory,
                "-e", f"pd_monitoring_dir={build}/monitoring"] + out + extra
    if kind == "validate":
        return [tool("ansible-playbook"), "playbooks/validate.yml", "-i", inventory] + out + extra
    return [tool("ansible-playbook"), "playbooks/deploy_pd.yml", "-i", inventory,
            "-e", "pd_render_only=true"] + out + extra


def parse_recap(text):
    """{host: {ok, changed, unreachable, failed, skipped, ...}} from the last PLAY RECAP of ``text``."""
    tail = text[text.rfind("PLAY RECAP"):] if "PLAY RECAP" in text else ""
    return {m["host"]: {k: int(v or 0) for k, v in m.groupdict().items() if k != "host"}
            for m in RECAP.finditer(tail)}


def count_floor(text):
    """Hosts that answered the ad-hoc ping (the floor has no recap)."""
    return len(re.findall(r"^\S+ \| SUCCESS", text, re.M))


def count_specs(build):
    """Launch spec files a render-only run wrote: <build>/render/<host>/<container>.json."""
    render = os.path.join(build, "render")
    if not os.path.isdir(render):
        return 0
    return sum(1 for host in os.listdir(render) if os.path.isdir(os.path.join(render, host))
               for name in os.listdir(os.path.join(render, host)) if name.startswith("pd-") and name.endswith(".json"))


class CommandFailed(RuntimeError):
    pass


def run(argv, env, timeout):
    """Run ``argv`` from the repository root; return (wall seconds, child CPU seconds, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise CommandFailed(f"{' '.join(argv)}\nexit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-4000:]}"
                            f"\n--- stderr (tail)\n{proc.stderr[-4000:]}")
    return wall, cpu, proc.stdout


def task_counts(recap):
    """Per-host task results (ok + failed + unreachable + skipped) and fleet totals from a recap."""
    per_host = [s["ok"] + s["failed"] + s["unreachable"] + s["skipped"] for s in recap.values()]
    totals = {k: sum(s[k] for s in recap.values()) for k in ("ok", "changed", "skipped", "failed")}
    return {
        "hosts": len(recap),
        "per_host_min": min(per_host, default=0),
        "per_host_max": max(per_host, default=0),
        "total": sum(per_host),
        **totals,
    }


def runs_for(hosts, args):
    """Runs at a size: ``--runs``, or ``--large-runs`` from LARGE hosts on (a 1024-host ping takes minutes)."""
    return args.large_runs if hosts >= LARGE else args.runs


def bench_size(hosts, args, workdir, env):
    """Generate the fleet of ``hosts`` hosts and time every command runs_for() times (interleaved)."""
    per_cluster = args.prefill_hosts + args.decode_hosts
    if hosts % per_cluster:
        raise SystemExit(f"bench: {hosts} hosts is not a multiple of {per_cluster} (P + D hosts per cluster)")
    clusters = hosts // per_cluster
    inventory = os.path.join(workdir, f"fleet{hosts}")
    gen_fleet.write_fleet(inventory, clusters, args.prefill_hosts, args.decode_hosts)
    runs = runs_for(hosts, args)
    kinds = KINDS + (OPS_KINDS if args.ops else ())
    result = {"hosts": hosts, "clusters": clusters, "runs": runs, "wall": {k: [] for k in kinds},
              "cpu": {k: [] for k in kinds}, "tasks": {}}
    for attempt in range(runs):
        for kind in kinds:
            build = tempfile.mkdtemp(prefix=f"{kind}{hosts}-", dir=workdir)
            wall, cpu, out = run(command(kind, inventory, build, args.forks), env, args.timeout)
            result["wall"][kind].append(wall)
            result["cpu"][kind].append(cpu)
            if kind == "floor":
                answered = count_floor(out)
                if answered != hosts:
                    raise CommandFailed(f"ping: {answered} of {hosts} hosts answered\n{out[-4000:]}")
            else:
                counts = task_counts(parse_recap(out))
                # a playbook may run its controller work once (run_once include) and list fewer hosts
                if not counts["hosts"] or counts["failed"]:
                    raise CommandFailed(f"{kind}: no PLAY RECAP or a failed task\n{out[-4000:]}")
                result["tasks"][kind] = counts
            if kind == "capacity" and len(os.listdir(os.path.join(build, "reports"))) != clusters:
                raise CommandFailed(f"capacity-report: not one report per cluster under {build}/reports\n{out[-4000:]}")
            if kind == "render":
                specs = count_specs(build)
                if not specs:
                    raise CommandFailed(f"render: no launch spec written under {build}/render/<host>/\n{out[-4000:]}")
                result["specs"] = specs
            shutil.rmtree(build, ignore_errors=True)
            print(f"  {hosts:>4} hosts  run {attempt + 1}/{runs}  {kind:<8} {wall:7.2f}s wall "
                  f"{cpu:7.2f}s cpu", file=sys.stderr, flush=True)
    for key in ("wall", "cpu"):
        result[key] = {k: statistics.median(v) for k, v in result[key].items()}
    return result


def fmt_ratio(num, den):
    return f"{num / den:.2f}x" if den else "-"


def print_table(results, args):
    print()
    runs = sorted({r["runs"] for r in results})
    print(f"pd-deploy bench: median of {'/'.join(map(str, runs))} run(s) (column runs); forks {args.forks or configured_forks()}; "
          f"{args.prefill_hosts} P + {args.decode_hosts} D hosts per cluster; {os.cpu_count()} CPU(s); "
          f"ansible_connection=local")
    print(f"load average (1/5/15 min) at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"(other work on this machine inflates wall times; CPU seconds are less sensitive)")
    print()
    head = (f"{'hosts':>5} {'clu':>4} {'runs':>4} | {'ping s':>7} {'validate s':>10} {'render s':>9} | "
            f"{'val/ping':>8} {'rend/ping':>9} | {'render tasks/host':>17} {'render total':>12} "
            f"{'ok':>5} {'chg':>5} {'skip':>5} | {'val tasks':>9} | {'specs':>5}")
    print("wall time (seconds, median)")
    print(head)
    print("-" * len(head))
    for r in results:
        w, t = r["wall"], r["tasks"]
        rt, vt = t["render"], t["validate"]
        per_host = (f"{rt['per_host_min']}" if rt["per_host_min"] == rt["per_host_max"]
                    else f"{rt['per_host_min']}-{rt['per_host_max']}")
        print(f"{r['hosts']:>5} {r['clusters']:>4} {r['runs']:>4} | {w['floor']:>7.2f} {w['validate']:>10.2f} {w['render']:>9.2f} | "
              f"{fmt_ratio(w['validate'], w['floor']):>8} {fmt_ratio(w['render'], w['floor']):>9} | "
              f"{per_host:>17} {rt['total']:>12} {rt['ok']:>5} {rt['changed']:>5} {rt['skipped']:>5} | "
              f"{vt['total']:>9} | {r['specs']:>5}")
    print()
    head = (f"{'hosts':>5} {'clu':>4} | {'ping cpu':>8} {'validate cpu':>12} {'render cpu':>10} | "
            f"{'val/ping':>8} {'rend/ping':>9}")
    print("CPU time of ansible and its workers (user + sys seconds, median)")
    print(head)
    print("-" * len(head))
    for r in results:
        c = r["cpu"]
        print(f"{r['hosts']:>5} {r['clusters']:>4} | {c['floor']:>8.2f} {c['validate']:>12.2f} {c['render']:>10.2f} | "
              f"{fmt_ratio(c['validate'], c['floor']):>8} {fmt_ratio(c['render'], c['floor']):>9}")
    if len(results) >= 2:
        print()
        print("growth of wall / CPU seconds from one size to the next and over the whole range "
              "(equal to the hosts ratio = linear)")
        for first, last in list(zip(results, results[1:])) + ([(results[0], results[-1])] if len(results) > 2 else []):
            print(growth_line(first, last))
    large = [r for r in results if r["hosts"] >= LARGE]
    if large:
        print()
    for r in large:
        print(f"issue 13 target at {r['hosts']} hosts: validate and render-only <= 1.00x ping floor; measured "
              f"validate {fmt_ratio(r['wall']['validate'], r['wall']['floor'])} wall "
              f"{fmt_ratio(r['cpu']['validate'], r['cpu']['floor'])} CPU, render-only "
              f"{fmt_ratio(r['wall']['render'], r['wall']['floor'])} wall "
              f"{fmt_ratio(r['cpu']['render'], r['cpu']['floor'])} CPU (figures only, not asserted)")
    if "capacity" in results[0]["wall"]:
        print()
        head = (f"{'hosts':>5} {'clu':>4} | {'validate s':>10} {'capacity s':>10} {'monitor s':>9} | "
                f"{'validate cpu':>12} {'capacity cpu':>12} {'monitor cpu':>11} | {'cap/val cpu':>11} {'mon/val cpu':>11}")
        print("controller-only playbooks (--ops) against validate, which each of them runs first (median)")
        print(head)
        print("-" * len(head))
        for r in results:
            w, c = r["wall"], r["cpu"]
            print(f"{r['hosts']:>5} {r['clusters']:>4} | {w['validate']:>10.2f} {w['capacity']:>10.2f} {w['monitoring']:>9.2f} | "
                  f"{c['validate']:>12.2f} {c['capacity']:>12.2f} {c['monitoring']:>11.2f} | "
                  f"{fmt_ratio(c['capacity'], c['validate']):>11} {fmt_ratio(c['monitoring'], c['validate']):>11}")
    last = results[-1]
    print(f"issue 6 target at {last['hosts']} hosts: render-only <= 3.00x ping floor; "
          f"measured {fmt_ratio(last['wall']['render'], last['wall']['floor'])} wall, "
          f"{fmt_ratio(last['cpu']['render'], last['cpu']['floor'])} CPU (figures only, not asserted)")


def growth_line(first, last):
    """One line: how each command's wall and CPU seconds grew from ``first`` to ``last`` (bench results)."""
    def ratio(kind, key):
        return f"x{last[key][kind] / first[key][kind]:.2f}" if first[key][kind] else "-"
    tasks = last["tasks"]["render"]["total"] / max(1, first["tasks"]["render"]["total"])
    return (f"  {first['hosts']:>4} -> {last['hosts']:<4} hosts (x{last['hosts'] / first['hosts']:g}): "
            + ", ".join(f"{k} {ratio(k, 'wall')} / {ratio(k, 'cpu')}" for k in KINDS)
            + f"; render tasks x{tasks:.2f}")


def profile_sections(text):
    """{"TASKS": [(name, secs)], "ROLES": [(name, secs)]} from profile_tasks / profile_roles output."""
    out, current = {}, None
    for line in text.splitlines():
        head = re.match(r"^(TASKS|ROLES) RECAP \*", line)
        if head:
            current = out.setdefault(head.group(1), [])
            continue
        match = PROFILE_LINE.match(line)
        if current is not None and match and match["name"] != "total":
            current.append((match["name"].strip(), float(match["secs"])))
    return out


def aggregate(rows):
    """Sum the seconds of same-named tasks (include_role / serial batches repeat a task per host or batch)."""
    sums = {}
    for name, secs in rows:
        total, count = sums.get(name, (0.0, 0))
        sums[name] = (total + secs, count + 1)
    return sorted(((total, count, name) for name, (total, count) in sums.items()), reverse=True)


def profile(hosts, args, workdir, env):
    """One render-only run with ansible.posix.profile_tasks + profile_roles; print where time goes."""
    inventory = os.path.join(workdir, f"fleet{hosts}")
    if not os.path.isdir(inventory):
        gen_fleet.write_fleet(inventory, hosts // (args.prefill_hosts + args.decode_hosts),
                              args.prefill_hosts, args.decode_hosts)
    build = tempfile.mkdtemp(prefix=f"profile{hosts}-", dir=workdir)
    penv = dict(env, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks,ansible.posix.profile_roles",
                PROFILE_TASKS_TASK_OUTPUT_LIMIT="all")
    wall, cpu, out = run(command("render", inventory, build, args.forks), penv, args.timeout)
    shutil.rmtree(build, ignore_errors=True)
    sections = profile_sections(out)
    tasks = aggregate(sections.get("TASKS", []))
    print()
    print(f"render-only profile at {hosts} hosts: {wall:.2f}s wall, {cpu:.2f}s CPU; "
          f"{len(sections.get('TASKS', []))} task blocks run (same-named tasks summed; n = blocks)")
    print("  roles (profile_roles):")
    for name, secs in sorted(sections.get("ROLES", []), key=lambda r: -r[1]):
        print(f"    {secs:8.2f}s  {name}")
    print(f"  tasks (profile_tasks, top {args.profile_top}):")
    for total, count, name in tasks[:args.profile_top]:
        print(f"    {total:8.2f}s  n={count:<4} {name[:100]}")
    return tasks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", "-n", type=int, default=3, help="runs per command and size; the median is shown (3)")
    parser.add_argument("--large-runs", type=int, default=1,
                        help=f"runs per command at sizes of {LARGE} hosts and more (1: the 1024-host ping alone "
                             "takes minutes on 2 CPUs)")
    parser.add_argument("--sizes", default="4,16,64,256,1024",
                        help="host counts, comma separated (4,16,64,256,1024)")
    parser.add_argument("--quick", action="store_true", help="smoke: 1 run, sizes 4 and 16")
    parser.add_argument("--prefill-hosts", type=int, default=2, help="prefill hosts per cluster (2)")
    parser.add_argument("--decode-hosts", type=int, default=2, help="decode hosts per cluster (2)")
    parser.add_argument("--forks", "-f", type=int, default=None,
                        help="pass -f to every command (default: ansible.cfg's forks, for all three)")
    parser.add_argument("--profile", action="store_true",
                        help="also run render-only once at the largest size with profile_tasks / profile_roles")
    parser.add_argument("--profile-top", type=int, default=25, help="profile_tasks lines to show (25)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one command may take (3600)")
    parser.add_argument("--ops", action="store_true",
                        help="also time playbooks/capacity_report.yml and playbooks/monitoring.yml against validate")
    parser.add_argument("--keep", metavar="DIR", help="write inventories and builds under DIR and keep them")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.large_runs, args.sizes = 1, 1, "4,16"
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if args.runs < 1 or args.large_runs < 1 or not sizes:
        parser.error("--runs and --large-runs must be >= 1 and --sizes must name at least one size")

    env = base_env()
    workdir = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="pd-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        results = [bench_size(hosts, args, workdir, env) for hosts in sizes]
        print_table(results, args)
        if args.profile:
            profile(sizes[-1], args, workdir, env)
    except CommandFailed as exc:
        print(f"bench: a benchmarked command failed, no timing is shown for it:\n{exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
