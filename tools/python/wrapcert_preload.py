#!/usr/bin/env python3
"""An interpreter that has imported torch once and starts Python scripts by forking: each one
starts in milliseconds instead of the second and a half that importing torch costs.

    wrapcert_preload.py serve SOCKET        # serve until killed (SIGTERM, SIGINT)
    wrapcert_preload.py run SOCKET SCRIPT [ARGS...]
                                            # run SCRIPT there as `python3 SCRIPT ARGS...` would:
                                            # this process's stdin, stdout, stderr, environment
                                            # and folder; its exit status; signals passed on
    wrapcert_preload.py run-program SOCKET PROGRAM [ARGS...]
                                            # the same for `wrapcert serve-forks SOCKET`, the
                                            # tool's own server: PROGRAM is the tool

`wrapcert certify-python` starts its workers there when WRAPCERT_PYTHON_PRELOAD names the
socket (docs/python.md, "A preloaded interpreter"). A script runs in a forked child of the
server, started the way a new interpreter starts it: its own streams, environment, folder,
arguments, `sys.path` (the script's folder and its PYTHONPATH), random seeds, temporary folder,
`-X faulthandler`; `__main__` is the script; at its end the threads are joined and the exit
handlers run. What a new interpreter would read at its start from the environment and a fork
would not (PYTHON* but PYTHONPATH, the OpenMP, BLAS and allocator settings, LD_*, TORCH_*, the
locale) must be what the server started with: where it differs, or the interpreter asked for is
another one, the server refuses and the caller starts a new interpreter.

Protocol (a Unix stream socket): the client sends one JSON line, {"interpreter", "argv",
"env", "cwd", "faulthandler", "rlimits", "umask", "ignored", "blocked", "fds"}, with its
descriptors (SCM_RIGHTS): stdin, stdout and stderr, then its other open ones, whose numbers
"fds" lists and which the script's process gets under the same numbers. Its limits ("rlimits",
`ulimit`) must be the server's; the process gets its umask and the signals it ignores and
blocks. A process of the server's (the keeper) answers {"pid": N} once the script's process
runs, or {"refused": REASON}; then {"status": S} (a wait status) when it ended. The client may
send {"signal": N} lines: the keeper signals the script's process while it has not been reaped
(no pid is signalled after it is reused). A client that hangs up kills it.
"""
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys

# The variables an interpreter, LibTorch or its libraries read once, when they start.
START_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "BLIS_", "LD_",
                  "MALLOC_", "GLIBC_TUNABLES", "TORCH_", "PYTORCH_", "LC_", "LANG")
START_ENVIRONMENT = {k: v for k, v in os.environ.items() if k.startswith(START_PREFIXES)}
BASE_PATH = [p for p in sys.path[1:]
             if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]


def read_line(conn, buffer=b""):
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the client hung up")
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    return json.loads(line), rest


def send(conn, message):
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


# The most descriptors a request carries (the kernel's limit for one message is 253).
MAX_DESCRIPTORS = 253


def limits():
    """This process's limits (`ulimit`), {RESOURCE: [SOFT, HARD]} (-1: unlimited)."""
    out = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                out[str(getattr(resource, name))] = list(resource.getrlimit(getattr(resource, name)))
            except (OSError, ValueError):
                pass
    return out


def open_descriptors():
    """The descriptors open in this process."""
    listed = [int(fd) for fd in os.listdir("/proc/self/fd")]
    out = []
    for fd in listed:  # the listing's own descriptor is closed by now
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            out.append(fd)
        except OSError:
            pass
    return out


# The descriptors the server was started with (a shell's, ctest's): not the server's to use, so
# a child gives their numbers to the caller's, and closes the others.
INHERITED = []


def descriptor_clash(request, fds, ours):
    """Why the caller's other descriptors cannot have their numbers in a child of this process
    (None where they can): a number this process uses for something else."""
    wanted = set(request.get("fds", []))
    for fd in open_descriptors():
        if fd > 2 and fd in wanted and fd not in fds and fd not in ours and fd not in INHERITED:
            return f"the caller's descriptor {fd} is one the server uses"
    return None


def move_descriptors(fds, targets):
    """Gives each descriptor in `fds` the number in `targets`, inheritable as in the caller."""
    base = max(list(fds) + list(targets)) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
    for fd in moved:
        os.close(fd)


def refusal(request):
    if request.get("rlimits", limits()) != limits():
        return "the caller's limits (ulimit) are not the server's"
    interpreter = os.path.realpath(request.get("interpreter") or "")
    if interpreter != os.path.realpath(sys.executable):
        return f"the interpreter {request.get('interpreter')!r} is not this one ({sys.executable})"
    env = request["env"]
    wanted = {k: v for k, v in env.items() if k.startswith(START_PREFIXES) and k != "PYTHONPATH"}
    started = {k: v for k, v in START_ENVIRONMENT.items() if k != "PYTHONPATH"}
    for name in sorted(set(wanted) | set(started)):
        if wanted.get(name) != started.get(name):
            return f"{name} is {wanted.get(name)!r} here, {started.get(name)!r} when the server started"
    # A script named relative to the caller's folder, not the server's.
    if not os.path.isfile(os.path.join(request["cwd"], request["argv"][0])):
        return f"no script {request['argv'][0]!r}"
    return None


def become_script(request, fds, closing):
    """In the forked child: becomes `python3 [-X faulthandler] SCRIPT ARGS...` and never returns."""
    code = 1
    try:
        for fd in closing:
            os.close(fd)
        targets = [0, 1, 2] + list(request.get("fds", []))
        move_descriptors(fds, targets)
        for fd in INHERITED:
            if fd not in targets:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in request.get("ignored", []):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked", []))
        if "umask" in request:  # a request without one keeps the server's
            os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import io
        def stream(fd, mode, line_buffering, errors):
            raw = io.FileIO(fd, mode, closefd=False)
            buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
            return io.TextIOWrapper(buffered, encoding=sys.__stdout__.encoding, errors=errors,
                                    line_buffering=line_buffering)
        sys.stdin = sys.__stdin__ = stream(0, "r", False, "strict")
        sys.stdout = sys.__stdout__ = stream(1, "w", os.isatty(1), "strict")
        sys.stderr = sys.__stderr__ = stream(2, "w", True, "backslashreplace")
        if request.get("faulthandler"):
            import faulthandler
            faulthandler.enable(all_threads=True)
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.path.dirname(os.path.realpath(script))] + extra + BASE_PATH
        sys.path_importer_cache.clear()
        import importlib
        importlib.invalidate_caches()
        import random
        import tempfile
        random.seed()
        tempfile.tempdir = None
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        import runpy
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = -signal.SIGINT
        except BaseException:
            kind, value, tb = sys.exc_info()
            # The frames of this file and runpy's are not the script's: a new interpreter
            # shows none of them.
            while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")):
                tb = tb.tb_next
            sys.excepthook(kind, value.with_traceback(tb), tb)
            code = 1
        import threading
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
        code = 1
    if code < 0:  # as an interpreter interrupted by Ctrl-C ends: killed by SIGINT
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def keep(conn, request, fds, listener):
    """The keeper: a child of the server that starts the script, relays signals to it and its
    end to the client."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reason = refusal(request) or descriptor_clash(request, fds, [conn.fileno(), listener.fileno()])
    if reason:
        send(conn, {"refused": reason})
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        become_script(request, fds, [listener.fileno(), conn.fileno()])
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    send(conn, {"pid": pid})
    buffer = b""
    while True:
        ready, _, _ = select.select([pidfd, conn], [], [])
        if pidfd in ready:
            break
        try:
            chunk = conn.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:  # the client is gone: so is what it started
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitpid(pid, 0)
            os._exit(0)
        buffer += chunk
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            try:
                sig = int(json.loads(line)["signal"])
                signal.pidfd_send_signal(pidfd, sig)
            except (ValueError, KeyError, TypeError, OSError):
                pass
    _, status = os.waitpid(pid, 0)
    send(conn, {"status": status})
    os._exit(0)


def serve(path):
    INHERITED[:] = [fd for fd in open_descriptors() if fd > 2]
    # What the scripts it runs import first: torch, its neural-network and distributed packages
    # (wrapcert's worker imports all three).
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn  # noqa: F401
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    os.rename(path + ".new", path)  # the socket appears once it listens
    listener.listen(64)
    try:
        while True:
            conn, _ = listener.accept()
            conn.settimeout(10)  # a client that sends no whole request does not stop the server
            try:
                data, fds, flags, _ = socket.recv_fds(conn, 65536, MAX_DESCRIPTORS)
                if len(fds) < 3 or flags & socket.MSG_CTRUNC:
                    for fd in fds:
                        os.close(fd)
                    raise ValueError("a request without its descriptors")
                request, _ = read_line(conn, data)
                others = request.get("fds", [])
                if len(others) + 3 != len(fds) or not all(isinstance(fd, int) and fd > 2
                                                          for fd in others):
                    for fd in fds:
                        os.close(fd)
                    raise ValueError("its descriptors are not those it names")
            except (OSError, ValueError, ConnectionError) as e:
                send(conn, {"refused": f"a bad request: {e}"})
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            conn.settimeout(None)
            if os.fork() == 0:
                keep(conn, request, fds, listener)
            for fd in fds:
                os.close(fd)
            conn.close()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def serve_tool(tool, folder):
    """Starts `TOOL serve-forks` with its socket in `folder`; returns (server process or None,
    the command that runs the tool there: [python3, -S, this file, run-program, SOCKET, TOOL]),
    or (None, [TOOL]) where it does not start. Stop the server with terminate()."""
    import subprocess
    import time
    path = os.path.join(folder, "tool.sock")
    server = subprocess.Popen([tool, "serve-forks", path], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not os.path.exists(path):
        server.kill()
        print("note: the tool's server did not start; the tool starts anew each time:",
              server.communicate()[1].decode(errors="replace"), file=sys.stderr)
        return None, [tool]
    return server, [sys.executable, "-S", os.path.abspath(__file__), "run-program", path, tool]


RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
           signal.SIGUSR2, signal.SIGALRM)


def run(path, argv, program=None):
    """A client: runs `python3 SCRIPT ARGS...` (or `PROGRAM ARGS...` on the tool's server) on
    the server, or in a new process where the server refuses or is not there; exits as that
    process does."""
    # The caller's other open descriptors go too, with their numbers (`--keys /dev/fd/63`).
    others = [fd for fd in open_descriptors() if fd > 2]
    ignored = [int(s) for s in RELAYED if signal.getsignal(s) == signal.SIG_IGN]
    mask = os.umask(0)
    os.umask(mask)
    request = {"interpreter": sys.executable, "argv": argv, "env": dict(os.environ),
               "cwd": os.getcwd(), "faulthandler": False, "rlimits": limits(), "umask": mask,
               "ignored": ignored,
               "blocked": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]}
    if program:
        request["program"] = program
    request["fds"] = others
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(others) + 3 > MAX_DESCRIPTORS:
            raise OSError("more descriptors than one message carries")
        conn.connect(path)
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [0, 1, 2] + others)
        reply, buffer = read_line(conn)
    except (OSError, ConnectionError, ValueError):
        reply, buffer = {}, b""
    if "pid" not in reply:
        conn.close()
        if program:
            os.execv(program, [program] + argv)
        os.execv(sys.executable, [sys.executable] + argv)

    def relay(sig, _frame):
        send(conn, {"signal": sig})
    for sig in RELAYED:
        if int(sig) not in ignored:
            signal.signal(sig, relay)
    while True:
        try:
            message, buffer = read_line(conn, buffer)
        except ConnectionError:
            sys.exit(1)
        if "status" in message:
            break
    status = message["status"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run-program":
        run(sys.argv[2], sys.argv[4:], program=sys.argv[3])
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(64)
