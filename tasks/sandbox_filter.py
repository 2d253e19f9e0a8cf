"""The scorer child's system calls: an allow-list, compiled to a seccomp program.

Everything a process does outside its own memory goes through a system call: opening
a file, sending a packet, signalling or re-limiting another process, storing a key in
the kernel's keyring. seccomp (kernel docs: userspace-api/seccomp_filter) lets a
process attach a small classic-BPF program that the kernel runs at each of its calls,
reading the call's architecture, number and arguments (struct seccomp_data) and
answering ALLOW or an error. It needs PR_SET_NO_NEW_PRIVS, not root, and stays for
good, for the process and anything it could start.

A deny-list names what to refuse and lets the rest through, so whatever nobody
thought of passes: socket(AF_INET, SOCK_STREAM, 262) (TCP by another protocol
number, MPTCP, which Landlock's TCP rule does not see), prlimit on another process of
the same user, add_key into the user's keyring. So the child's filter is an
ALLOW-list: ALLOWED below names the calls a Python scorer makes, group by group, each
group with the reason it is harmless (it acts on the child's own memory, its own
descriptors, its own signals, or only reads); ARGUMENT_RULES lets a few more calls
through only with arguments that keep them so; every other call fails with EPERM. A
refused call is an OSError inside the scorer, which then reports a wrong answer (0),
never a crash of the worker.

How the list was found. Every reasoning-gym dataset's scorer (105 of them, the eight
that evaluate the answer among them) and math-verify's comparison were run in
locked-down children as the worker forks them, on the dataset's right answers and six
kinds of wrong ones, under `strace -f`; the calls each child made after installing its
filter were collected. With the scorer's library imported and warmed up in the worker,
a child made only eleven: read, write, close, openat (read-only), lseek, newfstatat,
getdents64, ioctl(TCGETS), mmap, munmap, exit_group. The rest of ALLOWED is what the
same work takes on paths those runs did not walk: glibc versions older than 2.33 (stat,
lstat, fstat rather than newfstatat), a heap that grows (brk, mremap, madvise), a
scorer that sleeps, reads the clock or its own limits, an exception whose traceback
reads source files. docs/faults_and_safety.md has the command.

What it refuses that matters (tests/engine/test_sandbox_filter.py runs the program on
every call number; test_sandbox_breaches.py sends each breach through a scorer): every
socket (no scorer opens one: no TCP, UDP, MPTCP, UNIX or netlink), every call that
reaches another process (kill, tgkill, prlimit with a pid, setpriority,
sched_setaffinity, ptrace, process_vm_*, pidfd_*), the keyring (add_key, request_key,
keyctl), starting anything (clone, fork, execve), kernel objects that outlive the child
(SysV IPC, POSIX message queues, memfd), namespaces (unshare, setns), file writes and
creation of any kind (openat for writing, unlink, rename, mkdir, ...), prctl (so the
parent-death signal stays set), and io_uring, bpf, perf_event_open, userfaultfd.

System call numbers differ between architectures and cannot be looked up at run time,
so this file carries the two tables the filter was checked on (from the kernel's
asm/unistd_64.h and asm-generic/unistd.h; tests/engine/test_sandbox_filter.py compares them
with those headers where they are installed). Elsewhere there is no filter, and the
sandbox says so. The trainer compiles the program (program()) and sends it to each
worker as numbers; the worker's children install it (tasks/sandbox_worker.py).
"""

from __future__ import annotations

import platform
import struct
import sys

# Each group: (why it is harmless, its system calls). Names absent from an architecture's
# table (the legacy calls x86_64 keeps and aarch64 never had) are skipped there.
ALLOWED = {
    "memory": ("the child's own address space, executable pages included (ctypes and a lazily imported "
               "C extension need them; what runs there runs under this same filter); RLIMIT_AS bounds how much",
               ["brk", "mmap", "munmap", "mremap", "mprotect", "madvise"]),
    "reading files, its own descriptors": ("reads only: nothing here writes, creates or removes a file (openat "
                                           "and open are let through for reading only: ARGUMENT_RULES); the "
                                           "scorer's library imports lazily, and a traceback reads source files",
                      ["read", "pread64", "readv", "preadv", "lseek", "close", "close_range", "fstat", "newfstatat",
                       "statx", "stat", "lstat", "access", "faccessat", "faccessat2", "readlink", "readlinkat",
                       "getdents64", "getdents", "getcwd", "fstatfs", "statfs", "dup", "dup2", "dup3"]),
    "writing to its own descriptors": ("the reply pipe, and /dev/null on 0-2: the only descriptors a child "
                                       "holds, and it can open none for writing",
                                       ["write", "writev"]),
    "waiting on its own descriptors": ("select and poll on descriptors it holds",
                                       ["poll", "ppoll", "select", "pselect6"]),
    "time": ("reading clocks and sleeping; a sleep ends at the child's timeout like any hang",
             ["clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep", "clock_nanosleep", "times",
              "getrusage", "sched_yield"]),
    "its own signals": ("handlers, masks and timers of the child itself (alarm, setitimer); sending a "
                        "signal is not here: kill, tkill and tgkill are refused, even to itself",
                        ["rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
                         "rt_sigtimedwait", "sigaltstack", "alarm", "setitimer", "getitimer", "restart_syscall",
                         "pause"]),
    "reading who and where it is": ("reads of ids, limits, priority and the machine; the calls that CHANGE "
                                    "them (setrlimit, setpriority, sched_setaffinity) are refused",
                                    ["getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid",
                                     "getresuid", "getresgid", "getgroups", "getpgid", "getpgrp", "getsid",
                                     "uname", "sysinfo", "getpriority", "sched_getaffinity", "getrlimit",
                                     "getrandom"]),
    "locks and leaving": ("futex waits on the child's own memory (it has no shared mapping); exit ends it",
                          ["futex", "exit", "exit_group"]),
}

# Calls let through only when their arguments keep them within the child. A rule is a
# list of conditions, all of which must hold; each reads one argument of struct
# seccomp_data: ("clear", i, mask): the low 32 bits of argument i have none of the
# mask's bits; ("one_of", i, values): the low 32 bits are one of values; ("null", i):
# all 64 bits are 0 (a pointer). The kernel reads an int argument's low 32 bits only,
# and so do these rules: a value with high bits set cannot slip past them.
WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000   # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND __O_TMPFILE
F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030
TCGETS, FIONCLEX, FIOCLEX = 0x5401, 0x5450, 0x5451
ARGUMENT_RULES = {
    # open for reading only: without Landlock (kernels before 5.13) this is what keeps
    # files unwritten; with it, a second wall.
    "openat": [("clear", 2, WRITE_FLAGS)],
    "open": [("clear", 1, WRITE_FLAGS)],
    # descriptor flags and duplicates; not the lock, lease, owner and notify commands
    # (a lock on a file the trainer also locks would stall it).
    "fcntl": [("one_of", 1, (F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC))],
    # isatty (io.open asks whether a file is a terminal) and close-on-exec; no other
    # request (TIOCSTI would type into a terminal).
    "ioctl": [("one_of", 1, (TCGETS, FIONCLEX, FIOCLEX))],
    # getrlimit as glibc makes it: its own limits (pid 0), nothing new (new_limit NULL).
    # The breach it closes: a child lowering its worker's RLIMIT_AS zeroed every later score.
    "prlimit64": [("one_of", 0, (0,)), ("null", 2)],
}

# platform.machine() -> (AUDIT_ARCH_* of the 64-bit ABI, {name: number}), for every name above.
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
        "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
        "rt_sigreturn": 15, "ioctl": 16, "pread64": 17, "readv": 19, "writev": 20, "access": 21, "select": 23,
        "sched_yield": 24, "mremap": 25, "madvise": 28, "dup": 32, "dup2": 33, "pause": 34, "nanosleep": 35,
        "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39, "exit": 60, "uname": 63, "fcntl": 72,
        "getdents": 78, "getcwd": 79, "readlink": 89, "gettimeofday": 96, "getrlimit": 97, "getrusage": 98,
        "sysinfo": 99, "times": 100, "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108,
        "getppid": 110, "getpgrp": 111, "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgid": 121,
        "getsid": 124, "rt_sigpending": 127, "rt_sigtimedwait": 128, "rt_sigsuspend": 130, "sigaltstack": 131,
        "statfs": 137, "fstatfs": 138, "getpriority": 140, "gettid": 186, "time": 201, "futex": 202,
        "sched_getaffinity": 204, "getdents64": 217, "restart_syscall": 219, "clock_gettime": 228,
        "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "openat": 257, "newfstatat": 262,
        "readlinkat": 267, "faccessat": 269, "pselect6": 270, "ppoll": 271, "dup3": 292, "preadv": 295,
        "prlimit64": 302, "getrandom": 318, "statx": 332, "close_range": 436, "faccessat2": 439}),
    "aarch64": (0xC00000B7, {
        "getcwd": 17, "dup": 23, "dup3": 24, "fcntl": 25, "ioctl": 29, "statfs": 43, "fstatfs": 44,
        "faccessat": 48, "openat": 56, "close": 57, "getdents64": 61, "lseek": 62, "read": 63, "write": 64,
        "readv": 65, "writev": 66, "pread64": 67, "preadv": 69, "pselect6": 72, "ppoll": 73, "readlinkat": 78,
        "newfstatat": 79, "fstat": 80, "exit": 93, "exit_group": 94, "futex": 98, "nanosleep": 101,
        "getitimer": 102, "setitimer": 103, "clock_gettime": 113, "clock_getres": 114, "clock_nanosleep": 115,
        "sched_getaffinity": 123, "sched_yield": 124, "restart_syscall": 128, "sigaltstack": 132,
        "rt_sigsuspend": 133, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigpending": 136,
        "rt_sigtimedwait": 137, "rt_sigreturn": 139, "getpriority": 141, "getresuid": 148, "getresgid": 150,
        "times": 153, "getpgid": 155, "getsid": 156, "getgroups": 158, "uname": 160, "getrlimit": 163,
        "getrusage": 165, "gettimeofday": 169, "getpid": 172, "getppid": 173, "getuid": 174, "geteuid": 175,
        "getgid": 176, "getegid": 177, "gettid": 178, "sysinfo": 179, "brk": 214, "munmap": 215, "mremap": 216,
        "mmap": 222, "mprotect": 226, "madvise": 233, "prlimit64": 261, "getrandom": 278, "statx": 291,
        "close_range": 436, "faccessat2": 439}),
}

# classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h)
LD_ABS, JEQ, JGE, AND, RET = 0x20, 0x15, 0x35, 0x54, 0x06   # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, ALU|AND|K, RET|K
NR, ARCH, ARGS = 0, 4, 16               # offsets in struct seccomp_data; argument i's low half at ARGS + 8 i
X32_SYSCALL_BIT = 0x40000000            # x86_64's x32 ABI: the same arch value, numbers with this bit
RET_ALLOW, RET_EPERM = 0x7FFF0000, 0x00050000 | 1            # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM


def supported(machine: str | None = None) -> bool:
    """Is there a table here? (Linux, 64-bit Python, x86_64 or aarch64.)"""
    machine = machine or platform.machine()
    return sys.platform.startswith("linux") and machine in SYSCALLS and struct.calcsize("P") == 8


def allowed_names(machine: str) -> list[str]:
    """The calls ALLOWED lets through unconditionally on this architecture, in ALLOWED's order."""
    numbers = SYSCALLS[machine][1]
    return [name for _, names in ALLOWED.values() for name in names if name in numbers]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions; jt/jf: instructions to skip when the
    test holds/fails.

        A = arch;  not this ABI (a 32-bit call through int 0x80, say) -> DENY
        A = nr;    an x32 call -> DENY
        nr is an ALLOWED call -> ALLOW          (one jeq each)
        nr has an ARGUMENT_RULE -> its block    (each block: ALLOW if every condition holds)
        anything else -> DENY (EPERM)

    About 120 instructions, so every jump fits the 8-bit offset BPF allows (checked).
    """
    arch, numbers = SYSCALLS[machine]
    rules = {name: conditions for name, conditions in ARGUMENT_RULES.items() if name in numbers}
    head = [(LD_ABS, 0, 0, ARCH), (JEQ, 0, "DENY", arch),
            (LD_ABS, 0, 0, NR), (JGE, "DENY", 0, X32_SYSCALL_BIT)]
    head += [(JEQ, "ALLOW", 0, numbers[name]) for name in allowed_names(machine)]
    head += [(JEQ, name, 0, numbers[name]) for name in rules]
    head += [(RET, 0, 0, RET_EPERM)]
    blocks, labels = [], {}
    for name, conditions in rules.items():
        labels[name] = len(head) + len(blocks)
        for condition in conditions:
            blocks += _condition(*condition)
        blocks += [(RET, 0, 0, RET_ALLOW)]
    prog = head + blocks
    labels["ALLOW"], labels["DENY"] = len(prog), len(prog) + 1
    prog += [(RET, 0, 0, RET_ALLOW), (RET, 0, 0, RET_EPERM)]

    def skip(target, i: int) -> int:      # a label, or a count of instructions (0: the next one)
        return labels[target] - i - 1 if isinstance(target, str) else target
    prog = [(code, skip(jt, i), skip(jf, i), k) for i, (code, jt, jf, k) in enumerate(prog)]
    if any(not 0 <= jump <= 255 for _, jt, jf, _ in prog for jump in (jt, jf)):
        raise ValueError("the seccomp program grew past BPF's 8-bit jumps")
    return prog


def _condition(kind: str, arg: int, value=None) -> list:
    """Instructions that fall through when the condition holds and jump to DENY when not."""
    low, high = ARGS + 8 * arg, ARGS + 8 * arg + 4          # little-endian: the low half first
    if kind == "clear":
        return [(LD_ABS, 0, 0, low), (AND, 0, 0, value), (JEQ, 0, "DENY", 0)]
    if kind == "one_of":                  # a match skips the remaining comparisons
        return [(LD_ABS, 0, 0, low)] + [(JEQ, len(value) - i - 1, "DENY" if i == len(value) - 1 else 0, v)
                                        for i, v in enumerate(value)]
    if kind == "null":
        return [(LD_ABS, 0, 0, low), (JEQ, 0, "DENY", 0), (LD_ABS, 0, 0, high), (JEQ, 0, "DENY", 0)]
    raise ValueError(f"unknown condition {kind!r}")
