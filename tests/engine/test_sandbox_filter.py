"""The scorer child's seccomp allow-list (tasks/sandbox_filter.py) and its lock-down
(tasks/sandbox_worker.py), checked directly.

The program is run by a small BPF interpreter on every system call number below 512, on
both architectures: exactly the allowed calls pass, and the argument rules hold at their
edges. The tables are compared with the kernel's headers where they are installed. Then
a child forked from this process locks itself down as a worker's child does and tries
what it must not (the kernel's answers), and what a scorer must still do.
"""

import ctypes
import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time

import pytest

from tasks import sandbox, sandbox_filter, sandbox_view, sandbox_worker

ALLOW, DENY = sandbox_filter.RET_ALLOW, sandbox_filter.RET_EPERM

# Calls that must be refused, by number (from the kernel's asm/unistd_64.h and
# asm-generic/unistd.h): what reaches other processes, the network, the keyring, new
# processes and programs, namespaces, kernel objects that outlive the child, files.
REFUSED = {
    "x86_64": {"socket": 41, "socketpair": 53, "connect": 42, "kill": 62, "tkill": 200, "tgkill": 234,
               "setpriority": 141, "sched_setaffinity": 203, "add_key": 248, "request_key": 249, "keyctl": 250,
               "clone": 56, "clone3": 435, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165,
               "prctl": 157, "seccomp": 317, "io_uring_setup": 425, "bpf": 321, "memfd_create": 319,
               "mq_open": 240, "flock": 73, "unlinkat": 263, "mkdirat": 258, "renameat2": 316, "openat2": 437,
               "shmget": 29, "msgget": 68, "semget": 64, "pidfd_open": 434, "pidfd_send_signal": 424,
               "ioprio_set": 251, "setrlimit": 160, "perf_event_open": 298, "userfaultfd": 323},
    "aarch64": {"socket": 198, "socketpair": 199, "connect": 203, "kill": 129, "tkill": 130, "tgkill": 131,
                "setpriority": 140, "sched_setaffinity": 122, "add_key": 217, "request_key": 218, "keyctl": 219,
                "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "ptrace": 117,
                "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268, "mount": 40,
                "prctl": 167, "seccomp": 277, "io_uring_setup": 425, "bpf": 280, "memfd_create": 279,
                "mq_open": 180, "flock": 32, "unlinkat": 35, "mkdirat": 34, "renameat2": 276, "openat2": 437,
                "shmget": 194, "msgget": 186, "semget": 190, "pidfd_open": 434, "pidfd_send_signal": 424,
                "ioprio_set": 30, "setrlimit": 164, "perf_event_open": 241, "userfaultfd": 282},
}


def run_bpf(prog: list, arch: int, nr: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """What a seccomp program answers for one system call (the BPF instructions it uses)."""
    data = {0: nr, 4: arch}                                 # struct seccomp_data, as 32-bit words
    for i, value in enumerate(args):
        data[16 + 8 * i], data[20 + 8 * i] = value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF
    a, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:                                    # A = data[k]
            a, pc = data[k], pc + 1
        elif code == 0x54:                                  # A &= k
            a, pc = a & k, pc + 1
        elif code in (0x15, 0x35):                          # jeq / jge k
            pc += 1 + (jt if (a == k if code == 0x15 else a >= k) else jf)
        elif code == 0x06:
            return k
        else:
            raise ValueError(f"instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_exactly_the_allowed_calls_pass(machine):
    """Every number below 512: ALLOW iff ALLOWED names it, EPERM otherwise; the calls with
    argument rules pass with harmless arguments only (the next test)."""
    prog = sandbox_filter.program(machine)
    arch, numbers = sandbox_filter.SYSCALLS[machine]
    allowed = {numbers[name] for name in sandbox_filter.allowed_names(machine)}
    ruled = {numbers[name] for name in sandbox_filter.ARGUMENT_RULES if name in numbers}
    for nr in range(512):
        if nr not in ruled:
            assert run_bpf(prog, arch, nr) == (ALLOW if nr in allowed else DENY), nr
    for name, nr in REFUSED[machine].items():
        assert nr not in allowed | ruled, name
        assert run_bpf(prog, arch, nr) == DENY, name
    assert run_bpf(prog, arch, 0x40000000 | numbers["read"]) == DENY        # x86_64's x32 numbers
    assert run_bpf(prog, 0x40000003, 3) == DENY                            # i386's read, through int 0x80
    assert len(prog) <= 255 and all(0 <= jt <= 255 and 0 <= jf <= 255 for _, jt, jf, _ in prog)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_argument_rules_let_only_harmless_arguments_through(machine):
    prog = sandbox_filter.program(machine)
    arch, numbers = sandbox_filter.SYSCALLS[machine]
    at_fdcwd, o_cloexec, o_directory = -100 & (2 ** 64 - 1), 0o2000000, 0o200000
    openat = lambda flags: run_bpf(prog, arch, numbers["openat"], (at_fdcwd, 0x1000, flags, 0, 0, 0))
    assert openat(os.O_RDONLY) == openat(o_cloexec | o_directory) == ALLOW
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND, 0o20000000 | o_directory,
                  os.O_WRONLY | 1 << 32):                            # the kernel reads an int: low bits decide
        assert openat(flags) == DENY, oct(flags)
    assert openat(1 << 32) == ALLOW                                   # high bits alone: O_RDONLY to the kernel
    fcntl = lambda cmd: run_bpf(prog, arch, numbers["fcntl"], (3, cmd, 0, 0, 0, 0))
    assert [fcntl(c) for c in (0, 1, 2, 3, 4, 1030)] == [ALLOW] * 6
    assert [fcntl(c) for c in (5, 6, 7, 8, 36, 37, 38, 1024, 1026, 1033)] == [DENY] * 10   # locks, owner, lease, ...
    ioctl = lambda request: run_bpf(prog, arch, numbers["ioctl"], (0, request, 0, 0, 0, 0))
    assert [ioctl(r) for r in (0x5401, 0x5450, 0x5451)] == [ALLOW] * 3
    assert [ioctl(r) for r in (0x5412, 0x5402, 0x541B, 0x40086602)] == [DENY] * 4         # TIOCSTI, TCSETS, ...
    prlimit = lambda pid, new: run_bpf(prog, arch, numbers["prlimit64"], (pid, 9, new, 0x7FFF0000, 0, 0))
    assert prlimit(0, 0) == ALLOW                                     # getrlimit: its own, nothing new
    assert prlimit(4242, 0) == prlimit(0, 0x7FFF1000) == prlimit(1, 0) == DENY
    assert prlimit(0, 1 << 40) == DENY                                # a pointer whose low half is 0
    if "open" in numbers:
        assert run_bpf(prog, arch, numbers["open"], (0x1000, os.O_RDONLY, 0, 0, 0, 0)) == ALLOW
        assert run_bpf(prog, arch, numbers["open"], (0x1000, os.O_WRONLY | os.O_CREAT, 0, 0, 0, 0)) == DENY


HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_tables_agree_with_the_kernels_headers(machine):
    """Each number in SYSCALLS and REFUSED is the kernel's (linux-libc-dev's headers, where installed)."""
    if not os.path.exists(HEADERS[machine]):
        pytest.skip(f"{HEADERS[machine]} is not installed")
    text = open(HEADERS[machine]).read()
    kernel = {name: int(n) for name, n in re.findall(r"#define __NR_(\w+)\s+(\d+)", text)}
    generic = {name: int(n) for name, n in re.findall(r"#define __NR3264_(\w+)\s+(\d+)", text)}
    for name, alias in re.findall(r"#define __NR_(\w+)\s+__NR3264_(\w+)", text):   # 64-bit names of 32/64 calls
        if alias in generic:
            kernel.setdefault(name, generic[alias])
    ours = {**sandbox_filter.SYSCALLS[machine][1], **REFUSED[machine]}
    assert {name: nr for name, nr in ours.items() if kernel.get(name) != nr} == {}


def test_every_call_the_allow_list_names_is_in_both_tables_or_a_legacy_one():
    names = {n for _, group in sandbox_filter.ALLOWED.values() for n in group} | set(sandbox_filter.ARGUMENT_RULES)
    legacy = {"open", "stat", "lstat", "access", "readlink", "getdents", "dup2", "poll", "select", "time", "alarm",
              "pause", "getpgrp"}                                     # x86_64 only (asm-generic has none)
    assert names - set(sandbox_filter.SYSCALLS["x86_64"][1]) == set()
    assert names - set(sandbox_filter.SYSCALLS["aarch64"][1]) == legacy


MQUEUE = f"/tokencredit-test-{os.getpid()}"               # a POSIX message queue name no one else uses


def world_readable_file() -> str:
    """A file any user may read, in a directory of /tmp made for it (0755), holding this file's text.

    Not a file of the repository, nor one under tmp_path: as root the child reads as
    `nobody`, and a clone under a directory only its owner may enter (`mktemp -d`, /root)
    or pytest's own tmp_path (/tmp/pytest-of-root is 0700) is closed to it.
    """
    folder = tempfile.mkdtemp(prefix="tokencredit-readable-", dir="/tmp")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "scorer_source.py")
    with open(path, "w") as f:
        f.write(open(__file__).read())
    os.chmod(path, 0o644)
    return path


def test_a_locked_down_child_can_read_and_compute_and_nothing_else():
    """_lock_down as a worker's child does it (uid switch first when root), in a child forked from
    this process; then each attempt's outcome: the exception's type, or "allowed"."""
    if not sandbox_filter.supported():
        pytest.skip(f"no system call table for {platform.machine()}")
    open_dir = tempfile.mkdtemp(prefix="tokencredit-hostile-", dir="/tmp")
    os.chmod(open_dir, 0o777)
    readable = world_readable_file()
    abi = sandbox_worker.landlock_abi()
    seccomp = sandbox_worker.kernel_filter(sandbox_filter.program(platform.machine()))
    numbers = {**sandbox_filter.SYSCALLS[platform.machine()][1], **REFUSED[platform.machine()]}
    server = socket.create_server(("127.0.0.1", 0))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            sandbox_worker._drop_root()
            sandbox_worker._lock_down(write_end, cpu_seconds=30, memory_bytes=sandbox_worker._address_space()
                                      + (256 << 20), landlock=abi, seccomp=seccomp)
            libc = ctypes.CDLL(None, use_errno=True)

            def call(result):                  # a libc call's -1 as an OSError, as os.* would raise
                if result == -1:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                return result

            def raw(name, *args):
                return call(libc.syscall(ctypes.c_long(numbers[name]), *[ctypes.c_long(a) for a in args]))
            attempts = {
                # what a scorer does: compute, allocate a little, read files, sleep, read its limits
                "compute": lambda: sum(i * i for i in range(10 ** 5)),
                "allocate": lambda: len(bytearray(64 << 20)),
                "read_file": lambda: len(open(readable).read()),
                "list_dir": lambda: len(os.listdir("/")),
                "sleep": lambda: time.sleep(0.01),
                "own_limits": lambda: __import__("resource").getrlimit(__import__("resource").RLIMIT_AS),
                "own_priority": lambda: os.getpriority(os.PRIO_PROCESS, 0),
                "own_cpus": lambda: len(os.sched_getaffinity(0)),
                # what it must not
                "fork": lambda: os.fork() == 0 and os._exit(0),
                "execute": lambda: os.execv("/bin/true", ["true"]),
                "memory": lambda: bytearray(512 << 20),
                "write": lambda: open(os.path.join(open_dir, "x"), "w"),
                "signal_parent": lambda: os.kill(os.getppid(), 0),
                "signal_itself": lambda: os.kill(os.getpid(), 0),
                "tcp": lambda: socket.create_connection(server.getsockname(), 1),
                "mptcp": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262),
                "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
                "unix": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
                "prlimit_parent": lambda: __import__("resource").prlimit(os.getppid(), 7, (64, 64)),
                "lower_own_limit": lambda: __import__("resource").setrlimit(7, (32, 64)),
                "renice_parent": lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19),
                "pin_itself": lambda: os.sched_setaffinity(0, {0}),
                "add_key": lambda: raw("add_key", ctypes.addressof(ctypes.create_string_buffer(b"user")), 0, 0, 0, -4),
                "keyctl": lambda: raw("keyctl", 0, -4),
                "unshare": lambda: raw("unshare", 0x18000000),
                "sysv_shm": lambda: call(libc.shmget(0, 1 << 20, 0o1600)),
                "sysv_msg": lambda: call(libc.msgget(0, 0o1600)),
                "sysv_sem": lambda: call(libc.semget(0, 1, 0o1600)),
                "posix_mqueue": lambda: call(libc.mq_open(MQUEUE.encode(), os.O_CREAT | os.O_RDONLY, 0o600, None)),
                "memfd": lambda: os.memfd_create("x"),
                "clear_pdeathsig": lambda: call(libc.prctl(1, 0, 0, 0, 0)),
                "pdeathsig_high_bits": lambda: raw("prctl", 1 | 1 << 32, 0, 0, 0, 0),
                "set_name": lambda: call(libc.prctl(15, b"tc-child", 0, 0, 0)),
            }
            results = {}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    results[name] = "allowed"
                except Exception as e:
                    results[name] = type(e).__name__
            os.write(write_end, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        results = json.loads(f.read())
    os.waitpid(pid, 0)
    leftover_queue = ctypes.CDLL(None, use_errno=True).mq_unlink(MQUEUE.encode()) == 0   # removes it if there
    server.close()
    files = os.listdir(open_dir)
    shutil.rmtree(open_dir)
    shutil.rmtree(os.path.dirname(readable))
    scorer_needs = ("compute", "allocate", "read_file", "list_dir", "sleep", "own_limits", "own_priority", "own_cpus")
    assert {k: results[k] for k in scorer_needs} == dict.fromkeys(scorer_needs, "allowed")
    assert results["memory"] == "MemoryError"              # RLIMIT_AS
    assert results["lower_own_limit"] == "ValueError"       # Python's word for setrlimit's EPERM
    refused = set(results) - set(scorer_needs) - {"memory", "lower_own_limit"}
    assert {k: results[k] for k in refused} == dict.fromkeys(refused, "PermissionError")
    assert files == [] and not leftover_queue


def test_a_child_that_cannot_lock_down_is_told_apart_from_one_that_failed_to_score():
    """A child whose lock-down fails (here: a seccomp program the kernel refuses, empty) never
    writes its "L": its worker then knows it is broken. A child that locks down and then dies
    (the answer's doing) is not a broken worker."""
    empty = sandbox_worker.kernel_filter([])
    assert sandbox_worker._score_in_child(lambda: True, [], 10.0, 0, set(), empty) == (None, False, "crash")
    seccomp = sandbox_worker.kernel_filter(sandbox_filter.program(platform.machine()))
    assert sandbox_worker._score_in_child(lambda: os._exit(3), [], 10.0, 0, set(), seccomp) == (None, True, "crash")
    assert sandbox_worker._score_in_child(lambda: 7, [], 10.0, 0, set(), seccomp) == ({"value": 7, "missing": []},
                                                                                       True, "")


def test_a_sandbox_without_its_filter_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_warned", set())
    sandbox._warn_if_weak({"uid": os.getuid(), "landlock": 7, "seccomp": True})
    assert capsys.readouterr().err == ""
    sandbox._warn_if_weak({"uid": os.getuid(), "landlock": 7, "seccomp": False})
    assert "no seccomp filter" in capsys.readouterr().err


def test_the_worker_files_import_nothing_of_the_project():
    """sandbox_worker.py runs in the worker loaded by its path, without the tasks package on
    sys.path, and loads sandbox_reply.py by its path: they may import the standard library
    only (and, lazily, the scorer's library)."""
    for path in sandbox_view.WORKER_FILES:
        source = open(path).read()
        imported = set(re.findall(r"^\s*(?:from|import) (\w+)", source, re.M))
        assert imported - set(sys.stdlib_module_names) - {"__future__"} <= {"math_verify", "reasoning_gym"}, path

