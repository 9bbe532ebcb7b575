/* The sandbox launcher (runner/launch.py builds it once per runner with the host's C
 * compiler): what `nsenter`, `setpriv` and `prlimit` did before bwrap, in one exec instead of
 * three (each exec of those costs ~0.7-1.5 ms per command; measured in docs/benchmarks.md).
 *
 *   shellyard-launch [--sched batch] [--cgroup PROCS]... [--userns PATH | --userns-fd FD]
 *                    [--netns PATH | --netns-fd FD] [--ids UID:GID]
 *                    [--rlimit RESOURCE:SOFT:HARD]... -- PROGRAM [ARG]...
 *
 * --sched batch: this process becomes SCHED_BATCH first, so bwrap and everything of the
 * sandbox inherit it from their first instruction (set by the parent after the spawn, what
 * bwrap forked meanwhile would not): a woken sandbox no longer preempts the control plane's
 * event loop (docs/decisions.md "Sandboxes scheduled SCHED_BATCH"; not a limit, a command
 * may set itself back). Then join each cgroup (write "0" into its cgroup.procs, still as the runner: runner/
 * cgroups.py made the groups), so nothing of the command runs outside them. Then, in this
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
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_LIMITS 16
#define MAX_CGROUPS 8

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

int main(int argc, char **argv) {
    const char *userns = NULL, *netns = NULL, *ids = NULL;
    const char *userns_fd = NULL, *netns_fd = NULL;
    int resources[MAX_LIMITS];
    struct rlimit limits[MAX_LIMITS];
    const char *cgroups[MAX_CGROUPS];
    int nlimits = 0, ncgroups = 0, batch = 0, i = 1;
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
        struct sched_param param = {.sched_priority = 0};
        if (sched_setscheduler(0, SCHED_BATCH, &param) != 0)
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
        unsigned long uid, gid;
        char *end = NULL;
        errno = 0;
        uid = strtoul(ids, &end, 10);
        if (errno || end == ids || *end != ':')
            usage("--ids wants UID:GID");
        gid = strtoul(end + 1, &end, 10);
        if (errno || *end != '\0' || uid == 0 || gid == 0)
            usage("--ids wants UID:GID, neither 0");
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
