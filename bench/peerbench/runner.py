#!/usr/bin/env python3
"""Interleaved router-overhead benchmark runner.

Starts 2 fake backends and the selected router targets (all on 127.0.0.1),
then for every (prompt size, concurrency, rep) round runs the load client
once against every target, in a rotated order, and appends one JSON line
per run to --out. Every process it starts is stopped by PID at the end.

Targets
  direct        client spreads requests over the backends itself (baseline)
  sg_rr, sg_ca  sglang-router (round_robin / cache_aware)
  vl_rr, vl_ca  vllm-router   (round_robin / cache_aware)
  --add-target 'NAME|CMD'   any other proxy: CMD is a shell command with the
                placeholders {port} {prom} {workers} (space-separated URLs)
                {workers_csv} {w1} {w2}; it must serve GET /health.
  --add-target 'NAME|@URL[|PID]'  an already running proxy at URL (its PID,
                if given, is used for CPU accounting only; never stopped).

Per run it records the client's JSON (role/ttft/e2e percentiles, req/s,
errors) plus CPU seconds (utime+stime from /proc/PID/stat) consumed by the
router process and by each backend during the run, and the whole machine's
busy fraction (/proc/stat).

Example:
  python runner.py --out results_main.jsonl --tag main --reps 5 \
      --targets direct,sg_rr,sg_ca,vl_rr,vl_ca --conc 1,16,128,512 \
      --prompt-chars 200,100000 --duration 6 --duration-c1 10 --pause 0.5
Summarise with summarize.py (--compact for the report's table).
Note: a --backend-args value that starts with "--" must be written with "=",
e.g. --backend-args=--role-with-first.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CLK = os.sysconf("SC_CLK_TCK")


def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    # fields after comm: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    return s[s.rindex(")") + 2:].split()


def proc_cpu(pid):
    """utime+stime (s) of a process and all its live descendants (workers, tokeniser pools), all
    threads, plus what its reaped children used (cutime+cstime)."""
    rest = _stat(pid)
    if rest is None:
        return None
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            r = _stat(int(d))
            if r is not None:
                children.setdefault(int(r[1]), []).append((int(d), r))
    total, todo = 0, [(pid, rest)]
    while todo:
        p, r = todo.pop()
        total += int(r[11]) + int(r[12]) + int(r[13]) + int(r[14])
        todo.extend(children.get(p, []))
    return total / CLK


def _settle(pid, quiet=0.02, step=0.25, limit=10.0):
    """Wait until the process tree `pid` is nearly idle (under `quiet` s of CPU per `step` s, at
    most `limit` s): work a prime started in the background (tokenising new heads) ends before
    the measured run."""
    if not pid:
        return
    t_end = time.time() + limit
    last = proc_cpu(pid)
    while last is not None and time.time() < t_end:
        time.sleep(step)
        now = proc_cpu(pid)
        if now is None or now - last < quiet:
            return
        last = now


def sys_cpu():
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    v = [int(x) for x in parts]
    idle = v[3] + v[4]
    return sum(v[:8]), idle


def _probe(cmd):
    if not cmd:
        return None
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def http_ok(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


class Managed:
    def __init__(self, name, cmd, log, env=None):
        self.name = name
        self.log = open(log, "ab")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=env, shell=isinstance(cmd, str))
        self.pid = self.p.pid

    def stop(self):
        if self.p.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.p.wait(5)
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="main")
    ap.add_argument("--python", default=sys.executable, help="python for backend and client")
    ap.add_argument("--router-bin", default="/tmp/vllmcpu/rvenv/bin")
    ap.add_argument("--backend-ports", default="18001,18002")
    ap.add_argument("--backend-args", default="", help="extra args for fake_backend.py")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--port-base", type=int, default=18100)
    ap.add_argument("--targets", default="direct,sg_rr,sg_ca,vl_rr,vl_ca")
    ap.add_argument("--add-target", action="append", default=[])
    ap.add_argument("--router-extra", default="", help="extra args appended to every built-in router command")
    ap.add_argument("--conc", default="1,16,128,512")
    ap.add_argument("--prompt-chars", default="200,100000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--duration-c1", type=float, default=10.0, help="measured seconds at concurrency 1")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--pause", type=float, default=1.0, help="idle seconds between runs")
    ap.add_argument("--logdir", default="/tmp/peerbench/logs",
                    help="process logs (sglang-router logs 2 INFO lines per request: ~160 MB per router for the full matrix)")
    ap.add_argument("--header", action="append", default=[], help="extra request header for every target")
    ap.add_argument("--line-chars", type=int, default=0, help="load_client.py --line-chars (0: one-line prompts)")
    ap.add_argument("--probe", action="append", default=[],
                    help="NAME|CMD: a command run before and after each run of target NAME; its stdout "
                         "(one JSON object) is recorded as probe_before / probe_after")
    ap.add_argument("--prime", action="store_true",
                    help="before each measured run, send every prompt of that run's pool once, one at a time "
                         "(unmeasured), and wait until the target is idle, so the run measures requests over prompts the target has "
                         "seen, not their first sighting")
    ap.add_argument("--idle-measure", type=float, default=0.0,
                    help="after start-up, measure each process's CPU while idle for this many seconds")
    a = ap.parse_args()

    os.makedirs(a.logdir, exist_ok=True)
    bports = [int(x) for x in a.backend_ports.split(",")]
    workers = ["http://127.0.0.1:%d" % p for p in bports]
    managed = []
    try:
        # ---- backends
        bprocs = []
        for p in bports:
            cmd = [a.python, os.path.join(HERE, "fake_backend.py"), "--port", str(p),
                   "--tokens", str(a.tokens)] + shlex.split(a.backend_args)
            m = Managed("backend%d" % p, cmd, os.path.join(a.logdir, "%s_backend%d.log" % (a.tag, p)))
            managed.append(m)
            bprocs.append(m)
        for w in workers:
            t0 = time.time()
            while not http_ok(w + "/health"):
                if time.time() - t0 > 20:
                    raise SystemExit("backend %s not healthy" % w)
                time.sleep(0.2)

        # ---- targets
        rb = a.router_bin
        extra = shlex.split(a.router_extra)
        catalog = {
            "sg_rr": lambda port, prom: [os.path.join(rb, "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
                                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                                         "--worker-urls", *workers, "--policy", "round_robin",
                                         "--worker-startup-check-interval", "1"] + extra,
            "sg_ca": lambda port, prom: [os.path.join(rb, "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
                                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                                         "--worker-urls", *workers, "--policy", "cache_aware",
                                         "--worker-startup-check-interval", "1"] + extra,
            "vl_rr": lambda port, prom: [os.path.join(rb, "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                                         "--worker-urls", *workers, "--policy", "round_robin",
                                         "--worker-startup-check-interval", "1"] + extra,
            "vl_ca": lambda port, prom: [os.path.join(rb, "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                                         "--worker-urls", *workers, "--policy", "cache_aware",
                                         "--worker-startup-check-interval", "1"] + extra,
        }
        targets = []  # (name, [urls], pid or None, cmdline)
        names = [t for t in a.targets.split(",") if t]
        for i, name in enumerate(names):
            if name == "direct":
                targets.append(("direct", workers, None, "(client -> both backends)"))
                continue
            port, prom = a.port_base + i, a.port_base + 100 + i
            cmd = catalog[name](port, prom)
            m = Managed(name, cmd, os.path.join(a.logdir, "%s_%s.log" % (a.tag, name)))
            managed.append(m)
            targets.append((name, ["http://127.0.0.1:%d" % port], m, " ".join(shlex.quote(c) for c in cmd)))
        for j, spec in enumerate(a.add_target):
            parts = spec.split("|")
            name, cmd = parts[0], parts[1]
            if cmd.startswith("@"):
                pid = int(parts[2]) if len(parts) > 2 else None
                targets.append((name, [cmd[1:]], pid, "(external %s)" % cmd[1:]))
                continue
            port, prom = a.port_base + 50 + j, a.port_base + 150 + j
            cmd = cmd.format(port=port, prom=prom, workers=" ".join(workers), workers_csv=",".join(workers),
                             w1=workers[0], w2=workers[1] if len(workers) > 1 else workers[0])
            m = Managed(name, "exec " + cmd, os.path.join(a.logdir, "%s_%s.log" % (a.tag, name)))
            managed.append(m)
            targets.append((name, ["http://127.0.0.1:%d" % port], m, cmd))

        expect = a.tokens + 3  # role + tokens + usage + [DONE]
        client = [a.python, os.path.join(HERE, "load_client.py"), "--line-chars", str(a.line_chars)] \
            + sum([["--header", h] for h in a.header], [])
        for name, urls, m, cmd in targets:
            t0 = time.time()
            res = None
            while True:
                if m is not None and isinstance(m, Managed) and m.p.poll() is not None:
                    raise SystemExit("%s exited early, see logs" % name)
                if http_ok(urls[0] + "/health") or http_ok(urls[0] + "/healthz"):
                    r = subprocess.run(client + sum([["--url", u] for u in urls], []) +
                                       ["-c", "2", "--count", "6", "--warmup", "0", "-t", "5",
                                        "--expect-events", str(expect), "--timeout", "5"],
                                       capture_output=True, text=True)
                    try:
                        res = json.loads(r.stdout)
                    except ValueError:
                        res = {"errors": -1, "stderr": r.stderr[-500:]}
                    if res.get("errors") == 0 and res.get("bad_event_count") == 0 and res.get("n_total_ok", 0) >= 6:
                        break
                if time.time() - t0 > 60:
                    raise SystemExit("%s not ready: %s" % (name, res))
                time.sleep(0.5)
            pid = m.pid if isinstance(m, Managed) else m
            print("ready: %-8s %s pid=%s  %s" % (name, urls, pid, cmd), flush=True)

        idle = {}
        if a.idle_measure > 0:
            time.sleep(2.0)
            procs = [(m.name, m.pid) for m in managed]
            c0 = {n: proc_cpu(p) for n, p in procs}
            time.sleep(a.idle_measure)
            for n, p in procs:
                c1 = proc_cpu(p)
                idle[n] = (c1 - c0[n]) / a.idle_measure * 1000.0
            print("idle CPU ms/s: %s" % ", ".join("%s=%.2f" % kv for kv in idle.items()), flush=True)
        meta = {"type": "meta", "tag": a.tag, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "idle_cpu_ms_per_s": idle,
                "targets": {n: {"urls": u, "cmd": c} for n, u, _, c in targets},
                "backend_cmd_args": a.backend_args, "tokens": a.tokens, "args": vars(a)}
        out = open(a.out, "a")
        out.write(json.dumps(meta) + "\n")
        out.flush()

        probes = dict(p.split("|", 1) for p in a.probe)
        concs = [int(x) for x in a.conc.split(",")]
        sizes = [int(x) for x in a.prompt_chars.split(",")]
        for size in sizes:
            for c in concs:
                for rep in range(a.reps):
                    k = rep % len(targets)
                    order = targets[k:] + targets[:k]  # rotate order every round
                    seed = 1000 + rep
                    for pos, (name, urls, m, _) in enumerate(order):
                        pid = m.pid if isinstance(m, Managed) else m
                        dur = a.duration_c1 if c == 1 else a.duration
                        same = client + sum([["--url", u] for u in urls], []) + [
                            "--prompt-chars", str(size), "--seed", str(seed), "--max-tokens", str(a.tokens)]
                        cmdl = same + ["-c", str(c), "-t", str(dur), "--warmup", str(a.warmup),
                                       "--expect-events", str(expect)]
                        if a.prime:  # the same pool, each prompt once, one at a time
                            subprocess.run(same + ["-c", "1", "-t", "600", "--warmup", "0", "--sweep"],
                                           capture_output=True, text=True)
                            _settle(pid)
                        probe = probes.get(name)
                        p0 = _probe(probe)
                        r_cpu0 = proc_cpu(pid) if pid else None
                        b_cpu0 = [proc_cpu(b.pid) for b in bprocs]
                        s0 = sys_cpu()
                        t0 = time.time()
                        r = subprocess.run(cmdl, capture_output=True, text=True)
                        wall = time.time() - t0
                        s1 = sys_cpu()
                        r_cpu1 = proc_cpu(pid) if pid else None
                        b_cpu1 = [proc_cpu(b.pid) for b in bprocs]
                        try:
                            res = json.loads(r.stdout)
                        except ValueError:
                            res = {"client_failed": True, "stderr": r.stderr[-2000:]}
                        if probe:
                            res.update({"probe_before": p0, "probe_after": _probe(probe)})
                        res.update({
                            "type": "run", "tag": a.tag, "target": name, "prompt_chars": size,
                            "concurrency": c, "rep": rep, "pos": pos,
                            "router_cpu_s": (r_cpu1 - r_cpu0) if (r_cpu0 is not None and r_cpu1 is not None) else None,
                            "backend_cpu_s": [y - x for x, y in zip(b_cpu0, b_cpu1)],
                            "sys_busy_frac": 1 - (s1[1] - s0[1]) / max(1, (s1[0] - s0[0])),
                            "run_wall_s": wall,
                        })
                        out.write(json.dumps(res) + "\n")
                        out.flush()
                        print("%s S=%-6d C=%-4d rep=%d %-7s n=%-6s rps=%-8.1f ttft50=%-7.2f ttft99=%-7.2f role50=%-6.2f err=%s rcpu=%s" % (
                            a.tag, size, c, rep, name, res.get("n"), res.get("rps") or 0,
                            res.get("ttft_p50_ms") or -1, res.get("ttft_p99_ms") or -1, res.get("role_p50_ms") or -1,
                            res.get("errors"), None if res["router_cpu_s"] is None else round(res["router_cpu_s"], 2)),
                            flush=True)
                        time.sleep(a.pause)
        out.close()
    finally:
        for m in reversed(managed):
            m.stop()
        print("stopped: %s" % ", ".join("%s(pid %d)" % (m.name, m.pid) for m in managed), flush=True)


if __name__ == "__main__":
    main()
