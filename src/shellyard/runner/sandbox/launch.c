/* The sandbox launcher (runner/launch.py builds it once per runner with the host's C
 * compiler): what `nsenter`, `setpriv` and `prlimit` did before bwrap, in one exec instead of
 * three (each exec of those costs ~0.7-1.5 ms per command; measured in docs/benchmarks.md).
 *
 *   shellyard-launch [--sched batch] [--cgroup PROCS]...
 *                    [--detach ROOT [--clean-fd FD] [--keep PATH]...]
 *                    [--userns PATH | --userns-fd FD] [--netns PATH | --netns-fd FD]
 *                    [--ids UID:GID] [--rlimit RESOURCE:SOFT:HARD]... -- PROGRAM [ARG]...
 *   shellyard-launch --clean-namespace ROOT [--keep PATH]...
 *
 * --sched batch: this process becomes SCHED_BATCH first, so bwrap and everything of the
 * sandbox inherit it from their first instruction (set by the parent after the spawn, what
 * bwrap forked meanwhile would not): a woken sandbox no longer preempts the control plane's
 * event loop (docs/decisions.md "Sandboxes scheduled SCHED_BATCH"; not a limit, a command
 * may set itself back). Then join each cgroup (write "0" into its cgroup.procs, still as the runner: runner/
 * cgroups.py made the groups), so nothing of the command runs outside them.
 * --detach ROOT (the runner's folder) --keep PATH...: the --keep paths are every host path
 * bwrap binds from (the sandbox's own tree, home, view, prefixes below ROOT, named as the
 * table names them; the host's view elsewhere, as given: one through a link keeps every host
 * mount, bwrap looking it up again through mounts this would unmount). When at
 * least DETACH_FROM mounts below ROOT are ones bwrap needs none of (the overlays and network
 * namespaces of other busy workspaces), this process takes a mount namespace of its own, a
 * slave of the host's (nothing unmounted here reaches the host), and unmounts there, as its
 * own table lists them, those and every host mount bwrap needs none of either (such as the
 * cgroup hierarchies, that nothing bound lies on or in). Needed: the root, every mount a
 * --keep PATH (or /proc, /dev) lies at or below, and every one at or below such a PATH (a
 * recursive bind shows it). bwrap copies the namespace
 * it starts in and reads the whole mount table again at each of its ~20 binds: every busy
 * workspace's mounts made every other's spawn dearer (docs/benchmarks.md §73), and each line
 * of the host's it binds nothing from cost every spawn ~20 formattings of it (§78). A step the
 * kernel refuses leaves the table as it is (a dearer spawn, nothing else). With --clean-fd
 * (a descriptor of the runner's clean namespace, made by --clean-namespace: a busy runner),
 * it starts from that namespace instead, with copies of the mounts its binds lie on
 * (detach_clean, below; docs/benchmarks.md §80). Then, in this
 * order, as the chain did: enter the user namespace, then the network namespace
 * (nsenter --user --net; by an inherited descriptor the runner opened and checked, R2: a
 * path may name another namespace by then, a descriptor keeps the one checked alive, and it
 * is closed once entered, so nothing of the command inherits it); drop to UID:GID with no supplementary groups (setpriv --reuid
 * --regid --clear-groups); set each limit (prlimit); execv PROGRAM (an absolute path).
 * RESOURCE is a number (RLIMIT_*); SOFT and HARD are numbers or "unlimited". Any failure
 * exits 127 with a message on stderr, before the program runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_LIMITS 16
#define MAX_CGROUPS 8
#define MAX_KEEPS 64
#define MAX_BELOW 65536
/* Fewer mounts below ROOT cost a spawn less than its own namespace does (~0.5 ms of CPU:
 * measured in docs/benchmarks.md §73). */
#define DETACH_FROM 4

static void fail(const char *what, const char *arg) {
    fprintf(stderr, "shellyard-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(127);
}

static void usage(const char *why) {
    fprintf(stderr, "shellyard-launch: %s\n", why);
    _exit(127);
}

static int parse_number(const char *text, unsigned long long *out) {
    char *end = NULL;
    if (strcmp(text, "unlimited") == 0) {
        *out = RLIM_INFINITY;
        return 0;
    }
    errno = 0;
    *out = strtoull(text, &end, 10);
    return (errno != 0 || end == text || *end != '\0') ? -1 : 0;
}

static void enter(const char *path, int kind) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open", path);
    if (setns(fd, kind) != 0)
        fail("cannot enter", path);
    close(fd);
}

static int parse_fd(const char *text) {
    unsigned long long fd;
    if (parse_number(text, &fd) || fd < 3 || fd > 1048576)
        usage("a namespace descriptor wants a number from 3");
    return (int)fd;
}

static void enter_fd(int fd, int kind, const char *text) {
    if (setns(fd, kind) != 0)
        fail("cannot enter the namespace of descriptor", text);
    if (close(fd) != 0)
        fail("cannot close the namespace descriptor", text);
}

/* PATH is ROOT or below it (ROOT without a trailing slash). */
static int at_or_below(const char *path, const char *root) {
    size_t n = strlen(root);
    return strncmp(path, root, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* mountinfo's escapes (\040 for a space, \011, \012, \134) undone in place. */
static void unescape(char *text) {
    char *out = text;
    for (char *in = text; *in; out++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out = *in++;
        }
    }
    *out = '\0';
}

/* PATH is TOP or below it; every path is below "/". */
static int within(const char *path, const char *top) {
    return strcmp(top, "/") == 0 || at_or_below(path, top);
}

/* The host's mounts bwrap itself reads from whatever its options: /proc (its proc_fd) and
 * /dev (--dev binds the host's device nodes, and a terminal's from /dev/pts). */
static const char *const IMPLICIT_KEEPS[] = {"/proc", "/dev"};

/* A mount bwrap may need: the root; one a keep lies at or below (what it binds from is on
 * it); one at or below a keep (a recursive bind shows it in the sandbox). */
static int needed(const char *point, const char **keeps, int nkeeps) {
    if (strcmp(point, "/") == 0)
        return 1;
    for (int k = 0; k < nkeeps; k++)
        if (within(keeps[k], point) || within(point, keeps[k]))
            return 1;
    for (size_t k = 0; k < sizeof IMPLICIT_KEEPS / sizeof *IMPLICIT_KEEPS; k++)
        if (within(IMPLICIT_KEEPS[k], point) || within(point, IMPLICIT_KEEPS[k]))
            return 1;
    return 0;
}

/* The mount points bwrap needs none of, in the table's order (a mount after the one it is
 * on). Returns how many; their texts live in the returned buffer (NULL: none). */
static char *mounts_unneeded(const char **keeps, int nkeeps, char **points, int *count) {
    FILE *table = fopen("/proc/self/mountinfo", "re");
    if (table == NULL)
        fail("cannot read", "/proc/self/mountinfo");
    size_t size = 0, used = 0;
    char *buffer = NULL, *line = NULL;
    size_t room = 0;
    int n = 0;
    while (getline(&line, &room, table) > 0) {
        char *field = line;
        for (int k = 0; k < 4 && field; k++) { /* the fifth field: the mount point */
            field = strchr(field, ' ');
            if (field)
                field++;
        }
        char *end = field ? strchr(field, ' ') : NULL;
        if (!end)
            continue;
        *end = '\0';
        unescape(field);
        if (needed(field, keeps, nkeeps) || n == MAX_BELOW)
            continue;
        size_t length = strlen(field) + 1;
        if (used + length > size) {
            size = (used + length) * 2 + 4096;
            char *grown = realloc(buffer, size);
            if (grown == NULL)
                fail("out of memory reading", "/proc/self/mountinfo");
            buffer = grown;
        }
        memcpy(buffer + used, field, length);
        points[n++] = (char *)(uintptr_t)used; /* an offset until the buffer stops moving */
        used += length;
    }
    free(line);
    fclose(table);
    for (int k = 0; k < n; k++)
        points[k] = buffer + (uintptr_t)points[k];
    *count = n;
    return buffer;
}

/* One of POINTS lies strictly above POINTS[I]: a detached unmount of that one takes this. */
static int under_another(char **points, int count, int i) {
    for (int k = 0; k < count; k++)
        if (k != i && strcmp(points[k], points[i]) != 0 && within(points[i], points[k]))
            return 1;
    return 0;
}

/* Below ROOT the runner names a keep as the table does (its own folders and files, never a
 * link). Elsewhere (the host's view, an operator's path) a path through a link leaves the
 * host's mounts in place: bwrap looks it up again, through every mount the link and its
 * target lie on, and one of them unmounted here showed the sandbox what that mount hides on
 * the host (attack pass, session 55). A path that does not exist (a --bind-try's) stays as
 * given: it holds no link to follow. 1: the host's unneeded mounts may go too. */
static int host_prunable(const char *root, const char **keeps, int nkeeps) {
    int host_too = 1;
    for (int k = 0; k < nkeeps && host_too; k++) {
        if (at_or_below(keeps[k], root))
            continue;
        errno = 0;
        char *real = realpath(keeps[k], NULL);
        /* Only a path that is not there holds no link. Any other refusal (too many links,
         * a name too long, no search permission) says nothing of where the kernel would
         * go: musl's realpath gives up at 40 links where the kernel still follows (attack
         * pass, session 57). */
        host_too = real == NULL ? (errno == ENOENT || errno == ENOTDIR)
                                : strcmp(real, keeps[k]) == 0;
        free(real);
    }
    return host_too;
}

/* In this process's own namespace: unmount every mount bwrap needs none of below ROOT and,
 * if HOST_TOO, elsewhere, as this namespace's table lists them. */
static void unmount_unneeded(const char *root, const char **keeps, int nkeeps, int host_too) {
    static char *points[MAX_BELOW];
    int count = 0;
    char *buffer = mounts_unneeded(keeps, nkeeps, points, &count);
    int taken = 0;
    for (int k = 0; k < count; k++)
        if (host_too || (at_or_below(points[k], root) && strcmp(points[k], root) != 0))
            points[taken++] = points[k];
    /* The topmost of each unneeded subtree only (a detached unmount takes what is on it:
     * the host's eleven cgroup hierarchies go with /sys/fs/cgroup), from the end of the
     * table; two stacked on one folder: the upper goes, the lower stays. */
    for (int k = taken - 1; k >= 0; k--)
        if (!under_another(points, taken, k))
            (void)umount2(points[k], MNT_DETACH);
    free(buffer);
}

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x4
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif

#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x1000U
#endif

#ifndef SYS_statx
#define SYS_statx __NR_statx
#endif
/* struct statx's fixed layout (the kernel's ABI): stx_mask at 0, stx_mnt_id at 0x90. */
#define STATX_BUFFER 256
#define STX_MNT_ID_AT 0x90

/* The mount a path lies on, by its id (0: refused; errno ENOENT: no such path). The system
 * call itself: musl's libc (the launcher's where the host has it, launch.py) has no statx
 * before 1.2.5. */
static uint64_t mount_of(const char *path) {
    uint64_t found[STATX_BUFFER / sizeof(uint64_t)];
    uint32_t mask;
    uint64_t id;
    if (syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, found) != 0)
        return 0;
    memcpy(&mask, found, sizeof mask);
    if (!(mask & STATX_MNT_ID)) {
        errno = ENOSYS;
        return 0;
    }
    memcpy(&id, (const char *)found + STX_MNT_ID_AT, sizeof id);
    return id;
}

/* The topmost mount point on KEEP's path strictly below ROOT (whose mount is ROOT_MOUNT),
 * into OUT: 1. 0: KEEP lies on ROOT's own mount (the clean namespace has it as it is) or
 * does not exist (a --bind-try's: nor there). -1: refused. */
static int topmost_mount(const char *root, uint64_t root_mount, const char *keep, char *out) {
    size_t n = strlen(root), length = strlen(keep);
    if (length <= n || length >= PATH_MAX)
        return -1; /* ROOT itself: everything below it would have to come (never asked) */
    memcpy(out, keep, length + 1);
    for (size_t i = n + 1; i <= length; i++) {
        if (out[i] != '/' && out[i] != '\0')
            continue;
        char saved = out[i];
        out[i] = '\0';
        uint64_t mount = mount_of(out);
        if (mount == 0)
            return errno == ENOENT ? 0 : -1;
        if (mount != root_mount)
            return 1;
        out[i] = saved;
    }
    return 0;
}

/* --clean-fd: start from the runner's clean namespace (a copy of the host's, a slave of it,
 * with nothing mounted below ROOT, runner/sandbox/clean_namespace.py) instead of copying the
 * host's whole table and unmounting the other workspaces' mounts one by one: for each keep
 * below ROOT, the topmost mount on its path below ROOT (its overlay, the egress socket's
 * tmpfs) is copied here with everything mounted on and below it (OPEN_TREE_CLONE |
 * AT_RECURSIVE: what bwrap's recursive bind shows), the clean namespace entered, a namespace
 * of this process's own made from it, and the copies attached where they were. A keep on
 * ROOT's own mount needs none: the clean namespace has that mount. The host's unbound mounts
 * were left out when the namespace was made, for the runner's host view (the runner passes
 * --clean-fd only to a spawn whose keeps outside ROOT are among that view's). Returns 0, -1
 * nothing changed (the caller detaches the old way); once the clean namespace is entered,
 * a failure exits 127 (bwrap would bind the folders without their mounts). */
static int detach_clean(const char *root, const char **keeps, int nkeeps, int clean) {
    static char points[MAX_KEEPS][PATH_MAX];
    int copies[MAX_KEEPS], n = 0;
    uint64_t root_mount = mount_of(root);
    if (root_mount == 0)
        return -1;
    for (int k = 0; k < nkeeps; k++) {
        if (!at_or_below(keeps[k], root))
            continue;
        int found = topmost_mount(root, root_mount, keeps[k], points[n]);
        int again = 0;
        for (int j = 0; j < n && found == 1; j++)
            again |= strcmp(points[j], points[n]) == 0;
        if (found == 0 || again)
            continue;
        int fd = found < 0 ? -1
                           : (int)syscall(SYS_open_tree, AT_FDCWD, points[n],
                                          OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
        if (fd < 0) {
            for (int j = 0; j < n; j++)
                close(copies[j]);
            return -1;
        }
        copies[n++] = fd;
    }
    /* The namespace left out the host's unbound mounts for the view as it was: a host path
     * that has become a link since may lie on one of them (bwrap would follow it to what
     * that mount hides on the host; attack pass, session 56): the old way, which keeps
     * them. */
    if (!host_prunable(root, keeps, nkeeps) || setns(clean, CLONE_NEWNS) != 0) {
        for (int j = 0; j < n; j++)
            close(copies[j]);
        return -1;
    }
    if (close(clean) != 0)
        fail("cannot close the clean namespace's descriptor", NULL);
    if (unshare(CLONE_NEWNS) != 0)
        fail("cannot take a mount namespace of its own", NULL);
    for (int j = 0; j < n; j++) {
        if (syscall(SYS_move_mount, copies[j], "", AT_FDCWD, points[j],
                    MOVE_MOUNT_F_EMPTY_PATH) != 0)
            fail("cannot attach the copy of", points[j]);
        close(copies[j]);
    }
    /* A copy is a peer of the host's mount it was made from (OPEN_TREE_CLONE keeps the
     * peer group): on a shared host, an unmount below it here would unmount the host's
     * (attack pass, session 56). Slaves first, as the old way's namespace is. */
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        fail("cannot make the namespace a slave", NULL);
    /* What a copy brought that bwrap needs none of: another workspace's mount lying on the
     * same topmost mount (none in today's layout; the table here is the clean one's few
     * lines and the copies'). */
    unmount_unneeded(root, keeps, nkeeps, 0);
    return 0;
}

static void detach(const char *root, const char **keeps, int nkeeps, int clean) {
    static char *points[MAX_BELOW];
    int count = 0;
    if (root[0] != '/' || strlen(root) < 2 || root[strlen(root) - 1] == '/')
        usage("--detach wants an absolute path without a trailing slash");
    for (int k = 0; k < nkeeps; k++)
        if (keeps[k][0] != '/')
            usage("--keep wants an absolute path");
    if (clean >= 0) {
        if (detach_clean(root, keeps, nkeeps, clean) == 0)
            return;
        if (close(clean) != 0) /* refused: the old way, nothing of the command inherits it */
            fail("cannot close the clean namespace's descriptor", NULL);
    }
    char *buffer = mounts_unneeded(keeps, nkeeps, points, &count);
    /* Other workspaces' mounts decide: the host's own (the same few dozen lines, mostly
     * unmounted at once) saved less than the namespace and its unmounts cost a lone
     * workspace's round trip (0.5-1 ms more at p50, docs/benchmarks.md §78). */
    int others = 0;
    for (int k = 0; k < count; k++)
        others += at_or_below(points[k], root) && strcmp(points[k], root) != 0;
    if (others < DETACH_FROM) {
        free(buffer);
        return;
    }
    int host_too = host_prunable(root, keeps, nkeeps);
    /* Only a cost is at stake: where the kernel refuses a step, bwrap starts from the table
     * as it is. But nothing is unmounted unless this namespace is a slave of the host's. */
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) == 0) {
        /* The table again, now this namespace's own: the host's first read only counted. A
         * workspace's mount made between that read and the unshare was copied here and
         * missed by it; it stayed for the sandbox's life, holding another workspace's
         * overlay or network namespace alive after the host let it go (session 53). */
        unmount_unneeded(root, keeps, nkeeps, host_too);
    }
    free(buffer);
}

/* --clean-namespace ROOT [--keep PATH]...: the runner's clean namespace
 * (runner/sandbox/clean_namespace.py): a copy of this one with every mount below ROOT
 * unmounted, and every host mount the PATHs (the runner's host view) need none of, by the
 * rule of a spawn's detach; "ready pruned" (or "ready whole": no host mount could go) on
 * stdout once made, then this process waits for its stdin's end (the runner opens
 * /proc/PID/ns/mnt meanwhile, and that descriptor keeps the namespace). A slave of the
 * host's, as the old way's namespace is: nothing done here or in a copy reaches the host,
 * and what the host unmounts later goes here and from every sandbox's launcher namespace
 * too (a private copy held a revoked volume for the sandbox's life, attack pass session 56).
 * The runner makes none where the mount ROOT lies on is shared (its later overlays would
 * arrive here); where it is private nothing of the runner's arrives, and the runner makes a
 * new one when the host's other mounts change. */
static int make_clean(const char *root, const char **keeps, int nkeeps) {
    char byte;
    if (root[0] != '/' || strlen(root) < 2 || root[strlen(root) - 1] == '/')
        usage("--clean-namespace wants an absolute path without a trailing slash");
    for (int k = 0; k < nkeeps; k++)
        if (keeps[k][0] != '/' || at_or_below(keeps[k], root))
            usage("--keep wants an absolute path outside ROOT");
    int host_too = host_prunable(root, keeps, nkeeps);
    if (unshare(CLONE_NEWNS) != 0)
        fail("cannot take a mount namespace of its own", NULL);
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        fail("cannot make the namespace a slave", NULL);
    /* Everything below ROOT first, whatever the PATHs: one above ROOT would keep every
     * workspace's mounts here (attack pass, session 56). Then the host's, ROOT kept with the
     * PATHs: the spawns' copies are attached below it, on the mounts it lies on. */
    unmount_unneeded(root, NULL, 0, 0);
    const char *kept[MAX_KEEPS + 1];
    for (int k = 0; k < nkeeps; k++)
        kept[k] = keeps[k];
    kept[nkeeps] = root;
    unmount_unneeded(root, kept, nkeeps + 1, host_too);
    /* "whole": a PATH through a link kept every host mount, and each spawn's launcher,
     * checking its links again, would detach the old way: the runner does not use it. */
    const char *said = host_too ? "ready pruned\n" : "ready whole\n";
    if (write(1, said, strlen(said)) != (ssize_t)strlen(said))
        fail("cannot say", "ready");
    while (read(0, &byte, 1) > 0)
        continue;
    return 0;
}

int main(int argc, char **argv) {
    const char *userns = NULL, *netns = NULL, *ids = NULL;
    const char *userns_fd = NULL, *netns_fd = NULL;
    int resources[MAX_LIMITS];
    struct rlimit limits[MAX_LIMITS];
    const char *cgroups[MAX_CGROUPS];
    const char *detach_root = NULL, *keeps[MAX_KEEPS];
    int nlimits = 0, ncgroups = 0, nkeeps = 0, batch = 0, i = 1, clean = -1;
    if (argc >= 3 && strcmp(argv[1], "--clean-namespace") == 0) {
        const char *host[MAX_KEEPS];
        int nhost = 0;
        for (i = 3; i < argc; i += 2) {
            if (strcmp(argv[i], "--keep") != 0 || i + 1 >= argc)
                usage("--clean-namespace ROOT takes --keep PATH only");
            if (nhost == MAX_KEEPS)
                usage("too many --keep");
            host[nhost++] = argv[i + 1];
        }
        return make_clean(argv[2], host, nhost);
    }
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc)
            usage("an option without its value");
        if (strcmp(argv[i], "--sched") == 0) {
            if (strcmp(argv[++i], "batch") != 0)
                usage("--sched wants batch");
            batch = 1;
        } else if (strcmp(argv[i], "--cgroup") == 0) {
            if (ncgroups == MAX_CGROUPS)
                usage("too many --cgroup");
            cgroups[ncgroups++] = argv[++i];
        } else if (strcmp(argv[i], "--detach") == 0) {
            detach_root = argv[++i];
        } else if (strcmp(argv[i], "--clean-fd") == 0) {
            clean = parse_fd(argv[++i]);
        } else if (strcmp(argv[i], "--keep") == 0) {
            if (nkeeps == MAX_KEEPS)
                usage("too many --keep");
            keeps[nkeeps++] = argv[++i];
        } else if (strcmp(argv[i], "--userns") == 0) {
            userns = argv[++i];
        } else if (strcmp(argv[i], "--netns") == 0) {
            netns = argv[++i];
        } else if (strcmp(argv[i], "--userns-fd") == 0) {
            userns_fd = argv[++i];
        } else if (strcmp(argv[i], "--netns-fd") == 0) {
            netns_fd = argv[++i];
        } else if (strcmp(argv[i], "--ids") == 0) {
            ids = argv[++i];
        } else if (strcmp(argv[i], "--rlimit") == 0) {
            char spec[128], *soft, *hard;
            unsigned long long resource, s, h;
            if (nlimits == MAX_LIMITS || strlen(argv[i + 1]) >= sizeof spec)
                usage("too many or too long --rlimit");
            strcpy(spec, argv[++i]);
            soft = strchr(spec, ':');
            hard = soft ? strchr(soft + 1, ':') : NULL;
            if (!soft || !hard)
                usage("--rlimit wants RESOURCE:SOFT:HARD");
            *soft++ = '\0';
            *hard++ = '\0';
            if (parse_number(spec, &resource) || parse_number(soft, &s) || parse_number(hard, &h))
                usage("--rlimit wants numbers");
            if (resource >= RLIM_NLIMITS)
                usage("--rlimit wants a known RESOURCE");
            resources[nlimits] = (int)resource;
            limits[nlimits].rlim_cur = (rlim_t)s;
            limits[nlimits].rlim_max = (rlim_t)h;
            nlimits++;
        } else {
            usage("unknown option");
        }
    }
    if (i >= argc || argv[i][0] != '/')
        usage("no program (an absolute path) after --");
    if (batch) {
        /* the system call: musl's sched_setscheduler always fails (ENOSYS), by design */
        struct sched_param param = {.sched_priority = 0};
        if (syscall(SYS_sched_setscheduler, 0, SCHED_BATCH, &param) != 0)
            fail("cannot set the scheduling policy", "batch");
    }
    for (int k = 0; k < ncgroups; k++) {
        int fd = open(cgroups[k], O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            fail("cannot open", cgroups[k]);
        if (write(fd, "0", 1) != 1)
            fail("cannot join the cgroup", cgroups[k]);
        close(fd);
    }
    if ((nkeeps || clean >= 0) && !detach_root)
        usage("--keep or --clean-fd without --detach");
    /* before the user namespace: unmounting needs the host's root, inside one it could not */
    if (detach_root)
        detach(detach_root, keeps, nkeeps, clean);
    if ((userns && userns_fd) || (netns && netns_fd))
        usage("a namespace by path or by descriptor, not both");
    if (userns)
        enter(userns, CLONE_NEWUSER);
    if (userns_fd)
        enter_fd(parse_fd(userns_fd), CLONE_NEWUSER, userns_fd);
    if (netns)
        enter(netns, CLONE_NEWNET);
    if (netns_fd)
        enter_fd(parse_fd(netns_fd), CLONE_NEWNET, netns_fd);
    if (ids) {
        unsigned long long uid, gid;
        char *end = NULL;
        errno = 0;
        /* digits only (strtoull takes "-1"), and within uid_t below (uid_t)-1: a wider
         * number cut down to uid_t was 0, root (attack pass, session 57) */
        if (ids[0] < '0' || ids[0] > '9')
            usage("--ids wants UID:GID");
        uid = strtoull(ids, &end, 10);
        if (errno || end == ids || *end != ':' || end[1] < '0' || end[1] > '9')
            usage("--ids wants UID:GID");
        gid = strtoull(end + 1, &end, 10);
        if (errno || *end != '\0' || uid == 0 || gid == 0)
            usage("--ids wants UID:GID, neither 0");
        if (uid >= (uid_t)-1 || gid >= (gid_t)-1)
            usage("--ids wants UID:GID below 4294967295");
        if (setgroups(0, NULL) != 0)
            fail("cannot clear the supplementary groups", NULL);
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0)
            fail("cannot set the group", ids);
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
            fail("cannot set the user", ids);
        if (getuid() != (uid_t)uid || geteuid() != (uid_t)uid || getegid() != (gid_t)gid)
            usage("the user did not change");
    }
    for (int k = 0; k < nlimits; k++)
        if (setrlimit(resources[k], &limits[k]) != 0)
            fail("cannot set a limit", NULL);
    execv(argv[i], &argv[i]);
    fail("cannot run", argv[i]);
    return 127;
}
