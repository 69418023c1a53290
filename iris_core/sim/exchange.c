/* A simulated rank's call, in one step without Python's GIL (iris_core/sim/world.py, SimWorld.call):
 * the request written to the worker's socket, its reply waited for and read, framed as
 * multiprocessing.connection frames them (a 4-byte big-endian length, then the bytes). Done in
 * Python, each of those system calls gave the GIL up and took it back, and with every simulated
 * device's thread making its call at once, the switching between them was most of the host's time. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <unistd.h>

enum { DONE = 0, SPOKE_FIRST = 1, TIMED_OUT = 2, CLOSED = 3, FAILED = 4 };

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return FAILED;
        p += k;
        n -= (size_t)k;
    }
    return DONE;
}

static int read_all(int fd, char *p, size_t n) {
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return FAILED;
        if (k == 0) return CLOSED;
        p += k;
        n -= (size_t)k;
    }
    return DONE;
}

/* Sends `request` (`length` bytes) and reads the reply's first min(reply length, `capacity`) bytes
 * into `reply`, its length into `*reply_length` (the caller reads the rest). SPOKE_FIRST: the
 * socket was readable before the request (the worker exited: its end closed), nothing sent;
 * TIMED_OUT: no reply within `timeout_ms` (negative: none); CLOSED: the worker's end closed before
 * its whole reply; FAILED: a system call failed (errno says why). */
int iris_sim_exchange(int fd, const char *request, uint32_t length, char *reply, uint32_t capacity,
                      int timeout_ms, uint64_t *reply_length) {
    struct pollfd readable = {fd, POLLIN, 0};
    if (poll(&readable, 1, 0) != 0) return SPOKE_FIRST;
    uint32_t header = htonl(length);
    if (write_all(fd, (const char *)&header, 4) || write_all(fd, request, length)) return FAILED;
    for (;;) {
        int ready = poll(&readable, 1, timeout_ms);
        if (ready > 0) break;
        if (ready == 0) return TIMED_OUT;
        if (errno != EINTR) return FAILED;
    }
    int status = read_all(fd, (char *)&header, 4);
    if (status != DONE) return status;
    uint64_t size = ntohl(header);
    if (header == 0xFFFFFFFFu) {  /* a reply of 2 GiB or more: multiprocessing's long frame, 8 bytes */
        uint32_t halves[2];
        status = read_all(fd, (char *)halves, 8);
        if (status != DONE) return status;
        size = (uint64_t)ntohl(halves[0]) << 32 | ntohl(halves[1]);
    }
    *reply_length = size;
    return read_all(fd, reply, size < capacity ? (size_t)size : capacity);
}
