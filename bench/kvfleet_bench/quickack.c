/* LD_PRELOAD shim for wrk: acknowledge every received segment at once (TCP_QUICKACK after
 * each successful read()), as bench/loadgen.py does for its own sockets.
 *
 * Without it, a server that writes a streamed response in several small segments without
 * TCP_NODELAY (sglang-router 0.3.2) stalls ~40 ms per response behind the client's delayed
 * ACK (Nagle's algorithm holds its next write until the previous one is acknowledged).
 * The cost, one setsockopt per read, is the same for every target.
 *
 *   gcc -O2 -shared -fPIC -o quickack.so quickack.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

static ssize_t (*real_read)(int, void *, size_t);

ssize_t read(int fd, void *buf, size_t n) {
    if (!real_read) real_read = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    ssize_t got = real_read(fd, buf, n);
    if (got > 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one); /* ENOTSOCK on files */
    }
    return got;
}
