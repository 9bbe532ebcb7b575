/* The first process of a warm sandbox (runner/sandbox/warm.py): bwrap has made the
 * namespaces, mounts, seccomp filter, limits and cgroups; this waits for the command.
 *
 *   shellyard-warm SPEC_FD SELF_FD
 *
 * Reads SPEC_FD (a pipe whose write end only the runner holds) to its end, then closes it
 * and SELF_FD (the descriptor this program was run from, /proc/self/fd/SELF_FD). The spec is
 * NUL-separated fields:
 *
 *   "shellyard-warm-1" CWD NENV ENV... NARGV ARGV... "end"
 *
 * With a whole spec: chdir(CWD), the environment becomes exactly ENV (NAME=VALUE each), and
 * ARGV is executed as bwrap would (execvp), so the command is a fresh process as in a cold
 * sandbox (E1). Without one (the runner closed the pipe to discard it, or died): exit 0,
 * running nothing, and the sandbox ends with it; no waiting sandbox outlives its runner.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SPEC (4 << 20)
#define MAGIC "shellyard-warm-1"

static char *next_field(char **cursor, char *end) {
    char *field = *cursor;
    char *nul;
    if (field >= end)
        return NULL;
    nul = memchr(field, '\0', (size_t)(end - field));
    if (nul == NULL)
        return NULL;
    *cursor = nul + 1;
    return field;
}

static long count_field(char **cursor, char *end) {
    char *field = next_field(cursor, end), *stop = NULL;
    long value;
    if (field == NULL)
        return -1;
    errno = 0;
    value = strtol(field, &stop, 10);
    if (errno || stop == field || *stop != '\0' || value < 0 || value > 65536)
        return -1;
    return value;
}

int main(int argc, char **argv) {
    size_t size = 0, room = 65536;
    char *spec, *cursor, *end, *field, *cwd;
    char **env, **args;
    long nenv, nargs;
    int fd;
    if (argc != 3)
        return 0;
    fd = atoi(argv[1]);
    close(atoi(argv[2]));
    spec = malloc(room);
    if (spec == NULL)
        return 0;
    for (;;) {
        ssize_t got;
        if (size == room) {
            char *bigger;
            if (room >= MAX_SPEC)
                return 0;
            room *= 2;
            bigger = realloc(spec, room);
            if (bigger == NULL)
                return 0;
            spec = bigger;
        }
        got = read(fd, spec + size, room - size);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size += (size_t)got;
    }
    close(fd);
    cursor = spec;
    end = spec + size;
    field = next_field(&cursor, end);
    if (field == NULL || strcmp(field, MAGIC) != 0)
        return 0; /* discarded: nothing runs */
    cwd = next_field(&cursor, end);
    nenv = count_field(&cursor, end);
    if (cwd == NULL || nenv < 0)
        return 0;
    env = calloc((size_t)nenv + 1, sizeof *env);
    if (env == NULL)
        return 0;
    for (long k = 0; k < nenv; k++)
        if ((env[k] = next_field(&cursor, end)) == NULL)
            return 0;
    nargs = count_field(&cursor, end);
    if (nargs < 1)
        return 0;
    args = calloc((size_t)nargs + 1, sizeof *args);
    if (args == NULL)
        return 0;
    for (long k = 0; k < nargs; k++)
        if ((args[k] = next_field(&cursor, end)) == NULL)
            return 0;
    field = next_field(&cursor, end);
    if (field == NULL || strcmp(field, "end") != 0)
        return 0; /* cut short: the runner died while writing it */
    if (chdir(cwd) != 0) {
        fprintf(stderr, "bwrap: Can't chdir to %s: %s\n", cwd, strerror(errno));
        return 1;
    }
    if (clearenv() != 0)
        return 1;
    for (long k = 0; k < nenv; k++)
        if (putenv(env[k]) != 0)
            return 1;
    execvp(args[0], args);
    fprintf(stderr, "bwrap: execvp %s: %s\n", args[0], strerror(errno));
    return 1;
}
