/* Generated from profiler_host/events.py by `./dev protos`:
 * edit that module, not this file (tests/test_host_events.py checks it is current). */
#ifndef PROFILER_HOST_EVENTS_H
#define PROFILER_HOST_EVENTS_H

#define EVENT_INTS 3
#define KIND_BITS 3
#define ENTER 0
#define EXIT 1
#define EXIT_EXCEPTION 2
#define SUSPEND 3
#define RESUME 4
#define READY 5
#define EXIT_CANCELLED 6
#define TOKEN_LANE 0
#define TOKEN_FK 1
#define TOKEN_CALL 2
#define PLAIN_TOKEN_SIZE 3
#define TOKEN_SUSPENDED 3
#define TOKEN_STAMP 4
#define RESUMABLE_TOKEN_SIZE 5

static const struct {
    const char *name;
    long value;
} events_constants[] = {
    {"EVENT_INTS", EVENT_INTS},
    {"KIND_BITS", KIND_BITS},
    {"ENTER", ENTER},
    {"EXIT", EXIT},
    {"EXIT_EXCEPTION", EXIT_EXCEPTION},
    {"SUSPEND", SUSPEND},
    {"RESUME", RESUME},
    {"READY", READY},
    {"EXIT_CANCELLED", EXIT_CANCELLED},
    {"TOKEN_LANE", TOKEN_LANE},
    {"TOKEN_FK", TOKEN_FK},
    {"TOKEN_CALL", TOKEN_CALL},
    {"PLAIN_TOKEN_SIZE", PLAIN_TOKEN_SIZE},
    {"TOKEN_SUSPENDED", TOKEN_SUSPENDED},
    {"TOKEN_STAMP", TOKEN_STAMP},
    {"RESUMABLE_TOKEN_SIZE", RESUMABLE_TOKEN_SIZE},
    {NULL, 0},
};

#endif
