"""What the bootstrap installed, wrote and runs on the simulated host, read inside it: printed as JSON.

Run by tasks/host-state.yml as `docker exec -i pd-boot-p0 python3 - [ARGS]` (this file on stdin), so
every fact comes from the host itself, never over a network. ARGS:
  --container NAME   also `docker inspect` that container of the host's engine (its State)
  --probe IMAGE      also run a throwaway container of IMAGE on the host's engine: its nofile and
                     memlock limits (`ulimit -n`, `ulimit -l`: the engine's default-ulimits) and the
                     log configuration the engine gave it (daemon.json's log-driver and log-opts)

memlock: no process may raise a hard limit above its own without CAP_SYS_RESOURCE, which the simulated
host does not have (and some test machines have nowhere: a VM sandbox's capability bounding set). Where
the host's memlock hard limit is finite, a container asked to run with memlock unlimited (daemon.json's
default-ulimits) cannot start: its runc fails with "error setting rlimit type 8" (RLIMIT_MEMLOCK), which
is itself the proof that the engine applies that limit. The probe then runs a second container with
`--ulimit memlock=<the host's hard limit>` (its other limits still the engine's defaults); memlock_hard
(-1 for unlimited) lets the scenario start its own containers the same way.
"""
import argparse
import json
import os
import resource
import subprocess

PATHS = ["/usr/sbin/dockerd", "/var/run/docker.sock", "/etc/docker/daemon.json",
         "/etc/security/limits.d/90-pd-deploy.conf", "/var/lib/pd-deploy/locks"]


def run(*argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout.strip(), proc.stderr.strip()


def docker_json(*argv):
    rc, out, err = run("docker", *argv)
    if rc != 0:
        return {"error": err or f"rc {rc}"}
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--container")
    ap.add_argument("--probe")
    args = ap.parse_args()
    state = {"paths": {p: os.path.exists(p) for p in PATHS}}
    rc, out, _ = run("dpkg-query", "-W", "-f", "${Status} ${Version}", "docker.io")
    state["package"] = out if rc == 0 else ""
    try:
        with open("/etc/docker/daemon.json", encoding="utf-8") as f:
            state["daemon_json"] = json.load(f)
    except FileNotFoundError:
        state["daemon_json"] = None
    # the engine's unit: its main process and when systemd started it (microseconds, UTC)
    _, out, _ = run("systemctl", "show", "docker.service", "--timestamp=us+utc",
                    "-p", "MainPID", "-p", "ExecMainStartTimestamp", "-p", "ActiveState", "-p", "LoadState")
    state["engine"] = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    state["info"] = docker_json("info", "--format", "{{json .}}") if state["paths"]["/usr/sbin/dockerd"] else None
    if args.container:
        state["container"] = docker_json("inspect", "--format", "{{json .State}}", args.container)
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    state["memlock_hard"] = -1 if hard == resource.RLIM_INFINITY else hard
    if args.probe:
        state["probe"] = probe(args.probe, [])
        if state["memlock_hard"] != -1:
            state["probe_capped"] = probe(args.probe, ["--ulimit", f"memlock={hard}:{hard}"])
    print(json.dumps(state))


def probe(image, extra):
    """A throwaway container: the limits it runs with and the log configuration the engine gave it."""
    rc, out, err = run("docker", "create", "--network", "none", *extra, image, "sh", "-c", "ulimit -n; ulimit -l")
    if rc != 0:
        return {"rc": rc, "stderr": err}
    cid = out.splitlines()[-1]
    log_config = docker_json("inspect", "--format", "{{json .HostConfig.LogConfig}}", cid)
    rc, out, err = run("docker", "start", "--attach", cid)
    run("docker", "rm", "--force", cid)
    return {"rc": rc, "ulimits": out.split(), "stderr": err, "log_config": log_config}


if __name__ == "__main__":
    main()
