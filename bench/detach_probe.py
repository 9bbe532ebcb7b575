"""What the launcher's detach (launch.c ``--detach``) costs a spawn, by how the mounts below
the runner's folder are laid out: a forked child takes a private slave mount namespace as the
launcher does and unmounts N tmpfs mounts one by one (``each``, today's detach), or one
container mount they all lie below (``container``), or moves each into a tmpfs of its own
and unmounts that once (``move``), or nothing (``none``: the namespace's copy alone); or, as
launch.c ``--clean-fd`` does, copies two of the mounts (``open_tree``), enters a namespace
made before any of the N was mounted, takes a copy of it and attaches them there
(``clean``); ``fork``: the child alone. Machine CPU per spawn from /proc/stat
(docs/benchmarks.md §77, §78, §80). Root only.

    .venv/bin/python bench/detach_probe.py none|each|container|move|clean|fork N [--dir D]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time

_CLONE_NEWNS, _MS_REC, _MS_SLAVE, _MS_BIND, _MNT_DETACH = 0x20000, 0x4000, 1 << 19, 4096, 2
_MS_MOVE = 8192
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _OPEN_TREE_CLONE, _AT_FDCWD, _F_EMPTY_PATH = 428, 429, 1, -100, 4
libc = ctypes.CDLL("libc.so.6", use_errno=True)


def mount(source: bytes | None, target: bytes, kind: bytes | None, flags: int,
          data: bytes | None = None) -> None:  # fmt: skip
    if libc.mount(source, target, kind, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target!r}")


def busy_ticks() -> int:
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("none", "each", "container", "move", "clean", "fork"))
    parser.add_argument("n", type=int)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--spawns", type=int, default=300)
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.dir)
    container = os.path.join(root, "ws").encode()
    os.mkdir(container)
    scratch = os.path.join(root, "scratch").encode()
    os.mkdir(scratch)
    clean_fd, holder = -1, 0
    if args.mode == "clean":  # the clean namespace, made before the N mounts exist
        ready, say = os.pipe()
        holder = os.fork()
        if holder == 0:
            os.close(ready)
            if libc.unshare(_CLONE_NEWNS) == 0:
                libc.mount(None, b"/", None, _MS_REC | (1 << 18), None)  # MS_PRIVATE
            os.write(say, b"x")
            time.sleep(3600)
            os._exit(0)
        os.close(say)
        os.read(ready, 1)
        clean_fd = os.open(f"/proc/{holder}/ns/mnt", os.O_RDONLY)
        os.kill(holder, 9)
        os.waitpid(holder, 0)
    if args.mode == "container":
        mount(container, container, None, _MS_BIND)
    points = []
    for k in range(args.n):
        point = os.path.join(container, b"w%d" % k)
        os.mkdir(point)
        mount(b"tmpfs", point, b"tmpfs", 0, b"size=64k")
        points.append(point)
    try:
        ticks, start = busy_ticks(), time.perf_counter()
        for _ in range(args.spawns):
            pid = os.fork()
            if pid == 0 and args.mode == "fork":
                os._exit(0)
            if pid == 0 and args.mode == "clean":
                libc.syscall.restype = ctypes.c_long
                copies = [libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, p, _OPEN_TREE_CLONE | 0x80000)
                          for p in points[:2]]  # fmt: skip
                if min(copies, default=0) < 0 or libc.setns(clean_fd, _CLONE_NEWNS) != 0:
                    os._exit(1)
                if libc.unshare(_CLONE_NEWNS) != 0:
                    os._exit(1)
                for fd, point in zip(copies, points[:2], strict=True):
                    if libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, point, _F_EMPTY_PATH):
                        os._exit(1)
                os._exit(0)
            if pid == 0:
                if libc.unshare(_CLONE_NEWNS) == 0 and (
                    libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) == 0
                ):
                    if args.mode == "container":
                        libc.umount2(container, _MNT_DETACH)
                    elif args.mode == "move":
                        libc.mount(b"tmpfs", scratch, b"tmpfs", 0, b"size=16k")
                        for k, point in enumerate(reversed(points)):
                            place = os.path.join(scratch, b"%d" % k)
                            os.mkdir(place)
                            libc.mount(point, place, None, _MS_MOVE, None)
                        libc.umount2(scratch, _MNT_DETACH)
                    elif args.mode == "each":
                        for point in reversed(points):
                            libc.umount2(point, _MNT_DETACH)
                os._exit(0)
            if os.waitpid(pid, 0)[1] != 0:
                raise SystemExit(f"a {args.mode} spawn failed")
        wall, cpu = time.perf_counter() - start, (busy_ticks() - ticks) / os.sysconf("SC_CLK_TCK")
        print(f"{args.mode} N={args.n}: {wall / args.spawns * 1000:.2f} ms wall, "
              f"{cpu / args.spawns * 1000:.2f} ms machine CPU per spawn")  # fmt: skip
    finally:
        if clean_fd >= 0:
            os.close(clean_fd)
        for point in reversed(points):
            libc.umount2(point, _MNT_DETACH)
        if args.mode == "container":
            libc.umount2(container, _MNT_DETACH)
        for point in points:
            os.rmdir(point)
        os.rmdir(container)
        os.rmdir(scratch)
        os.rmdir(root)


if __name__ == "__main__":
    main()
