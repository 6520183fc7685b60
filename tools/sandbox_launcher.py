"""The inside half of `tools/sandbox.py`: sets up the containment, then becomes the program.

Started by `run_python` as `python -I -S sandbox_launcher.py DIR STATUS_FD` with an empty
environment; DIR holds `spec.json` (the code, the limits, what to mount). Standard library
only and no areal_graph import: it runs before anything is contained, without `site`.

Three processes, so that the program is never the namespace's init (init ignores signals
such as SIGXCPU and must reap orphans) and so that everything dies together:

    launcher (outside)   unshare(net, pid, mount, ipc, uts[, user]); fork; wait; exit
      init (pid 1)       private root: read-only system dirs, tmpfs /sandbox/work; fork; reap;
                         report the program's wait status; exit -> the kernel kills the rest
        program          drop to an unprivileged uid (or drop every capability), no_new_privs,
                         rlimits, parent-death signal; exec python on the code

When the kernel refuses namespaces (not root and no user namespaces, or a container that
forbids them) it degrades to rlimits (and, as root, a uid drop) and says so: every step
that worked or did not is written to STATUS_FD as one JSON line before the exec, and the
init writes the program's wait status and resource usage when it ends. A private root that
cannot be built once the namespaces exist is not such a case (the machine allows it; the
failure is ours): the init reports an error and never starts the program. The one exception
is a user namespace in which the kernel refuses a mount (EPERM/EACCES: an LSM or a locked
mount), which is again what the machine allows, so it degrades and says so.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys
from typing import NoReturn

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
# Per-mount flags a read-only bind must keep (a user namespace may not clear them): noexec, atime.
KEEP_FLAGS = MS_NOEXEC | 1024 | 2048 | 4096
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
# Unique per live sandbox: the launcher's pid is unique among live processes, so RLIMIT_NPROC
# counts exactly this sandbox's processes and no other sandbox shares its uid.
UID_BASE = 3_000_000_000
INSIDE_WORK = "/sandbox/work"
INSIDE_CODE = "/sandbox/main.py"
# Directories the private root makes itself. A bind may sit below /tmp or /dev (a venv in
# /tmp/clone/.venv or /dev/shm/venv): the root then makes the parents, and the rest of the
# host's /tmp stays absent. A bind may not be one of these or hold one (it would show the
# host's /tmp, or hide the root's /dev or /proc), nor sit below /proc or /sandbox (the proc
# mount and the tmpfs work dir would hide it, or it would shadow the program's own files).
OWN_DIRS = ("/tmp", "/dev", "/proc", "/sandbox")
NO_BINDS_BELOW = ("/proc", "/sandbox")
# A user namespace's mount refused with these is the kernel's policy, not a fault of ours.
KERNEL_REFUSALS = (errno.EPERM, errno.EACCES)

_libc = ctypes.CDLL(None, use_errno=True)


def _call(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _call(
        _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        f"prctl {option}",
    )


class Status:
    """JSON lines to the parent over an inherited pipe (never inherited by the program)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_inheritable(fd, False)

    def write(self, **fields) -> None:
        try:
            os.write(self.fd, (json.dumps(fields) + "\n").encode())
        except OSError:
            pass  # the parent stopped listening: nothing to report to

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


# ---------------------------------------------------------------------------------- namespaces
def enter_namespaces(mode: str) -> tuple[str | None, list[str]]:
    """Unshare what the kernel allows: 'namespaces' (as root) or 'user_namespace'; None if neither."""
    warnings: list[str] = []
    if mode in ("auto", "namespaces") and os.geteuid() == 0:
        for flags in (NAMESPACES | CLONE_NEWCGROUP, NAMESPACES):
            try:
                _call(_libc.unshare(ctypes.c_int(flags)), "unshare")
                return "namespaces", warnings
            except OSError as err:
                last = err
        warnings.append(f"namespaces refused as root ({last.strerror})")
    elif mode == "namespaces":
        warnings.append("isolation 'namespaces' needs root")
    if mode in ("auto", "user_namespace"):
        uid, gid = os.geteuid(), os.getegid()
        try:
            _call(_libc.unshare(ctypes.c_int(NAMESPACES | CLONE_NEWUSER)), "unshare")
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            return "user_namespace", warnings
        except OSError as err:
            warnings.append(f"user namespaces refused ({err.strerror})")
    return None, warnings


class PrivateRootError(Exception):
    """The spec asks for a private root that would not be private (a bind over the root's own dirs)."""


def check_binds(binds: list[str]) -> None:
    """Refuse binds that collide with what the root makes itself, before anything is mounted:
    binding /tmp whole would show every other file there, a bind below /proc would be hidden."""
    for path in binds:
        norm = os.path.normpath(path)
        if norm.startswith("//"):  # POSIX keeps a leading "//" (it may mean something else); for us it is "/"
            norm = "/" + norm.lstrip("/")
        if not os.path.isabs(norm) or norm == "/":
            raise PrivateRootError(f"bind {path!r} is not an absolute path below /")
        for own in OWN_DIRS:
            if own == norm or own.startswith(norm + "/"):
                raise PrivateRootError(f"bind {path} would cover the sandbox's own {own}")
        for own in NO_BINDS_BELOW:
            if norm.startswith(own + "/"):
                raise PrivateRootError(f"bind {path} lies below the sandbox's own {own}")


def _inside(new_root: str, path: str) -> None:
    """Never create or mount outside the new root: a symlink made for an earlier bind (say /lib ->
    /usr/lib, absolute) resolves against the host while the root is built."""
    real, top = os.path.realpath(path), os.path.realpath(new_root)
    if real != top and not real.startswith(top + "/"):
        raise PrivateRootError(f"{path[len(new_root) :]} resolves to {real}, outside the private root")


def _bind_read_only(source: str, target: str, new_root: str) -> None:
    _inside(new_root, os.path.dirname(target))
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "wb").close()
    mount(source, target, None, MS_BIND)
    keep = os.statvfs(source).f_flag & KEEP_FLAGS
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def build_root(spec: dict, work_uid: int) -> None:
    """A fresh root: the system and Python dirs read-only, /dev with a few nodes, /proc of this
    pid namespace, a size-limited tmpfs /sandbox/work (the only writable place), then pivot into it.

    The binds come first and may already have made /tmp or /dev (an interpreter under /tmp):
    the root's own dirs are made only where missing, and they hold nothing but those binds."""
    new_root = root_path(spec)
    check_binds(spec["binds"])
    os.makedirs(new_root, exist_ok=True)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for path in spec["binds"]:
        if os.path.lexists(path):
            _bind_read_only(path, new_root + os.path.normpath(path), new_root)
    os.makedirs(new_root + "/dev", exist_ok=True)
    for node in ("null", "zero", "full", "random", "urandom"):
        _bind_read_only_device(f"/dev/{node}", f"{new_root}/dev/{node}")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{new_root}/dev/{name}")
    os.makedirs(new_root + "/proc")
    mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(new_root + INSIDE_WORK)
    mount(
        "tmpfs",
        new_root + INSIDE_WORK,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={spec['limits']['work_dir_mb']}m,mode=0700,uid={work_uid},gid={work_uid}",
    )
    # /tmp exists (code expects it) but is read-only: TMPDIR is /sandbox/work. Below /tmp there
    # is at most the bound interpreter's subtree (with empty parents), never the host's files.
    os.makedirs(new_root + "/tmp", exist_ok=True)
    os.makedirs(os.path.dirname(new_root + INSIDE_CODE), exist_ok=True)
    with open(new_root + INSIDE_CODE, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(spec["code"])
    os.chmod(new_root + INSIDE_CODE, 0o444)
    os.chdir(new_root)
    _call(_libc.syscall(ctypes.c_long(_PIVOT_ROOT_NR), b".", b"."), "pivot_root")
    _call(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def root_path(spec: dict) -> str:
    """Where the root is built (then pivoted into); also stripped from error messages so the
    engine sees a path inside the sandbox, the same for every run."""
    return os.path.join(spec["dir"], "root")


def _bind_read_only_device(source: str, target: str) -> None:
    open(target, "wb").close()
    mount(source, target, None, MS_BIND)  # device nodes stay usable: the bind keeps /dev's flags


_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}.get(os.uname().machine, -1)


# ---------------------------------------------------------------------------------- privileges
def drop_to_uid(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to another uid: every capability goes


def drop_all_capabilities() -> None:
    """In a user namespace the program stays uid 0 there: empty the bounding, ambient and
    inheritable sets so the exec grants it no capability (it cannot remount /usr rw)."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    _call(_libc.capset(ctypes.byref(Header(0x20080522, 0)), ctypes.byref((Data * 2)())), "capset")


def set_limits(limits: dict, process_limit: bool) -> None:
    mem = limits["memory_mb"] << 20
    fsize = limits["max_file_mb"] << 20
    pairs = [
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 256),
    ]
    if process_limit:
        pairs.append((resource.RLIMIT_NPROC, limits["max_processes"]))
    for which, value in pairs:
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))


def world_executable(path: str) -> bool:
    """Whether another uid can reach and run `path` (every directory on the way o+x)."""
    path = os.path.realpath(path)
    parts = path.split("/")
    return all(os.stat("/".join(parts[:i]) or "/").st_mode & 0o001 for i in range(1, len(parts) + 1))


# ---------------------------------------------------------------------------------- stages
def exec_program(spec: dict, features: dict, warnings: list[str], status: Status, code_path: str) -> None:
    """Last steps before the program: rlimits, no_new_privs, parent-death signal, report, exec."""
    set_limits(spec["limits"], features["process_limit"])
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    status.write(containment=features, warnings=warnings)
    if spec["require_full"] and not all(v for k, v in features.items() if k != "mode"):
        status.write(error="full containment required but not available: " + "; ".join(warnings))
        os._exit(126)
    status.close()
    python = spec["python"]
    os.execve(python, [python, "-I", "-B", code_path], spec["env"])


def run_program(spec: dict, features: dict, warnings: list[str], status: Status) -> None:
    """The program's process inside the namespaces: drop privileges, then exec."""
    try:
        os.closerange(3, status.fd)
        os.closerange(status.fd + 1, 65536)
        os.chdir(INSIDE_WORK if features["filesystem"] else os.path.join(spec["dir"], "work"))
        if features["user"]:
            drop_to_uid(spec["uid"])
        elif features["mode"] == "user_namespace":
            drop_all_capabilities()
        exec_program(
            spec,
            features,
            warnings,
            status,
            INSIDE_CODE if features["filesystem"] else os.path.join(spec["dir"], "main.py"),
        )
    except BaseException as err:  # noqa: BLE001 - report and never fall through into the init's code
        status.write(error=f"sandbox setup failed: {type(err).__name__}: {err}")
    os._exit(126)


def run_init(spec: dict, mode: str, warnings: list[str], status: Status) -> None:
    """pid 1 of the new pid namespace: build the root, start the program, reap, report, exit."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    root = os.geteuid() == 0 and mode == "namespaces"
    features = {"mode": mode, "network": True, "pid": True, "filesystem": False, "user": False, "process_limit": False}
    try:
        build_root(spec, spec["uid"] if root else 0)
        features["filesystem"] = True
    except (OSError, PrivateRootError) as err:
        # Named by the paths inside the root, so the engine sees one message per cause, not per run.
        reason = str(err).replace(root_path(spec), "")
        refused = mode == "user_namespace" and isinstance(err, OSError) and err.errno in KERNEL_REFUSALS
        if not refused:
            status.write(
                containment=features, warnings=warnings, error=f"private root failed ({reason}); the code was not run"
            )
            os._exit(126)
        warnings.append(f"private filesystem refused by the kernel ({reason}); the host filesystem is visible")
        _prepare_host_dir(spec, False)
    if root:  # the private root exists: the program's uid needs no access to anything of the host's
        features["user"] = features["process_limit"] = True
    elif mode == "user_namespace":
        warnings.append(
            "user namespace: the program is uid 0 there without capabilities; "
            "RLIMIT_NPROC counts the caller's processes, so it is not set"
        )
    try:
        os.sethostname("sandbox")  # type: ignore[attr-defined]  # Linux only, absent from the stubs
    except (OSError, AttributeError):
        pass
    child = os.fork()
    if child == 0:
        run_program(spec, features, warnings, status)
    while True:
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid == child:
            status.write(wait_status=wait_status, cpu_s=usage.ru_utime + usage.ru_stime, max_rss_kb=usage.ru_maxrss)
            os._exit(0)


def _prepare_host_dir(spec: dict, drop_uid: bool) -> None:
    """Without a private root the program runs in DIR/work; let its uid in (DIR is 0700)."""
    work = os.path.join(spec["dir"], "work")
    os.makedirs(work, exist_ok=True)
    spec["env"] = {**spec["env"], "HOME": work, "TMPDIR": work}
    with open(os.path.join(spec["dir"], "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(spec["code"])
    if drop_uid:
        os.chmod(spec["dir"], 0o711)
        os.chmod(os.path.join(spec["dir"], "main.py"), 0o444)
        os.chown(work, spec["uid"], spec["uid"])


def run_without_namespaces(spec: dict, warnings: list[str], status: Status) -> NoReturn:
    """Degraded: rlimits, and as root a uid drop when the interpreter is reachable by others."""
    root = os.geteuid() == 0 and world_executable(spec["python"])
    _prepare_host_dir(spec, root)
    features = {
        "mode": "rlimits",
        "network": False,
        "pid": False,
        "filesystem": False,
        "user": root,
        "process_limit": root or os.geteuid() != 0,
    }
    warnings.append(
        "no namespaces: the network, the host filesystem (world-writable dirs included) "
        "and other processes are reachable; only rlimits" + (" and a uid drop" if root else "") + " apply"
    )
    try:
        os.chdir(os.path.join(spec["dir"], "work"))
        if root:
            drop_to_uid(spec["uid"])
        exec_program(spec, features, warnings, status, os.path.join(spec["dir"], "main.py"))
    except BaseException as err:  # noqa: BLE001
        status.write(error=f"sandbox setup failed: {type(err).__name__}: {err}")
    os._exit(126)


def main(argv: list[str]) -> None:
    directory, status = argv[1], Status(int(argv[2]))
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.umask(0o022)  # the dirs made for the private root must be traversable by the program's uid
    with open(os.path.join(directory, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    if os.getppid() != spec["parent_pid"]:
        os._exit(1)  # the caller died before the parent-death signal was armed
    spec["dir"] = directory
    spec["uid"] = UID_BASE + os.getpid()
    mode, warnings = (None, []) if spec["mode"] == "rlimits" else enter_namespaces(spec["mode"])
    if mode is None:
        run_without_namespaces(spec, warnings, status)
    child = os.fork()  # the first child of a new pid namespace is its init
    if child == 0:
        try:
            run_init(spec, mode, warnings, status)
        except BaseException as err:  # noqa: BLE001 - report; the namespace dies with its init
            status.write(error=f"sandbox init failed: {type(err).__name__}: {err}")
        os._exit(126)
    status.close()
    _, wait_status = os.waitpid(child, 0)
    os._exit(0 if os.waitstatus_to_exitcode(wait_status) == 0 else 125)


if __name__ == "__main__":
    main(sys.argv)
