/* Where the simulator's collective calls meet, in C (iris_jax/calls/host_meeting.py says what and why).
 *
 * XLA calls the handler on each CPU device's own thread. A member that is not the last to arrive
 * records its buffers and waits here without the GIL; the last one does the whole call for every
 * member and wakes the others: here, for the calls a site's plan covers (copies, and sums in the
 * types below, as iris_core.sim.host_collectives combines them: member order, in the accumulator,
 * rounded once), with the members' call records written as iris_core.sim.call_table writes them;
 * otherwise in Python, entered once. Python is also called to read a group row the first time a
 * (site, rank) sees it and to word an error.
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
enum { PENDING = 0, DONE = 1, TIMED_OUT = 2, CLOSED = 3, FAILED = 4, UNRESOLVED = 5, ERROR = 6,
       SHARED = 7 /* (every member doing its part of a planned call) */ };
enum { MESSAGE_BYTES = 16384 };

/* the types of a site's plan (host_meeting.py's); its kinds and ops are iris_core.collectives.kinds' (-D flags
 * at build time, as the call table's layout) */
enum { NO_PLAN = 0, F32 = 1, BF16 = 2, I32 = 3, BYTES = 4 };
enum { CHUNK = 2048 };  /* elements combined per pass: the accumulator stays in cache */
/* a planned call reading or writing this many bytes per member is shared out: every member does its part
 * (two cores copy twice as fast as one); below it, the last member does it all (no second meeting) */
enum { SHARED_BYTES = 1 << 20 };

typedef struct Place Place;
typedef struct Counter { struct Counter *next; uint64_t key; int64_t rank, count; } Counter;
typedef struct Row {
    struct Row *next;
    int64_t rank;
    unsigned char *raw;
    struct Group *group;
    int index;
    char *records;      /* rank's call table (NULL: none) */
    Counter *counter;   /* its calls of the group, as the call table numbers them */
} Row;

typedef struct Plan {   /* what the last member does here (type NO_PLAN: Python does it) */
    int kind, op, type, in_blocks, out_blocks;
    int64_t in_bytes, out_bytes;
    int64_t *sources;   /* PPERMUTE / BROADCAST: each member's source member (-1: zeros) */
} Plan;

typedef struct Site {  /* one call site, registered when lowered (never freed: a program may outlive its runtime) */
    Place *place;
    int64_t id;        /* host_meeting.py's key */
    int members;       /* G */
    int row_bytes;
    double timeout_s;
    Row *rows;         /* the group rows seen, by rank */
    int64_t signature, site;  /* what its call records say */
    char text[TEXT_BYTES];
    Plan plan;
} Site;

typedef struct Group {
    struct Group *next;
    uint64_t key;
    int members, failed;
    int64_t *counts;   /* calls made, by member */
    int64_t *ranks;    /* members' global ranks */
    int64_t failed_rank, waited_for;
} Group;

typedef struct Member { Site *site; Row *row; int64_t rank; int nargs, nrets, status; void **pointers; } Member;

typedef struct Meeting {
    struct Meeting *next;
    Group *group;
    int64_t number;
    int arrived, left, state, linked, finished;
    int64_t missing;   /* TIMED_OUT: the rank that never came */
    pthread_cond_t wake;
    Member member[];
} Meeting;

struct Place { pthread_mutex_t lock; Group *groups; Meeting *meetings; Counter *counters; int closed; };

/* Python: reads a group row (writes key, index, the call table's address and the members' ranks to `out`;
 * 0: done) */
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

/* `plan`: kind, op, type, in_blocks, out_blocks, in_bytes, out_bytes, then `members` sources */
Site *iris_meet_site(Place *place, int64_t id, int members, int row_bytes, double timeout_s, int64_t signature,
                     int64_t site_digest, const char *text, const int64_t *plan) {
    Site *site = calloc(1, sizeof(Site));
    site->place = place;
    site->id = id;
    site->members = members;
    site->row_bytes = row_bytes;
    site->timeout_s = timeout_s;
    site->signature = signature;
    site->site = site_digest;
    memcpy(site->text, text, TEXT_BYTES);
    Plan *p = &site->plan;
    p->kind = (int)plan[0];
    p->op = (int)plan[1];
    p->type = (int)plan[2];
    p->in_blocks = (int)plan[3];
    p->out_blocks = (int)plan[4];
    p->in_bytes = plan[5];
    p->out_bytes = plan[6];
    p->sources = malloc(sizeof(int64_t) * members);
    memcpy(p->sources, plan + 7, sizeof(int64_t) * members);
    return site;
}

/* The number of rank's next call of group `key` in its call table (lock held). */
static Counter *counter_of(Place *place, uint64_t key, int64_t rank) {
    for (Counter *c = place->counters; c; c = c->next)
        if (c->key == key && c->rank == rank) return c;
    Counter *c = calloc(1, sizeof(Counter));
    c->key = key;
    c->rank = rank;
    c->next = place->counters;
    place->counters = c;
    return c;
}

/* The call table's numbering (iris_core.sim.call_table.CallTable.count_with): rank's next call of `key`. */
int64_t iris_meet_next_record(Place *place, uint64_t key, int64_t rank) {
    pthread_mutex_lock(&place->lock);
    int64_t number = counter_of(place, key, rank)->count++;
    pthread_mutex_unlock(&place->lock);
    return number;
}

void iris_meet_seed(Place *place, uint64_t key, int64_t rank, int64_t count) {
    pthread_mutex_lock(&place->lock);
    counter_of(place, key, rank)->count = count;
    pthread_mutex_unlock(&place->lock);
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
    int64_t *out = malloc(sizeof(int64_t) * (3 + site->members));
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
        memcpy(group->ranks, out + 3, sizeof(int64_t) * site->members);
        group->next = place->groups;
        place->groups = group;
    }
    Row *r = calloc(1, sizeof(Row));
    r->rank = rank;
    r->raw = malloc(site->row_bytes);
    memcpy(r->raw, raw, site->row_bytes);
    r->group = group;
    r->index = (int)out[1];
    r->records = (char *)(intptr_t)out[2];
    r->counter = counter_of(place, group->key, rank);
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

/* -- the last member's work, where the site's plan covers it ------------------------------------------ */
static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf16(float f) {  /* round to nearest even; a NaN keeps its sign only (as ml_dtypes) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16 & 0x8000u) | 0x7fc0u);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

/* Elements [0, n) of the G `inputs` combined in member order, into each of the `outputs`. */
static void combine(const Plan *p, char **inputs, int G, int64_t n, char **outputs, int outs) {
    for (int64_t c = 0; c < n; c += CHUNK) {
        int64_t len = n - c < CHUNK ? n - c : CHUNK;
        if (p->type == I32) {
            int32_t acc[CHUNK];
            memcpy(acc, inputs[0] + 4 * c, 4 * len);
            for (int k = 1; k < G; k++) {
                const int32_t *x = (const int32_t *)inputs[k] + c;
                for (int64_t i = 0; i < len; i++) {
                    if (p->op == SUM) acc[i] = (int32_t)((uint32_t)acc[i] + (uint32_t)x[i]);  /* wraps */
                    else if (p->op == MAX) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
                    else acc[i] = x[i] < acc[i] ? x[i] : acc[i];
                }
            }
            for (int o = 0; o < outs; o++) memcpy(outputs[o] + 4 * c, acc, 4 * len);
            continue;
        }
        float acc[CHUNK];  /* F32 and BF16 sums: in float32, rounded once */
        if (p->type == F32) memcpy(acc, inputs[0] + 4 * c, 4 * len);
        else for (int64_t i = 0; i < len; i++) acc[i] = from_bf16(((const uint16_t *)inputs[0])[c + i]);
        for (int k = 1; k < G; k++) {
            if (p->type == F32) {
                const float *x = (const float *)inputs[k] + c;
                for (int64_t i = 0; i < len; i++) acc[i] = acc[i] + x[i];
            } else {
                const uint16_t *x = (const uint16_t *)inputs[k] + c;
                for (int64_t i = 0; i < len; i++) acc[i] = acc[i] + from_bf16(x[i]);
            }
        }
        for (int o = 0; o < outs; o++) {
            if (p->type == F32) memcpy(outputs[o] + 4 * c, acc, 4 * len);
            else for (int64_t i = 0; i < len; i++) ((uint16_t *)outputs[o])[c + i] = to_bf16(acc[i]);
        }
    }
}

/* host_collectives.execute for the kinds a plan covers: every member's output from every member's input;
 * or `share`'s part of it (-1: all): its own output, and for an all-reduce its slice of every output. */
static void run_plan(const Plan *p, Meeting *m, int share) {
    int G = m->group->members;
    char *in[G], *out[G], *parts[G];
    for (int i = 0; i < G; i++) {
        in[i] = m->member[i].pointers[2];  /* after the context and group rows */
        out[i] = m->member[i].pointers[m->member[i].nargs];
    }
    int64_t in_block = p->in_bytes / p->in_blocks, out_block = p->out_bytes / p->out_blocks;
    int size = p->type == BF16 ? 2 : 4, first = share < 0 ? 0 : share, last = share < 0 ? G : share + 1;
    if (p->kind == ALL_REDUCE) {
        int64_t n = in_block / size, lo = share < 0 ? 0 : n * share / G, hi = share < 0 ? n : n * (share + 1) / G;
        char *outs[G];
        for (int i = 0; i < G; i++) {
            parts[i] = in[i] + lo * size;
            outs[i] = out[i] + lo * size;
        }
        combine(p, parts, G, hi - lo, outs, G);
    } else if (p->kind == REDUCE_SCATTER) {
        for (int me = first; me < last; me++) {
            for (int i = 0; i < G; i++) parts[i] = in[i] + me * in_block;
            combine(p, parts, G, in_block / size, &out[me], 1);
        }
    } else if (p->kind == ALL_GATHER || p->kind == ALL_TO_ALL) {
        for (int me = first; me < last; me++)
            for (int i = 0; i < G; i++)
                memcpy(out[me] + i * out_block, in[i] + (p->in_blocks > 1 ? me : 0) * in_block, out_block);
    } else {  /* PPERMUTE, BROADCAST */
        for (int me = first; me < last; me++) {
            int64_t source = p->sources[me];
            if (source >= 0) memcpy(out[me], in[source], out_block);
            else memset(out[me], 0, out_block);
        }
    }
}

/* Whether the last member can do the call here: a plan, and every member's call the same from the same site. */
static int planned(Meeting *m) {
    Site *first = m->member[0].site;
    if (first->plan.type == NO_PLAN) return 0;
    for (int i = 1; i < m->group->members; i++) {
        Site *s = m->member[i].site;
        if (s->signature != first->signature || s->site != first->site) return 0;
    }
    return 1;
}

/* Member `me`'s record of call `number` (call_table.CallTable.begin's layout and order). */
static void write_record(Row *row, Site *site, uint64_t key, int64_t number) {
    if (!row->records) return;
    char *at = row->records + ((key % BUCKETS) * RING + (uint64_t)number % RING) * RECORD_BYTES;
    __atomic_store_n((int64_t *)(at + 8), 0, __ATOMIC_RELEASE);  /* (being rewritten) */
    memcpy(at + 32, site->text, TEXT_BYTES);
    *(int64_t *)(at + 16) = site->signature;
    *(int64_t *)(at + 24) = site->site;
    __atomic_store_n((int64_t *)at, (int64_t)key, __ATOMIC_RELEASE);
    __atomic_store_n((int64_t *)(at + 8), number + 1, __ATOMIC_RELEASE);  /* last: the record is whole */
}

/* Member `index`'s part of a shared call (lock held); returns when every member has done its part. */
static void do_share(Place *place, Meeting *meeting, int index) {
    pthread_mutex_unlock(&place->lock);
    run_plan(&meeting->member[index].site->plan, meeting, index);
    pthread_mutex_lock(&place->lock);
    if (++meeting->finished == meeting->group->members) {
        meeting->state = DONE;
        pthread_cond_broadcast(&meeting->wake);
    }
    while (meeting->state == SHARED) pthread_cond_wait(&meeting->wake, &place->lock);
}

static void *failure(CallFrame *frame, int status, Site *site, int64_t rank, int64_t peer, int64_t number,
                     int64_t meeting) {
    static __thread char message[MESSAGE_BYTES];  /* XLA copies it */
    message[0] = 0;
    describer(status, site->id, rank, peer, number, meeting, message, sizeof(message));
    return ffi_error(frame, message[0] ? message : "iris: a collective call failed");
}

/* The call's operands, [partition id, context table, group table, *rest] (iris_jax.calls.operands.
 * partition_operands), as [this device's context row, its group row, *rest]; returns their number. */
static int operand_pointers(CallFrame *frame, void **out) {
    int64_t partition = *(uint32_t *)frame->args.values[0]->data, n = frame->args.size - 1;
    for (int i = 0; i < n; i++) {
        Buffer *b = frame->args.values[i + 1];
        out[i] = i < 2 ? (char *)b->data + partition * b->dims[1] * (int64_t)sizeof(int32_t) : b->data;
    }
    return (int)n;
}

static void *meet(CallFrame *frame) {
    Site *site = (Site *)(intptr_t)*(int64_t *)((Scalar *)frame->attrs.values[0])->value;
    Place *place = site->place;
    void *args[frame->args.size];
    int nargs = operand_pointers(frame, args), nrets = (int)frame->rets.size;
    int64_t rank = *(int64_t *)args[0];
    pthread_mutex_lock(&place->lock);
    Row *row = place->closed ? NULL : row_of(site, rank, args[1]);
    if (place->closed || !row) {  /* (after row_of, which leaves the lock to ask Python: the place may close meanwhile) */
        int closed = place->closed;
        pthread_mutex_unlock(&place->lock);
        return failure(frame, closed ? CLOSED : UNRESOLVED, site, rank, -1, -1, 0);
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
    me->site = site;
    me->row = row;
    me->rank = rank;
    me->nargs = nargs;
    me->nrets = nrets;
    me->pointers = malloc(sizeof(void *) * (nargs + nrets));
    memcpy(me->pointers, args, sizeof(void *) * nargs);
    for (int i = 0; i < nrets; i++) me->pointers[nargs + i] = frame->rets.values[i]->data;
    if (++meeting->arrived == group->members) {
        unlink_meeting(place, meeting);
        int here = planned(meeting);
        for (int i = 0; i < group->members; i++) {
            Member *member = &meeting->member[i];
            member->status = here ? DONE : ERROR;  /* (Python sets each member's outcome) */
            if (here) write_record(member->row, member->site, group->key, member->row->counter->count++);
        }
        if (here && (site->plan.out_bytes >= SHARED_BYTES || site->plan.in_bytes >= SHARED_BYTES)) {
            meeting->state = SHARED;
            pthread_cond_broadcast(&meeting->wake);
            do_share(place, meeting, row->index);
        } else {
            pthread_mutex_unlock(&place->lock);
            if (here) run_plan(&site->plan, meeting, -1);
            else completer(meeting);  /* (Python, under the GIL: the whole call, every member's outcome set) */
            pthread_mutex_lock(&place->lock);
            meeting->state = DONE;
            pthread_cond_broadcast(&meeting->wake);
        }
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
        if (meeting->state == SHARED) do_share(place, meeting, row->index);
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
