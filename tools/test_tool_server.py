#!/usr/bin/env python3
"""`wrapcert serve-forks SOCKET`, the tool's own server (tools/python/wrapcert_preload.py has its
client): a run there is a fork of the server, with the caller's arguments, streams, folder,
environment and exit status; a caller whose start-up variables or limits differ is refused (and
its client starts the tool anew); a caller that goes takes its run with it.

    test_tool_server.py TOOL
"""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import wrapcert_preload  # noqa: E402

TOOL = os.path.abspath(sys.argv[1])


def request(path, argv, env=None, rlimits=None, cwd=None, streams=None):
    """Sends one request; returns the connection and the first reply."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    message = {"program": TOOL, "argv": argv, "env": dict(env or os.environ),
               "cwd": cwd or os.getcwd(), "rlimits": rlimits or wrapcert_preload.limits(),
               "umask": 0o22, "ignored": [], "blocked": []}
    socket.send_fds(conn, [(json.dumps(message) + "\n").encode()], streams or [0, 1, 2])
    reply, buffer = wrapcert_preload.read_line(conn)
    return conn, reply, buffer


def wait_status(conn, buffer):
    """The wait status the server sends once the run ends."""
    while b"\n" not in buffer:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        buffer += chunk
    return json.loads(buffer.split(b"\n")[0]).get("status")


def started_with(command, socket_path, fds):
    """A server started, as a shell or ctest starts one, with other descriptors open: `fds`."""
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, pass_fds=fds)
    for _ in range(3000):
        if os.path.exists(socket_path) or server.poll() is not None:
            break
        time.sleep(0.02)
    return server


def inherited_descriptors(check, d, golden, listing):
    """A descriptor a server was started with is not the server's: a caller's descriptor under
    that number is served, not refused, and is the run's; one the caller does not have is not
    open in the run. (ctest and shells leave such descriptors open to the servers they start
    and to the callers alike.) `listing` holds the keys of the checkpoint `golden`."""
    server_listing = os.path.join(d, "server-listing.txt")
    with open(server_listing, "w") as f:
        f.write("server_only.weight\n")
    shared, unshared = 57, 58
    for fd in (shared, unshared):
        opened = os.open(server_listing, os.O_RDONLY)
        os.dup2(opened, fd, inheritable=True)
        os.close(opened)
    script = os.path.join(d, "descriptors.py")
    with open(script, "w") as f:
        f.write("import os\n"
                "open_ = [int(fd) for fd in os.listdir('/proc/self/fd')]\n"
                f"print({shared} in open_, {unshared} in open_, "
                f"open('/dev/fd/{shared}').readline().strip())\n")
    servers = []
    try:
        tool_socket = os.path.join(d, "inherited-tool.sock")
        servers.append(started_with([TOOL, "serve-forks", tool_socket], tool_socket,
                                    [shared, unshared]))
        python_socket = os.path.join(d, "inherited-python.sock")
        servers.append(started_with([sys.executable, wrapcert_preload.__file__, "serve",
                                     python_socket], python_socket, [shared, unshared]))
        # The caller: its own file under the shared number, nothing under the other.
        os.close(unshared)
        caller = os.open(listing, os.O_RDONLY)
        os.dup2(caller, shared, inheritable=True)
        os.close(caller)

        def served(path, what):
            """(reply, wait status, output) of one request with the caller's `shared`."""
            out_path = os.path.join(d, "inherited-out.txt")
            with open(out_path, "w") as sink:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(path)
                message = {"env": dict(os.environ), "cwd": d,
                           "rlimits": wrapcert_preload.limits(), "umask": 0o22, "ignored": [],
                           "blocked": [], "fds": [shared], **what}
                os.lseek(shared, 0, os.SEEK_SET)
                socket.send_fds(conn, [(json.dumps(message) + "\n").encode()],
                                [0, sink.fileno(), sink.fileno(), shared])
                reply, buffer = wrapcert_preload.read_line(conn)
                status = wait_status(conn, buffer) if "pid" in reply else None
                conn.close()
            with open(out_path) as f:
                return reply, status, f.read()

        # The tool: reading the caller's descriptor, and the one only the server had, as the
        # tool run anew by the caller does.
        for fd in (shared, unshared):
            args = ["check-keys", golden, "--keys", f"/dev/fd/{fd}"]
            os.lseek(shared, 0, os.SEEK_SET)
            direct = subprocess.run([TOOL, *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, pass_fds=[shared], text=True)
            reply, status, out = served(tool_socket, {"program": TOOL, "argv": args})
            check("pid" in reply, f"the tool's server: a caller's descriptor numbered as one the "
                                  f"server was started with is served ({reply})")
            code = None if status is None else os.waitstatus_to_exitcode(status)
            check((code, out) == (direct.returncode, direct.stdout),
                  f"the tool's server: --keys /dev/fd/{fd} as the tool run anew "
                  f"({code} against {direct.returncode}: {out[-200:]!r})")
        # The interpreter: the caller's descriptor open, the server's other one closed.
        reply, status, out = served(python_socket,
                                    {"interpreter": sys.executable, "argv": [script]})
        check("pid" in reply, f"the preloaded interpreter: a caller's descriptor numbered as one "
                              f"the server was started with is served ({reply})")
        check(status == 0 and out.strip() == "True False steps",
              f"the preloaded interpreter: the run has the caller's descriptor, not the server's, "
              f"and not the one only the server was started with ({out.strip()!r})")
    finally:
        os.close(shared)
        for server in servers:
            server.terminate()
            server.wait()


def ancestors(pid):
    out = []
    while pid > 1:
        with open(f"/proc/{pid}/status") as f:
            pid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
        out.append(pid)
    return out


def main():
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        server, command = wrapcert_preload.serve_tool(TOOL, d)
        check(server is not None, "the server starts and listens")
        if server is None:
            return 1
        try:
            path = command[4]
            # The same output, errors and exit code as the tool run anew, from the caller's folder.
            for args in (["fixture", "tiny-gemma", "--keys"], ["frobnicate"], ["--version"]):
                direct = subprocess.run([TOOL, *args], capture_output=True, cwd=d)
                served = subprocess.run([*command, *args], capture_output=True, cwd=d)
                check((direct.returncode, direct.stdout, direct.stderr) ==
                      (served.returncode, served.stdout, served.stderr),
                      f"wrapcert {' '.join(args)}: as the tool run anew ({served.returncode})")
            out = os.path.join(d, "keys.safetensors")
            served = subprocess.run([*command, "fixture", "tiny-gemma", "--device", "cpu", "--save",
                                     "keys.safetensors"], capture_output=True, cwd=d)
            check(served.returncode == 0 and os.path.isfile(out),
                  f"a relative path is the caller's ({served.returncode}: {served.stderr!r})")
            # The caller's other descriptors, under their numbers (`--keys <(...)` in a shell).
            golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                                  "golden", "checkpoints", "ddp.pt")
            listing = os.path.join(d, "listing.txt")
            with open(listing, "w") as f:
                f.write("steps\nscale_t\nembed.weight\nblock.0.weight\nblock.0.bias\n"
                        "block.1.weight\nblock.1.bias\nhead.weight\n")
            outs = []
            for run in ([TOOL], command):
                fd = os.open(listing, os.O_RDONLY)
                high = os.dup2(fd, 63, inheritable=True)
                os.close(fd)
                outs.append(subprocess.run([*run, "check-keys", golden, "--keys", "/dev/fd/63"],
                                           capture_output=True, pass_fds=[high]))
                os.close(high)
            check(outs[0].returncode == 1 and (outs[0].returncode, outs[0].stdout) ==
                  (outs[1].returncode, outs[1].stdout),
                  f"a descriptor of the caller's is the run's ({outs[1].returncode}: "
                  f"{outs[1].stderr!r})")
            # Served: a child of a keeper, a child of the server.
            with open(os.path.join(d, "out.txt"), "w") as sink:
                conn, reply, buffer = request(path, ["fixture", "gemma-2b"], streams=[0, sink.fileno(), 2])
            pid = reply.get("pid")
            check(pid is not None and ancestors(pid)[1] == server.pid,
                  f"a run is forked by the server ({reply})")
            while b"\n" not in buffer:
                buffer += conn.recv(4096)
            status = json.loads(buffer.split(b"\n")[0])["status"]
            check(os.waitstatus_to_exitcode(status) == 0, "its wait status comes back")
            with open(os.path.join(d, "out.txt")) as f:
                check("embed_tokens" in f.read(), "its output goes to the caller's stream")
            conn.close()
            # Start-up variables and limits that differ: refused, and the client runs it anew.
            env = dict(os.environ, OMP_NUM_THREADS="3")
            conn, reply, _ = request(path, ["--version"], env=env)
            check("OMP_NUM_THREADS" in reply.get("refused", ""), f"a start-up variable: {reply}")
            conn.close()
            limits = wrapcert_preload.limits()
            limits[str(resource.RLIMIT_FSIZE)] = [4096, limits[str(resource.RLIMIT_FSIZE)][1]]
            conn, reply, _ = request(path, ["--version"], rlimits=limits)
            check(f"limit {resource.RLIMIT_FSIZE} differs" in reply.get("refused", ""), f"a limit: {reply}")
            conn.close()
            served = subprocess.run([*command, "--version"], capture_output=True, env=env)
            check(served.returncode == 0 and served.stdout.startswith(b"wrapcert"),
                  "refused, the client runs the tool anew")
            # A signal to the client reaches the run; a client that goes takes the run with it.
            conn, reply, _ = request(path, ["certify", "--cases", "100000", "--quiet"],
                                     streams=[0, os.open(os.devnull, os.O_WRONLY), 2])
            pid = reply["pid"]
            conn.close()
            for _ in range(500):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                time.sleep(0.02)
            check(not os.path.exists(f"/proc/{pid}"), "a run whose caller went is killed")
            codes = []
            for run in ([TOOL], command):
                proc = subprocess.Popen([*run, "certify", "--cases", "100000", "--quiet"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(2)
                proc.send_signal(signal.SIGTERM)
                codes.append(proc.wait(timeout=60))
            check(codes[0] == codes[1], f"SIGTERM reaches the run, its end comes back ({codes})")
        finally:
            server.terminate()
            server.wait()
        check(not os.path.exists(os.path.join(d, "tool.sock")), "the server removes its socket")
        inherited_descriptors(check, d, golden, listing)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
