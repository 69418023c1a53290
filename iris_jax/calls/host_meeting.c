/* Where the simulator's collective calls meet, in C (iris_jax/calls/host_meeting.py says what and why).
 *
 * XLA calls the handler on each CPU device's own thread. A member that is not the last to arrive
 * records its buffers and waits here without the GIL; the last one calls into Python once to do
 * the whole call (host_collectives, on every member's buffers) and wakes the others. Python is
 * also called to read a group row the first time a (site, rank) sees it and to word an error.
 *
 * Calls pair by their number in the group's sequence (per member), a member that does not arrive
 * within the site's timeout fails the group, and a failed group fails every later call at once,
 * as iris_core.sim.host_collectives.Rendezvous does in Python.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xla_ffi.h"

/* a meeting's state, a member's outcome (host_meeting.py's) */
enum { PENDING = 0, DONE = 1, TIMED_OUT = 2, CLOSED = 3, FAILED = 4, UNRESOLVED = 5, ERROR = 6 };
enum { MESSAGE_BYTES = 16384 };

typedef struct Place Place;
typedef struct Row { struct Row *next; int64_t rank; unsigned char *raw; struct Group *group; int index; } Row;

typedef struct Site {  /* one call site, registered when lowered (never freed: a program may outlive its runtime) */
    Place *place;
    int64_t id;        /* host_meeting.py's key */
    int members;       /* G */
    int row_bytes;
    double timeout_s;
    Row *rows;         /* the group rows seen, by rank */
} Site;

typedef struct Group {
    struct Group *next;
    uint64_t key;
    int members, failed;
    int64_t *counts;   /* calls made, by member */
    int64_t *ranks;    /* members' global ranks */
    int64_t failed_rank, waited_for;
} Group;

typedef struct Member { Site *site; int64_t rank; int nargs, nrets, status; void **pointers; } Member;

typedef struct Meeting {
    struct Meeting *next;
    Group *group;
    int64_t number;
    int arrived, left, state, linked;
    int64_t missing;   /* TIMED_OUT: the rank that never came */
    pthread_cond_t wake;
    Member member[];
} Meeting;

struct Place { pthread_mutex_t lock; Group *groups; Meeting *meetings; int closed; };

/* Python: reads a group row (writes key, index and the members' ranks to `out`; 0: done) */
typedef int (*Resolver)(int64_t site, int64_t rank, const void *row, int64_t *out);
typedef void (*Completer)(Meeting *meeting);  /* does the call, sets each member's status */
/* words why member `rank` at `site` failed: its outcome, the peer named, the call's number, and for ERROR the
 * meeting's address (only a key: the meeting may be gone) */
typedef void (*Describer)(int status, int64_t site, int64_t rank, int64_t peer, int64_t number, int64_t meeting,
                          char *message, size_t size);

static Resolver resolver;
static Completer completer;
static Describer describer;

void iris_meet_start(Resolver resolve, Completer complete, Describer describe) {
    resolver = resolve;
    completer = complete;
    describer = describe;
}

Place *iris_meet_place(void) {
    Place *place = calloc(1, sizeof(Place));
    pthread_mutex_init(&place->lock, NULL);
    return place;
}

Site *iris_meet_site(Place *place, int64_t id, int members, int row_bytes, double timeout_s) {
    Site *site = calloc(1, sizeof(Site));
    site->place = place;
    site->id = id;
    site->members = members;
    site->row_bytes = row_bytes;
    site->timeout_s = timeout_s;
    return site;
}

/* Member `index` of a meeting as Python reads it: [site id, rank, nargs, nrets, pointers...]. */
int iris_meet_member(Meeting *meeting, int index, int64_t *out) {
    Member *m = &meeting->member[index];
    out[0] = m->site->id;
    out[1] = m->rank;
    out[2] = m->nargs;
    out[3] = m->nrets;
    for (int i = 0; i < m->nargs + m->nrets; i++) out[4 + i] = (int64_t)(intptr_t)m->pointers[i];
    return meeting->group->members;
}

int64_t iris_meet_number(Meeting *meeting) { return meeting->number; }

void iris_meet_set_status(Meeting *meeting, int index, int status) { meeting->member[index].status = status; }

/* Every call of the group fails from now on (call under the place's lock). */
static void fail_group(Place *place, Group *group, int64_t rank, int64_t waited_for, int state) {
    if (!group->failed) {
        group->failed = 1;
        group->failed_rank = rank;
        group->waited_for = waited_for;
    }
    for (Meeting **at = &place->meetings; *at;) {
        Meeting *m = *at;
        if (m->group != group) { at = &m->next; continue; }
        *at = m->next;
        m->linked = 0;
        m->state = state;
        int absent = 0;  /* the meeting's first member that did not come: its waiters name it */
        while (absent < group->members && m->member[absent].site) absent++;
        m->missing = absent < group->members ? group->ranks[absent] : waited_for;
        pthread_cond_broadcast(&m->wake);
    }
}

/* A mismatch the last member found: the group fails (rank gave up on waited_for), and its members
 * waiting in other calls time out. */
void iris_meet_fail_group(Meeting *meeting, int64_t rank, int64_t waited_for) {
    Place *place = meeting->member[0].site->place;
    pthread_mutex_lock(&place->lock);
    fail_group(place, meeting->group, rank, waited_for, TIMED_OUT);
    pthread_mutex_unlock(&place->lock);
}

/* The runtime shut down: every call waiting fails, and every later one. */
void iris_meet_close(Place *place) {
    pthread_mutex_lock(&place->lock);
    place->closed = 1;
    for (Meeting *m = place->meetings; m; m = m->next) {
        m->linked = 0;
        m->state = CLOSED;
        pthread_cond_broadcast(&m->wake);
    }
    place->meetings = NULL;
    pthread_mutex_unlock(&place->lock);
}

/* Rank's group row at `site`: its group and place in it, read by Python the first time (lock held;
 * NULL: Python could not read it). */
static Row *row_of(Site *site, int64_t rank, const unsigned char *raw) {
    Place *place = site->place;
    for (Row *r = site->rows; r; r = r->next)
        if (r->rank == rank && !memcmp(r->raw, raw, site->row_bytes)) return r;
    int64_t *out = malloc(sizeof(int64_t) * (2 + site->members));
    pthread_mutex_unlock(&place->lock);
    int failed = resolver(site->id, rank, raw, out);
    pthread_mutex_lock(&place->lock);
    if (failed) { free(out); return NULL; }
    Group *group = place->groups;
    while (group && group->key != (uint64_t)out[0]) group = group->next;
    if (!group) {
        group = calloc(1, sizeof(Group));
        group->key = (uint64_t)out[0];
        group->members = site->members;
        group->counts = calloc(site->members, sizeof(int64_t));
        group->ranks = malloc(sizeof(int64_t) * site->members);
        memcpy(group->ranks, out + 2, sizeof(int64_t) * site->members);
        group->next = place->groups;
        place->groups = group;
    }
    Row *r = calloc(1, sizeof(Row));
    r->rank = rank;
    r->raw = malloc(site->row_bytes);
    memcpy(r->raw, raw, site->row_bytes);
    r->group = group;
    r->index = (int)out[1];
    r->next = site->rows;
    site->rows = r;
    free(out);
    return r;
}

static Meeting *meeting_of(Place *place, Group *group, int64_t number) {
    for (Meeting *m = place->meetings; m; m = m->next)
        if (m->group == group && m->number == number) return m;
    Meeting *m = calloc(1, sizeof(Meeting) + sizeof(Member) * group->members);
    m->group = group;
    m->number = number;
    m->linked = 1;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &attr);
    pthread_condattr_destroy(&attr);
    m->next = place->meetings;
    place->meetings = m;
    return m;
}

static void unlink_meeting(Place *place, Meeting *meeting) {
    for (Meeting **at = &place->meetings; *at; at = &(*at)->next)
        if (*at == meeting) { *at = meeting->next; break; }
    meeting->linked = 0;
}

/* Leaves `meeting` (lock held); the last member to leave frees it. */
static void leave(Meeting *meeting) {
    if (++meeting->left < meeting->arrived || meeting->linked) return;
    for (int i = 0; i < meeting->group->members; i++) free(meeting->member[i].pointers);
    pthread_cond_destroy(&meeting->wake);
    free(meeting);
}

static void *failure(CallFrame *frame, int status, Site *site, int64_t rank, int64_t peer, int64_t number,
                     int64_t meeting) {
    static __thread char message[MESSAGE_BYTES];  /* XLA copies it */
    message[0] = 0;
    describer(status, site->id, rank, peer, number, meeting, message, sizeof(message));
    return ffi_error(frame, message[0] ? message : "iris: a collective call failed");
}

static void *meet(CallFrame *frame) {
    Site *site = (Site *)(intptr_t)*(int64_t *)((Scalar *)frame->attrs.values[0])->value;
    Place *place = site->place;
    int64_t rank = *(int64_t *)frame->args.values[0]->data;
    pthread_mutex_lock(&place->lock);
    if (place->closed) {
        pthread_mutex_unlock(&place->lock);
        return failure(frame, CLOSED, site, rank, -1, -1, 0);
    }
    Row *row = row_of(site, rank, frame->args.values[1]->data);
    if (!row) {
        pthread_mutex_unlock(&place->lock);
        return failure(frame, UNRESOLVED, site, rank, -1, -1, 0);
    }
    Group *group = row->group;
    int64_t number = group->counts[row->index]++;
    if (group->failed) {
        int64_t peer = group->failed_rank != rank ? group->failed_rank : group->waited_for;
        pthread_mutex_unlock(&place->lock);
        return failure(frame, FAILED, site, rank, peer, number, 0);
    }
    Meeting *meeting = meeting_of(place, group, number);
    Member *me = &meeting->member[row->index];
    int nargs = (int)frame->args.size, nrets = (int)frame->rets.size;
    me->site = site;
    me->rank = rank;
    me->nargs = nargs;
    me->nrets = nrets;
    me->pointers = malloc(sizeof(void *) * (nargs + nrets));
    for (int i = 0; i < nargs; i++) me->pointers[i] = frame->args.values[i]->data;
    for (int i = 0; i < nrets; i++) me->pointers[nargs + i] = frame->rets.values[i]->data;
    if (++meeting->arrived == group->members) {
        unlink_meeting(place, meeting);
        for (int i = 0; i < group->members; i++) meeting->member[i].status = ERROR;  /* until Python says */
        pthread_mutex_unlock(&place->lock);
        completer(meeting);  /* (Python, under the GIL: the whole call, every member's status set) */
        pthread_mutex_lock(&place->lock);
        meeting->state = DONE;
        pthread_cond_broadcast(&meeting->wake);
    } else {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        double whole = (double)deadline.tv_sec + site->timeout_s;
        deadline.tv_sec = (time_t)whole;
        deadline.tv_nsec += (long)((whole - (double)deadline.tv_sec) * 1e9);
        if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
        while (meeting->state == PENDING) {
            if (pthread_cond_timedwait(&meeting->wake, &place->lock, &deadline) != ETIMEDOUT) continue;
            if (meeting->state != PENDING || meeting->arrived == group->members) {
                /* every member came: the last one is at work, wait for it */
                while (meeting->state == PENDING) pthread_cond_wait(&meeting->wake, &place->lock);
                break;
            }
            int missing = 0;
            while (meeting->member[missing].site) missing++;
            fail_group(place, group, rank, group->ranks[missing], TIMED_OUT);
        }
    }
    int status = meeting->state == DONE ? me->status : meeting->state;
    int64_t peer = meeting->missing, key = (int64_t)(intptr_t)meeting;
    leave(meeting);
    pthread_mutex_unlock(&place->lock);
    return status == DONE ? NULL : failure(frame, status, site, rank, peer, number, key);
}

void *iris_host_meeting(CallFrame *frame) {
    if (answered_metadata(frame, NO_TRAITS)) return NULL;
    if (frame->stage != EXECUTE) return NULL;
    return meet(frame);
}
