/* A minimal C function runtime on smore: register, serve requests with admission and latency
 * reports, poll prewarm hints. Built and run by cbindings/tests/examples.rs against a real
 * arbiter on the simulated GPU; build by hand with
 *   cc -I cbindings/include cbindings/examples/c/smoke.c -L target/debug -lsmore -o smoke
 * Exit status 0 on success; prints one `key=value` line per step. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include "smore.h"

static int check(SmoreStatus s, const char *what) {
    if (s != SMORE_STATUS_OK) {
        fprintf(stderr, "%s failed (%d): %s\n", what, (int)s, smore_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *socket = argc > 1 ? argv[1] : NULL;
    int requests = argc > 2 ? atoi(argv[2]) : 100;
    SmoreClient *c = NULL;
    if (check(smore_connect(socket, &c), "smore_connect")) return 1;
    SmoreGrant g;
    if (check(smore_register(c, "c-smoke", "resnet50", 50.0, 256u << 20, &g), "smore_register")) return 1;
    printf("op=granted instance=%llu gpu=%u share=%u cap=%llu\n", (unsigned long long)g.instance,
           g.gpu_index, g.sm_share, (unsigned long long)g.memory_cap);
    int admitted = 0;
    for (int i = 0; i < requests; i++) {
        uint64_t id;
        if (check(smore_request_begin(c, &id), "smore_request_begin")) return 1;
        SmoreAdmission a;
        if (check(smore_admit(c, id, &a), "smore_admit")) return 1;
        admitted += a.admitted;
        struct timespec ts = {0, 200000}; /* 0.2 ms of "inference" */
        nanosleep(&ts, NULL);
        if (check(smore_request_end(c, id), "smore_request_end")) return 1;
    }
    if (check(smore_flush(c), "smore_flush")) return 1;
    /* An unknown request id is an error with a message, not a crash. */
    if (smore_request_end(c, 987654321) != SMORE_STATUS_INVALID_ARGUMENT) return 1;
    printf("op=bad-id message=\"%s\"\n", smore_last_error());
    SmoreHint hints[8];
    size_t n = 0;
    if (check(smore_poll_hints(c, hints, 8, &n), "smore_poll_hints")) return 1;
    printf("op=served requests=%d admitted=%d hints=%zu\n", requests, admitted, n);
    smore_disconnect(c);
    return 0;
}
