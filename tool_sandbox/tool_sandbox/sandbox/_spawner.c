/* The forker's loop and a child's isolation, in C.
 *
 * Why C: every page of the warm interpreter that the forker writes after a fork is copied, and
 * splits the huge pages its heap was collapsed into (memory.py); a Python loop touches hundreds of
 * pages per call, and a child that isolates itself in Python touches hundreds more. Here the
 * forker's steady state and a child's whole set-up run without touching a Python object: a child
 * first runs Python when it is isolated and waiting for its code.
 *
 * serve() never returns in the forker except with None when the worker closes the socket; in each
 * forked child it returns (workdir, vm_bytes, error) once isolated (error is None, or what
 * failed, in which case the child must report it and exit).
 *
 * Messages on the SOCK_SEQPACKET socket (layouts defined in forker.py, native byte order):
 *   worker -> forker  spawn: int32 op=1, int32 slot, int32 uid (-1: keep ours), workdir bytes,
 *                     with 4 fds (request read end; stdout, stderr and control write ends);
 *                     kill:  int32 op=2, int32 slot; continue: int32 op=4, int32 slot (a session's
 *                     child, stopped by itself since its last cell); limit: int32 op=5, int32 slot,
 *                     int32 tasks (what the call's child may run at once, threads included).
 *   forker -> worker  int32 slot, int32 event, int32 status, float64 CPU seconds: event 1 once
 *                     that slot's child has been reaped (status: its wait status), 2 when it
 *                     stopped (a session's cell ended: status is the stop signal), 0 when it could
 *                     not be forked (status: errno), 3 when a thread of its call was refused because
 *                     the worker's task budget was used up by the others (the child itself held less
 *                     than its fair share, the budget over the children alive; one holding more is
 *                     refused for its own doing: no event).
 *
 * Tasks of a call: a child's threads are bounded by the forker, not by RLIMIT_NPROC (which counts
 * every task of a uid, and children share the server's uid in a pod). Each child installs a seccomp
 * filter that turns clone(CLONE_THREAD) into a user notification and hands its listener to the
 * forker (over a socket only children in set-up hold); the forker lets the clone proceed while the
 * child has fewer threads than its call's limit, else it fails with EAGAIN. All children of a worker
 * together stay within its task budget (its share of the pod's): the forker counts each child's
 * tasks (when it forks it, when it starts a thread, and all of them again before refusing one).
 *
 * receive() is a child's read of its next request on the request pipe (layout in layers.py): a
 * header (mode, limits, sizes), stdin, code. For a new program it also writes the code to main.py
 * and sets the limits and stdin, so the Python a one-shot child runs is the code and what a plain
 * interpreter does around it (child.py).
 *
 * Child set-up order: its pipes first (so any failure is reported), then what needs privilege
 * (uid), then no_new_privs, Landlock and seccomp, after which the child can only lose rights;
 * descriptors other than 0-4 are closed last. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define OP_SPAWN 1
#define OP_KILL 2
#define OP_CONT 4
#define OP_LIMIT 5
#define NFDS 4
#define REPLY_SIZE 20
#define EVENT_FORK_FAILED 0
#define EVENT_EXITED 1
#define EVENT_STOPPED 2
#define EVENT_PRESSED 3
#define WATCH_SOCKET UINT64_MAX
#define WATCH_SIGCHLD (UINT64_MAX - 1)
#define WATCH_HANDOFF (UINT64_MAX - 2)
#define WATCH_LISTENER (1ULL << 32) /* | generation << 33 | slot: a child's task-limit listener */
#define GENERATION_MASK ((1U << 30) - 1) /* bits 33..62: never one of the UINT64_MAX - k above */
#define MODE_RUN 0 /* layers.RUN */
#define MODE_EXEC 2 /* layers.EXEC */
#define STACK_BYTES ((rlim_t)256 << 20) /* main-thread stack of sandboxed code; growth stops (SIGSEGV) at the next mapping, never into it */
#define MT19937_WORDS 624 /* numpy's mt19937_state: uint32_t key[624]; int pos; */

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SECCOMP_USER_NOTIF_FLAG_CONTINUE
#define SECCOMP_USER_NOTIF_FLAG_CONTINUE (1UL << 0)
#endif
#define SYS_LANDLOCK_CREATE_RULESET 444
#define SYS_LANDLOCK_ADD_RULE 445
#define SYS_LANDLOCK_RESTRICT_SELF 446
#define LANDLOCK_RULE_PATH_BENEATH 1

struct path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* What every child applies; copied out of Python objects once, before the first fork. */
struct setup {
    struct sock_fprog static_filter;
    struct sock_fprog self_filter;
    struct sock_fprog task_filter; /* len 0: no task limit (the kernel cannot notify) */
    int handoff; /* a child's end of the socket its task-limit listener goes to the forker on */
    uint32_t self_placeholder, group_placeholder;
    const void *landlock_attr; /* NULL: no Landlock */
    size_t landlock_attr_size;
    struct path_beneath *rules;
    size_t n_rules;
    uint64_t own_rights;
    void *mt19937; /* numpy's global MT19937 state, NULL: numpy not loaded */
    pid_t forker;
    int statm;
    long page_size;
};

/* A request to a child (layers.REQUEST, native byte order): then stdin_bytes, then code_bytes. */
struct request {
    uint32_t mode; /* layers.RUN, SESSION or EXEC (a session's next cell: no limits, no stdin) */
    double timeout_seconds;
    uint32_t memory_mib, file_size_mib, open_files, processes;
    uint32_t stdin_bytes, code_bytes;
} __attribute__((packed));

/* In a child: whether it runs under a uid of its own (the server is root) or shares the server's.
   RLIMIT_NPROC counts every task of the real uid, so under a shared uid it would charge each call
   with the whole server's processes and threads and refuse its threads at random; there forks are
   refused by seccomp anyway, and threads are bounded by RLIMIT_AS and the pod's pids limit. */
static int own_uid;

struct child_state {
    pid_t pid; /* 0: slot free */
    int pidfd;
    int listener; /* its task-limit listener, -1 until handed over */
    int tasks;    /* what its call may run at once (OP_LIMIT); 1 until told */
    int counted;  /* its tasks in the forker's count (budget) */
    unsigned generation; /* which child of this slot: one epoll_wait can return a dead child's listener
                            events after its slot's next child handed over its own listener */
};

/* Tasks of all children as last counted, against the worker's budget (0: none). */
static long tasks_counted, tasks_budget;

static void *copy_bytes(Py_buffer *view) {
    void *copy = PyMem_RawMalloc(view->len ? (size_t)view->len : 1);
    if (copy != NULL) memcpy(copy, view->buf, (size_t)view->len);
    return copy;
}

/* The child's pid where the self-only filter holds a placeholder. */
static void patch_self_filter(const struct setup *s, pid_t pid) {
    for (unsigned short i = 0; i < s->self_filter.len; i++) {
        struct sock_filter *ins = &s->self_filter.filter[i];
        if (ins->k == s->self_placeholder) ins->k = (uint32_t)pid;
        else if (ins->k == s->group_placeholder) ins->k = (uint32_t)-pid;
    }
}

static const char *landlock(const struct setup *s) {
    int ruleset = (int)syscall(SYS_LANDLOCK_CREATE_RULESET, s->landlock_attr, s->landlock_attr_size, 0);
    if (ruleset < 0) return "landlock_create_ruleset";
    for (size_t i = 0; i < s->n_rules; i++)
        if (syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, &s->rules[i], 0) != 0)
            return "landlock_add_rule (read-only path)";
    struct path_beneath own = {.allowed_access = s->own_rights, .parent_fd = open(".", O_PATH | O_CLOEXEC)};
    if (own.parent_fd < 0) return "open working directory";
    if (syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, &own, 0) != 0)
        return "landlock_add_rule (working directory)";
    if (syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0) return "landlock_restrict_self";
    close(own.parent_fd);
    close(ruleset);
    return NULL;
}

/* Give the child its own numpy global random stream: a random key, consumed from the start (as
   after numpy's own seeding), one syscall instead of numpy.random.seed()'s ~600 us of page copies. */
static int reseed_mt19937(void *state) {
    if (state == NULL) return 0;
    size_t want = MT19937_WORDS * sizeof(uint32_t), got = 0;
    while (got < want) {
        ssize_t n = getrandom((char *)state + got, want - got, 0);
        if (n < 0 && errno != EINTR) return -1;
        if (n > 0) got += (size_t)n;
    }
    *(int *)((uint32_t *)state + MT19937_WORDS) = MT19937_WORDS;
    return 0;
}

/* Isolate the just-forked child; NULL on success, else the step that failed (errno set). */
/* Give the forker this child's task-limit listener: slot and pid, with the fd. */
static int hand_over(int sock, int slot, int listener) {
    int32_t who[2] = {slot, (int32_t)getpid()};
    struct iovec iov = {.iov_base = who, .iov_len = sizeof who};
    union {
        char bytes[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t sent;
    while ((sent = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return sent == (ssize_t)sizeof who ? 0 : -1;
}

static const char *isolate(const struct setup *s, const char *workdir, int uid, int slot, const int fds[NFDS]) {
    static const struct rlimit no_core = {0, 0};
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the forker blocks SIGCHLD for its signalfd */
    prctl(PR_SET_NAME, (unsigned long)"sandbox-child", 0, 0, 0);
    /* First, so that a failure below reaches the worker on the control pipe. The fds arrive above
       4 (the forker keeps 0-4 taken): request -> 3, stdout -> 1, stderr -> 2, control -> 4. */
    if (dup2(fds[1], 1) < 0 || dup2(fds[2], 2) < 0 || dup2(fds[0], 3) < 0 || dup2(fds[3], 4) < 0)
        return "dup2";
    /* stdin: an empty memory file the request fills (receive); made here because the child's
       seccomp filter denies memfd_create (memfd pages escape RLIMIT_AS). */
    int stdin_fd = memfd_create("stdin", 0);
    if (stdin_fd < 0 || dup2(stdin_fd, 0) < 0) return "memfd_create (stdin)";
    close(stdin_fd);
    if (uid == 0 || (uid < 0 && geteuid() == 0)) {
        errno = EPERM;
        return "refusing to run sandboxed code as root (the server gives each child a uid when root)";
    }
    if (reseed_mt19937(s->mt19937) != 0) return "getrandom (numpy's random state)";
    if (setsid() < 0) return "setsid";
    if (chdir(workdir) != 0) return "chdir to the working directory";
    if (setrlimit(RLIMIT_CORE, &no_core) != 0) return "setrlimit(RLIMIT_CORE)";
    own_uid = uid >= 0;
    if (uid >= 0) {
        if (setgroups(0, NULL) != 0) return "setgroups";
        if (setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0) return "setresgid";
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) return "setresuid";
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return "prctl(PR_SET_PDEATHSIG)";
    if (getppid() != s->forker) _exit(1); /* the forker died while we were forking */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return "prctl(PR_SET_NO_NEW_PRIVS)";
    if (s->landlock_attr != NULL) {
        const char *failed = landlock(s);
        if (failed != NULL) return failed;
        /* Sharing the worker's uid (the pod), this process inherited its non-dumpable flag, so the
           worker, no root, could not read what it holds (/proc/PID/fd and maps: files deleted while
           open count against the disk budget). Dumpable again only under Landlock, which hides /proc
           from the siblings of the same uid (seccomp denies them ptrace, process_vm_readv and
           pidfd_getfd); RLIMIT_CORE is 0. */
        if (!own_uid && prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return "prctl(PR_SET_DUMPABLE)";
    }
    if (s->task_filter.len > 0) { /* first: the static filter may deny what the handover needs */
        int listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                                    &s->task_filter);
        if (listener < 0) return "seccomp (task limit)";
        if (hand_over(s->handoff, slot, listener) != 0) return "handing the task limit to the forker";
        close(listener);
    }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &s->static_filter, 0, 0) != 0)
        return "seccomp (static filter)";
    patch_self_filter(s, getpid());
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &s->self_filter, 0, 0) != 0)
        return "seccomp (self-only filter)";
    if (syscall(SYS_close_range, 5U, ~0U, 0) != 0) {
        long max = sysconf(_SC_OPEN_MAX);
        for (int fd = 5; fd < max; fd++) close(fd);
    }
    return NULL;
}

static long vm_bytes(const struct setup *s) {
    char text[64] = {0};
    if (pread(s->statm, text, sizeof text - 1, 0) <= 0) return 0;
    return strtol(text, NULL, 10) * s->page_size;
}

static void reply(int sock, int slot, int event, int status, double cpu) {
    char message[REPLY_SIZE];
    int32_t head[3] = {slot, event, status};
    memcpy(message, head, sizeof head);
    memcpy(message + sizeof head, &cpu, sizeof cpu);
    while (send(sock, message, sizeof message, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

static void signal_child(const struct child_state *child, int sig) {
    if (child->pid > 0) {
        kill(-child->pid, sig);
        kill(child->pid, sig);
    }
}

static void reap(int sock, int epoll, struct child_state *child, int slot) {
    int status = 0;
    struct rusage usage;
    if (child->pid <= 0) return;
    pid_t done = wait4(child->pid, &status, WNOHANG, &usage);
    if (done == 0 || (done < 0 && errno != ECHILD)) return; /* not yet; or try again on the next wake */
    if (done < 0) status = SIGKILL; /* gone without a status: report it as killed, never as ok */
    epoll_ctl(epoll, EPOLL_CTL_DEL, child->pidfd, NULL);
    close(child->pidfd);
    if (child->listener >= 0) close(child->listener); /* also leaves the epoll set */
    tasks_counted -= child->counted;
    child->counted = 0;
    child->pid = 0;
    child->pidfd = -1;
    child->listener = -1;
    double cpu = done < 0 ? 0.0
                          : (double)usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 +
                                (double)usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
    reply(sock, slot, EVENT_EXITED, status, cpu);
}

/* Children that stopped: a session's child stops itself (SIGSTOP) when its cell has ended, so the
   worker ends a cell only once the kernel says nothing of it runs any more. */
static void report_stops(int sock, int sigfd, const struct child_state *children, int slots) {
    struct signalfd_siginfo pending[16];
    while (read(sigfd, pending, sizeof pending) > 0) {
    }
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WSTOPPED | WNOHANG) != 0 || info.si_pid == 0) return;
        for (int slot = 0; slot < slots; slot++) {
            if (children[slot].pid == info.si_pid) {
                reply(sock, slot, EVENT_STOPPED, info.si_status, 0.0);
                break;
            }
        }
    }
}

/* Threads of a process, from /proc/<pid>/stat (field 20, after the parenthesised name); -1 if unknown. */
static int thread_count(pid_t pid) {
    char path[48], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return -1;
    text[n] = '\0';
    char *at = strrchr(text, ')');
    if (at == NULL) return -1;
    for (int field = 2; field < 20; field++) { /* ')' ends field 2; each space starts the next */
        at = strchr(at + 1, ' ');
        if (at == NULL) return -1;
    }
    return atoi(at + 1);
}

/* A child's clone(CLONE_THREAD) waits for this answer: go on while it has fewer threads than its call
   may run, else EAGAIN (Python: "can't start new thread"). Threads starting at the same instant in
   several threads of one child can each see the count before the others' clones: at most twice the
   limit, still bounded. */
/* Whether `more` tasks fit the budget; counts every child again before saying no (threads that
   ended are noticed only then). */
static int budget_allows(struct child_state *children, int slots, int more) {
    if (tasks_budget <= 0 || tasks_counted + more <= tasks_budget) return 1;
    tasks_counted = 0;
    for (int slot = 0; slot < slots; slot++) {
        if (children[slot].pid <= 0) continue;
        int now = thread_count(children[slot].pid);
        if (now >= 0) children[slot].counted = now;
        tasks_counted += children[slot].counted;
    }
    return tasks_counted + more <= tasks_budget;
}

/* A child's fair share of the budget, once it has run out: the budget over the children alive. Had
   every child held at most this, it would not have run out, so one refused while it holds this much
   is itself among those that used it up. */
static long fair_share(const struct child_state *children, int slots) {
    long alive = 0;
    for (int slot = 0; slot < slots; slot++) alive += children[slot].pid > 0;
    long share = tasks_budget / (alive > 0 ? alive : 1);
    return share > 1 ? share : 1;
}

static void answer_clone(int sock, struct child_state *children, int slots, int slot) {
    struct child_state *child = &children[slot];
    struct seccomp_notif request;
    struct seccomp_notif_resp answer;
    memset(&request, 0, sizeof request);
    if (ioctl(child->listener, SECCOMP_IOCTL_NOTIF_RECV, &request) != 0) return; /* e.g. the thread died */
    memset(&answer, 0, sizeof answer);
    answer.id = request.id;
    answer.error = -EAGAIN;
    int threads = thread_count(child->pid);
    if (threads >= 0) {
        tasks_counted += threads - child->counted;
        child->counted = threads;
    }
    if (threads >= 0 && threads < child->tasks) {
        if (budget_allows(children, slots, 1)) {
            answer.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
            answer.error = 0;
            child->counted++; /* counted before it runs: the budget is never overrun between counts */
            tasks_counted++;
        } else if (threads < fair_share(children, slots)) {
            reply(sock, slot, EVENT_PRESSED, 0, 0.0); /* refused for others' tasks: not its code's doing */
        } /* else it holds its fair share itself (its own threads): its code's doing, like its own limit */
    }
    if (ioctl(child->listener, SECCOMP_IOCTL_NOTIF_SEND, &answer) != 0 && errno == EINVAL && answer.flags) {
        answer.flags = 0; /* a kernel without SECCOMP_USER_NOTIF_FLAG_CONTINUE (< 5.5): refuse */
        answer.error = -EAGAIN;
        ioctl(child->listener, SECCOMP_IOCTL_NOTIF_SEND, &answer);
    }
}

/* Listeners handed over by children in set-up (hand_over); one that names no current child is closed. */
static void take_listeners(int handoff, int epoll, struct child_state *children, int slots) {
    for (;;) {
        int32_t who[2] = {-1, 0};
        union {
            char bytes[CMSG_SPACE(2 * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = who, .iov_len = sizeof who};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                             .msg_controllen = sizeof control.bytes};
        ssize_t got = recvmsg(handoff, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return;
        int fds[2], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < count && nfds < 2; i++) memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        int slot = who[0];
        int ours = got == (ssize_t)sizeof who && nfds == 1 && slot >= 0 && slot < slots && children[slot].pid == who[1] &&
                   children[slot].pid > 0 && children[slot].listener < 0;
        uint64_t generation = (uint64_t)(ours ? children[slot].generation & GENERATION_MASK : 0);
        struct epoll_event clones = {.events = EPOLLIN, .data.u64 = WATCH_LISTENER | generation << 33 | (uint64_t)slot};
        if (ours && epoll_ctl(epoll, EPOLL_CTL_ADD, fds[0], &clones) == 0) {
            children[slot].listener = fds[0];
            continue;
        }
        for (int i = 0; i < nfds; i++) close(fds[i]);
    }
}

static PyObject *spawned(const char *workdir, long vm, const char *failed) {
    if (failed == NULL) return Py_BuildValue("(ylO)", workdir, vm, Py_None);
    return Py_BuildValue("(yls)", workdir, vm, failed);
}

/* The forker's state between events. */
struct forker {
    struct setup s;
    int sock, epoll, slots;
    struct child_state *children;
    char message[4096 + 16]; /* a spawn's workdir stays here for the child that forks from it */
};

/* Messages from the worker: spawn, kill, continue, limit. Returns 0 when drained, 1 when the worker
   is gone, 2 in a newly forked child (then *child_workdir, *child_vm and *child_failed are set). */
static int from_worker(struct forker *f, const char **child_workdir, long *child_vm, const char **child_failed) {
    union { /* aligned for cmsghdr; room for more fds than expected, so extras are seen and closed */
        char bytes[CMSG_SPACE(2 * NFDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct child_state *children = f->children;
    for (;;) {
        struct iovec iov = {.iov_base = f->message, .iov_len = sizeof f->message - 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                             .msg_controllen = sizeof control.bytes};
        ssize_t got = recvmsg(f->sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return 0; /* EAGAIN: drained */
        if (got == 0) return 1; /* the worker is gone */
        int fds[2 * NFDS], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < count && nfds < 2 * NFDS; i++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        int32_t head[3] = {0, -1, -1};
        memcpy(head, f->message, got < 12 ? (size_t)got : sizeof head);
        int slot = head[1];
        f->message[got] = '\0';
        const char *workdir = f->message + sizeof head;
        int well_formed = !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && slot >= 0 && slot < f->slots;
        int spawnable = well_formed && head[0] == OP_SPAWN && got > (ssize_t)sizeof head && nfds == NFDS &&
                        children[slot].pid == 0;
        if (!spawnable) {
            for (int i = 0; i < nfds; i++) close(fds[i]);
            if (well_formed && head[0] == OP_KILL) signal_child(&children[slot], SIGKILL);
            else if (well_formed && head[0] == OP_CONT && children[slot].pid > 0)
                kill(-children[slot].pid, SIGCONT); /* once: a second could undo the stop that ends a quick cell */
            else if (well_formed && head[0] == OP_LIMIT && got >= (ssize_t)sizeof head && children[slot].pid > 0)
                children[slot].tasks = head[2];
            else if (well_formed && head[0] == OP_SPAWN && children[slot].pid == 0)
                reply(f->sock, slot, EVENT_FORK_FAILED, EINVAL, 0.0);
            continue; /* the rest the worker never sends: nothing to answer for */
        }
        if (!budget_allows(children, f->slots, 1)) {
            for (int i = 0; i < NFDS; i++) close(fds[i]);
            reply(f->sock, slot, EVENT_FORK_FAILED, EAGAIN, 0.0);
            continue;
        }
        long vm = vm_bytes(&f->s);
        pid_t pid = fork();
        if (pid == 0) {
            *child_failed = isolate(&f->s, workdir, head[2], slot, fds);
            *child_workdir = workdir;
            *child_vm = vm;
            return 2;
        }
        int fork_errno = errno;
        for (int i = 0; i < NFDS; i++) close(fds[i]);
        int pidfd = pid < 0 ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
        struct epoll_event exited = {.events = EPOLLIN, .data.u64 = (uint64_t)slot};
        if (pid > 0 && pidfd >= 0 && epoll_ctl(f->epoll, EPOLL_CTL_ADD, pidfd, &exited) == 0) {
            children[slot] = (struct child_state){.pid = pid, .pidfd = pidfd, .listener = -1, .tasks = 1, .counted = 1,
                                                  .generation = children[slot].generation + 1};
            tasks_counted++;
            continue;
        }
        if (pid > 0) { /* cannot watch it: kill it and report it as it ends */
            int status = 0;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            if (pidfd >= 0) close(pidfd);
            reply(f->sock, slot, EVENT_EXITED, status, 0.0);
        } else {
            reply(f->sock, slot, EVENT_FORK_FAILED, fork_errno, 0.0);
        }
    }
}

static PyObject *serve(PyObject *Py_UNUSED(module), PyObject *args) {
    int sock, slots;
    Py_buffer static_bpf, self_bpf, task_bpf, attr, rules;
    unsigned int self_placeholder, group_placeholder;
    unsigned long long own_rights, mt19937;
    long budget;
    if (!PyArg_ParseTuple(args, "iily*y*y*IIy*y*KK", &sock, &slots, &budget, &static_bpf, &self_bpf, &task_bpf,
                          &self_placeholder, &group_placeholder, &attr, &rules, &own_rights, &mt19937))
        return NULL;
    tasks_budget = budget;
    int attr_given = attr.len > 0;
    static struct forker f; /* static: a forked child returns from serve with its workdir in here */
    f.sock = sock;
    f.slots = slots;
    f.s = (struct setup){
        .static_filter = {.len = (unsigned short)(static_bpf.len / sizeof(struct sock_filter)),
                          .filter = copy_bytes(&static_bpf)},
        .self_filter = {.len = (unsigned short)(self_bpf.len / sizeof(struct sock_filter)),
                        .filter = copy_bytes(&self_bpf)},
        .task_filter = {.len = (unsigned short)(task_bpf.len / sizeof(struct sock_filter)),
                        .filter = copy_bytes(&task_bpf)},
        .handoff = -1,
        .self_placeholder = self_placeholder,
        .group_placeholder = group_placeholder,
        .landlock_attr = attr_given ? copy_bytes(&attr) : NULL,
        .landlock_attr_size = (size_t)attr.len,
        .rules = copy_bytes(&rules),
        .n_rules = (size_t)rules.len / sizeof(struct path_beneath),
        .own_rights = own_rights,
        .mt19937 = (void *)(uintptr_t)mt19937,
        .forker = getpid(),
        .statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC),
        .page_size = sysconf(_SC_PAGESIZE),
    };
    struct setup *s = &f.s;
    int bad_filter = static_bpf.len % sizeof(struct sock_filter) || self_bpf.len % sizeof(struct sock_filter) ||
                     task_bpf.len % sizeof(struct sock_filter) ||
                     static_bpf.len / sizeof(struct sock_filter) > BPF_MAXINSNS ||
                     self_bpf.len / sizeof(struct sock_filter) > BPF_MAXINSNS ||
                     task_bpf.len / sizeof(struct sock_filter) > BPF_MAXINSNS;
    PyBuffer_Release(&static_bpf);
    PyBuffer_Release(&self_bpf);
    PyBuffer_Release(&task_bpf);
    PyBuffer_Release(&attr);
    PyBuffer_Release(&rules);
    if (bad_filter) return PyErr_Format(PyExc_ValueError, "a seccomp filter is not a whole BPF program");
    if (s->static_filter.filter == NULL || s->self_filter.filter == NULL || s->task_filter.filter == NULL ||
        s->rules == NULL || (attr_given && s->landlock_attr == NULL))
        return PyErr_NoMemory();
    /* an inherited SIG_IGN would reap children behind our back (and lose their status); blocked,
       SIGCHLD is read from a signalfd, which tells when a child stopped (exits come on pidfds) */
    signal(SIGCHLD, SIG_DFL);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    int handoff[2] = {-1, -1};
    if (s->task_filter.len > 0 && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, handoff) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    s->handoff = handoff[1];
    f.children = PyMem_RawCalloc((size_t)slots, sizeof *f.children);
    f.epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event watch = {.events = EPOLLIN, .data.u64 = WATCH_SOCKET};
    struct epoll_event stops = {.events = EPOLLIN, .data.u64 = WATCH_SIGCHLD};
    struct epoll_event listeners = {.events = EPOLLIN, .data.u64 = WATCH_HANDOFF};
    if (f.children == NULL || f.epoll < 0 || s->statm < 0 || sigfd < 0 ||
        epoll_ctl(f.epoll, EPOLL_CTL_ADD, sock, &watch) != 0 || epoll_ctl(f.epoll, EPOLL_CTL_ADD, sigfd, &stops) != 0 ||
        (handoff[0] >= 0 && epoll_ctl(f.epoll, EPOLL_CTL_ADD, handoff[0], &listeners) != 0))
        return PyErr_SetFromErrno(PyExc_OSError);
    for (int slot = 0; slot < slots; slot++) f.children[slot].listener = -1;

    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(f.epoll, events, 64, -1);
        if (n < 0 && errno != EINTR) return PyErr_SetFromErrno(PyExc_OSError);
        for (int e = 0; e < n; e++) {
            uint64_t what = events[e].data.u64;
            if (what == WATCH_SIGCHLD) {
                report_stops(sock, sigfd, f.children, slots);
            } else if (what == WATCH_HANDOFF) {
                take_listeners(handoff[0], f.epoll, f.children, slots);
            } else if (what & WATCH_LISTENER && what != WATCH_SOCKET) {
                struct child_state *child = &f.children[what & 0xFFFFFFFFu];
                /* an event of an earlier child's listener, returned with its slot's exit: closing or
                   reading the current child's listener for it would fail (ENOSYS) or block its clones */
                if (child->listener < 0 || ((what >> 33) & GENERATION_MASK) != (child->generation & GENERATION_MASK))
                    continue;
                if (!(events[e].events & EPOLLIN)) { /* its last task is gone (reaped next) */
                    close(child->listener);
                    child->listener = -1;
                    continue;
                }
                const char *workdir = NULL, *failed = NULL;
                long vm = 0;
                /* its call's limit first: the worker sends it before the code, so it is queued */
                int state = from_worker(&f, &workdir, &vm, &failed);
                if (state == 1) Py_RETURN_NONE;
                if (state == 2) return spawned(workdir, vm, failed);
                if (child->listener >= 0) answer_clone(sock, f.children, slots, (int)(what & 0xFFFFFFFFu));
            } else if (what != WATCH_SOCKET) {
                reap(sock, f.epoll, &f.children[what], (int)what);
            } else {
                const char *workdir = NULL, *failed = NULL;
                long vm = 0;
                int state = from_worker(&f, &workdir, &vm, &failed);
                if (state == 1) Py_RETURN_NONE;
                if (state == 2) return spawned(workdir, vm, failed);
            }
        }
    }
}

/* Read exactly `size` bytes: 1 done, 0 end of file first, -1 error. */
static int read_exact(int fd, char *buffer, size_t size) {
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buffer + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) return got == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return 1;
}

static int set_limit(int resource, rlim_t value) {
    struct rlimit limit = {value, value};
    return setrlimit(resource, &limit);
}

/* Per-call limits: memory on top of the inherited image, CPU seconds on top of what this
   (pre-forked) process used before the call (soft limit: SIGXCPU, hard a second later). */
static int apply_limits(const struct request *r, long long vm_bytes) {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
    double used = (double)usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + (double)usage.ru_stime.tv_sec +
                  usage.ru_stime.tv_usec / 1e6;
    double budget = used + r->timeout_seconds;
    rlim_t cpu = (rlim_t)budget + ((double)(rlim_t)budget < budget) + 1; /* ceil + 1 */
    struct rlimit cpu_limit = {cpu, cpu + 1};
    if (setrlimit(RLIMIT_CPU, &cpu_limit) != 0) return -1;
    if (set_limit(RLIMIT_AS, (rlim_t)vm_bytes + ((rlim_t)r->memory_mib << 20)) != 0) return -1;
    if (set_limit(RLIMIT_FSIZE, (rlim_t)r->file_size_mib << 20) != 0) return -1;
    /* Deep recursion through C (sys.setrecursionlimit raised) overflows the usual 8 MiB main
       stack at ~20,000 levels with a segfault; the stack counts in RLIMIT_AS anyway. */
    struct rlimit stack;
    if (getrlimit(RLIMIT_STACK, &stack) != 0) return -1;
    stack.rlim_cur = stack.rlim_max == RLIM_INFINITY || stack.rlim_max > STACK_BYTES ? STACK_BYTES : stack.rlim_max;
    if (setrlimit(RLIMIT_STACK, &stack) != 0) return -1;
    if (set_limit(RLIMIT_NOFILE, r->open_files) != 0) return -1;
    return own_uid ? set_limit(RLIMIT_NPROC, r->processes) : 0;
}

/* Fill the memory file on fd 0 (made in isolate) with this request's stdin, from the start. A
   session's code may have replaced fd 0: then an empty stdin is simply not set. */
static int stdin_from(const char *text, size_t size) {
    if (ftruncate(0, 0) != 0 || lseek(0, 0, SEEK_SET) != 0) return size ? -1 : 0;
    for (size_t done = 0; done < size;) {
        ssize_t n = write(0, text + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        done += (size_t)n;
    }
    return lseek(0, 0, SEEK_SET) == 0 ? 0 : -1;
}

/* The program on disk in the working directory, as `python main.py` has it (inspect, linecache and
   the interpreter's own traceback printer read it there). Written before the limits apply: the
   file-size limit is the program's, not its source's. */
static int write_program(const char *name, const char *code, size_t size) {
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, code + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    return close(fd);
}

static PyObject *receive(PyObject *Py_UNUSED(module), PyObject *args) {
    int fd;
    long long vm_bytes;
    const char *program;
    if (!PyArg_ParseTuple(args, "iLy", &fd, &vm_bytes, &program)) return NULL;
    struct request r;
    int got = read_exact(fd, (char *)&r, sizeof r);
    if (got == 0) Py_RETURN_NONE;
    size_t size = (size_t)r.stdin_bytes + r.code_bytes;
    char *body = got < 0 ? NULL : PyMem_RawMalloc(size ? size : 1);
    if (body == NULL || read_exact(fd, body, size) != 1) {
        PyMem_RawFree(body);
        return PyErr_Format(PyExc_OSError, "the request pipe ended inside a request");
    }
    const char *failed = NULL; /* stdin first: the program's own limits must not fail the set-up */
    if ((r.stdin_bytes || r.mode == MODE_EXEC) && stdin_from(body, r.stdin_bytes) != 0) failed = "stdin";
    else if (r.mode == MODE_RUN && write_program(program, body + r.stdin_bytes, r.code_bytes) != 0) failed = program;
    else if (r.mode != MODE_EXEC && apply_limits(&r, vm_bytes) != 0) failed = "setrlimit";
    PyObject *result = NULL;
    if (failed != NULL) PyErr_SetFromErrnoWithFilename(PyExc_OSError, failed);
    else result = Py_BuildValue("(IN)", r.mode, PyUnicode_DecodeUTF8(body + r.stdin_bytes, r.code_bytes,
                                                                      "surrogatepass"));
    PyMem_RawFree(body);
    return result;
}

/* Make the caller's frame count as `depth` frames deep for the recursion limit; returns how deep
   it counted before. The program's module frame then has the headroom it has in a fresh
   interpreter, not that less the worker's and the child's own frames below it. */
static PyObject *recursion_depth(PyObject *Py_UNUSED(module), PyObject *args) {
    int depth;
    if (!PyArg_ParseTuple(args, "i", &depth)) return NULL;
    PyThreadState *ts = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030C0000
    int before = ts->py_recursion_limit - ts->py_recursion_remaining;
    ts->py_recursion_remaining = ts->py_recursion_limit - depth;
#else
    int before = ts->recursion_limit - ts->recursion_remaining;
    ts->recursion_remaining = ts->recursion_limit - depth;
#endif
    return PyLong_FromLong(before);
}

/* End the process as the C library's exit() would after the interpreter's finalization: C stdio
   buffers flushed (a program's printf through ctypes), no atexit handlers of the C library, no
   destructors of the worker's heap. */
static PyObject *exit_flushed(PyObject *Py_UNUSED(module), PyObject *args) {
    int code;
    if (!PyArg_ParseTuple(args, "i", &code)) return NULL;
    fflush(NULL);
    _exit(code);
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS,
     "serve(sock, slots, task_budget, static_bpf, self_bpf, task_bpf, self_placeholder, group_placeholder, "
     "landlock_attr, landlock_rules, own_rights, mt19937_state_address): the forker loop; returns None when the worker "
     "is gone, or in a forked child (workdir, vm_bytes, error)."},
    {"receive", receive, METH_VARARGS,
     "receive(fd, vm_bytes, program): a child's next request as (mode, code), None at end of file; "
     "for a new program also writes its code to the file `program` and sets its limits and stdin."},
    {"recursion_depth", recursion_depth, METH_VARARGS,
     "recursion_depth(depth): count the caller's frame as `depth` deep for the recursion limit; "
     "returns its depth before."},
    {"exit_flushed", exit_flushed, METH_VARARGS, "exit_flushed(code): flush C stdio, then _exit(code)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_spawner", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__spawner(void) { return PyModule_Create(&module); }
