/* The hooks' hot path in C: what `profiler_host.hooks` does in Python, event for event.
 *
 * `RequestCore` and `LaneCore` hold the state the hooks touch (call counter, event cap,
 * truncated flag; event buffer, owning thread, request), so recording an event is a few
 * C field reads and three stores into the lane's `EventBuffer` (a growable array of 64-bit
 * ints: no int object is made per event). `recording.Request`/`recording.Lane` subclass them.
 *
 * Events, tokens and failures are exactly those of the Python hooks (see hooks.py), laid out
 * as profiler_host/events.py defines them (the constants of _events.h, generated from it): a
 * buffer is a flat sequence of ints, EVENT_INTS per event (`fid << KIND_BITS | kind`, call id,
 * CLOCK_MONOTONIC ns = time.monotonic_ns()); a plain call's token is a `CallToken`, which
 * reads as the sequence `(lane, fid << KIND_BITS, call id)` and holds the ids as C ints, a
 * resumable call's the list `[lane, fid << KIND_BITS, call id, suspended, stamp]`, each
 * field at its TOKEN_* index.
 * A hook never lets an `Exception` reach the caller: it is handed to `hooks._failed`
 * (counted, logged once) and cleared. Any other `BaseException` (KeyboardInterrupt raised
 * by a replaced `lane.record` or by a callback) propagates. Errors this file raises itself
 * are all `Exception`s.
 *
 * Everything runs under the GIL. An event's three ints are appended with no Python code in
 * between, so a drain on the transport thread never sees part of one.
 *
 * `InLane` runs work handed to another thread with its lane set (see propagation.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>
#include <time.h>

#include "_events.h" /* recording.py checks the module's copies of these before using it */

#include "_compat.h"

/* Set by configure(): hooks._own_lane, hooks._failed, hooks._RUNNING, recording.CURRENT. */
static PyObject *own_lane_cb = NULL;
static PyObject *failed_cb = NULL;
static PyObject *running = NULL; /* dict: lane -> list of resumable tokens, oldest first */
static PyObject *current_var = NULL; /* ContextVar: the lane of this context, or None */
static PyObject *cancelled_module = NULL; /* "asyncio.exceptions" */
/* attribute names the loop's stand-ins read on every callback, interned once */
static PyObject *context_str = NULL, *callback_str = NULL, *self_str = NULL;
static PyObject *cancelled_error = NULL;  /* its CancelledError, once it is imported */

/* ---- RequestCore ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long calls;      /* the last call id handed out */
    long long event_cap;  /* calls past event_cap / 2 are not recorded; 0: it ended */
    long long unrecorded; /* calls entered past the cap (they ran their original code) */
    char truncated;
} RequestCore;

static PyTypeObject RequestCoreType;
static PyTypeObject CallsType;
static int request_set_event_cap(RequestCore *self, PyObject *value, void *closure);

static int
request_init(RequestCore *self, PyObject *args, PyObject *kwds)
{
    PyObject *cap;
    static char *kwlist[] = {"event_cap", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:RequestCore", kwlist, &cap))
        return -1;
    self->calls = 0;
    self->unrecorded = 0;
    self->truncated = 0;
    return request_set_event_cap(self, cap, NULL);
}

static PyObject *
request_get_event_cap(RequestCore *self, void *closure)
{
    return PyLong_FromLongLong(self->event_cap);
}

static int
request_set_event_cap(RequestCore *self, PyObject *value, void *closure)
{
    int overflow;
    long long cap;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete event_cap");
        return -1;
    }
    cap = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (cap == -1 && PyErr_Occurred())
        return -1;
    if (overflow) /* a cap beyond 2**63 is no cap: same outcome as Python's big ints */
        cap = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    self->event_cap = cap;
    return 0;
}

static PyObject *
request_get_unrecorded(RequestCore *self, void *closure)
{
    return PyLong_FromLongLong(self->unrecorded);
}

/* The Python hooks count on C cores too (`request.unrecorded += 1`). */
static int
request_set_unrecorded(RequestCore *self, PyObject *value, void *closure)
{
    long long count;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete unrecorded");
        return -1;
    }
    count = PyLong_AsLongLong(value);
    if (count == -1 && PyErr_Occurred())
        return -1;
    self->unrecorded = count;
    return 0;
}

static PyObject *
request_get_truncated(RequestCore *self, void *closure)
{
    return PyBool_FromLong(self->truncated);
}

static int
request_set_truncated(RequestCore *self, PyObject *value, void *closure)
{
    int truth;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete truncated");
        return -1;
    }
    truth = PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    self->truncated = (char)truth;
    return 0;
}

typedef struct {
    PyObject_HEAD
    RequestCore *request;
} Calls;

/* `request.calls`: an iterator over the request's call ids, like the itertools.count the
 * Python implementation keeps there (`next(request.calls)`). */
static PyObject *
request_get_calls(RequestCore *self, void *closure)
{
    Calls *calls = PyObject_New(Calls, &CallsType);
    if (calls == NULL)
        return NULL;
    Py_INCREF(self);
    calls->request = self;
    return (PyObject *)calls;
}

static PyGetSetDef request_getset[] = {
    {"event_cap", (getter)request_get_event_cap, (setter)request_set_event_cap,
     "events recorded before the request is marked truncated", NULL},
    {"truncated", (getter)request_get_truncated, (setter)request_set_truncated,
     "events were lost", NULL},
    {"unrecorded", (getter)request_get_unrecorded, (setter)request_set_unrecorded,
     "calls entered past the event cap, not recorded", NULL},
    {"calls", (getter)request_get_calls, NULL, "iterator over new call ids", NULL},
    {NULL},
};

static PyTypeObject RequestCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.RequestCore",
    .tp_basicsize = sizeof(RequestCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The per-request state the hooks touch.",
    .tp_getset = request_getset,
    .tp_init = (initproc)request_init,
    .tp_new = PyType_GenericNew,
};

static void
calls_dealloc(Calls *self)
{
    Py_DECREF(self->request);
    PyObject_Free(self);
}

static PyObject *
calls_next(Calls *self)
{
    return PyLong_FromLongLong(++self->request->calls);
}

static PyTypeObject CallsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.Calls",
    .tp_basicsize = sizeof(Calls),
    .tp_dealloc = (destructor)calls_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)calls_next,
};

/* ---- EventBuffer ------------------------------------------------------------------- */

/* A lane's events: EVENT_INTS 64-bit ints each, appended by the hooks (C stores, or
 * `extend` of whole events from Python), read by the transport as a sequence (len, indexes,
 * strided slices into lists of ints) or straight by `pack`, and cut at the front with
 * `del buffer[:n]`. It holds no objects, so the garbage collector never walks it. */
#if EVENT_INTS != 3
#error "buffer_push writes three ints per event"
#endif
#define BUFFER_MIN 96 /* ints: 32 events */

typedef struct {
    PyObject_HEAD
    long long *items;
    Py_ssize_t size, allocated;
} EventBuffer;

static PyTypeObject EventBufferType;
#define EventBuffer_Check(op) Py_IS_TYPE(op, &EventBufferType)

/* Room for `more` ints past the end: -1 with MemoryError set when there is none. */
static int
buffer_reserve(EventBuffer *self, Py_ssize_t more)
{
    Py_ssize_t want;
    long long *items;
    if (self->size + more <= self->allocated)
        return 0;
    if (more > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(long long) - self->size) {
        PyErr_NoMemory();
        return -1;
    }
    want = self->allocated < BUFFER_MIN ? BUFFER_MIN : self->allocated;
    while (want < self->size + more)
        want = want + (want >> 1); /* grows by half: amortised O(1) per event */
    items = PyMem_Realloc(self->items, (size_t)want * sizeof(long long));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->items = items;
    self->allocated = want;
    return 0;
}

static inline int
buffer_push(EventBuffer *self, long long first, long long call, long long ns)
{
    long long *at;
    if (self->size + EVENT_INTS > self->allocated && buffer_reserve(self, EVENT_INTS) < 0)
        return -1;
    at = self->items + self->size;
    at[0] = first;
    at[1] = call;
    at[2] = ns;
    self->size += EVENT_INTS;
    return 0;
}

static inline long long as_int64(PyObject *value);

/* extend(values): whole events only, all of them or none (an error leaves it as it was) */
static PyObject *
buffer_extend(EventBuffer *self, PyObject *values)
{
    Py_ssize_t n, i;
    PyObject *seq = PySequence_Fast(values, "extend() takes a sequence of ints");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n % EVENT_INTS != 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "extend() takes whole events");
        return NULL;
    }
    if (buffer_reserve(self, n) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        long long value = as_int64(PySequence_Fast_GET_ITEM(seq, i));
        if (value == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        self->items[self->size + i] = value;
    }
    self->size += n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *
buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *values = NULL, *done;
    EventBuffer *self;
    static char *kwlist[] = {"values", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:EventBuffer", kwlist, &values))
        return NULL;
    self = (EventBuffer *)type->tp_alloc(type, 0);
    if (self == NULL || values == NULL)
        return (PyObject *)self;
    done = buffer_extend(self, values);
    if (done == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(done);
    return (PyObject *)self;
}

static void
buffer_dealloc(EventBuffer *self)
{
    PyMem_Free(self->items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
buffer_length(EventBuffer *self)
{
    return self->size;
}

static PyObject *
buffer_item(EventBuffer *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->size) {
        PyErr_SetString(PyExc_IndexError, "event buffer index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(self->items[i]);
}

/* buffer[i] or buffer[start:stop:step] (a list of ints) */
static PyObject *
buffer_subscript(EventBuffer *self, PyObject *key)
{
    Py_ssize_t start, stop, step, n, i;
    PyObject *list;
    if (PyIndex_Check(key)) {
        Py_ssize_t index = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (index == -1 && PyErr_Occurred())
            return NULL;
        return buffer_item(self, index < 0 ? index + self->size : index);
    }
    if (!PySlice_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "event buffer indices are ints or slices");
        return NULL;
    }
    if (PySlice_Unpack(key, &start, &stop, &step) < 0)
        return NULL;
    n = PySlice_AdjustIndices(self->size, &start, &stop, step);
    list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(self->items[start + i * step]);
        if (value == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

/* del buffer[:n]: the only assignment (the transport forgets what it took) */
static int
buffer_ass_subscript(EventBuffer *self, PyObject *key, PyObject *value)
{
    Py_ssize_t start, stop, step, n;
    if (value != NULL || !PySlice_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "an event buffer takes extend() and del buffer[:n] only");
        return -1;
    }
    if (PySlice_Unpack(key, &start, &stop, &step) < 0)
        return -1;
    n = PySlice_AdjustIndices(self->size, &start, &stop, step);
    if (n == 0)
        return 0;
    if (step != 1 || start != 0) {
        PyErr_SetString(PyExc_ValueError, "an event buffer is cut at its start only");
        return -1;
    }
    memmove(self->items, self->items + n, (size_t)(self->size - n) * sizeof(long long));
    self->size -= n;
    if (self->allocated > BUFFER_MIN && self->size < self->allocated / 4) {
        /* a long request's peak is given back once the transport took it */
        Py_ssize_t want = self->size * 2 > BUFFER_MIN ? self->size * 2 : BUFFER_MIN;
        long long *items = PyMem_Realloc(self->items, (size_t)want * sizeof(long long));
        if (items != NULL) {
            self->items = items;
            self->allocated = want;
        }
    }
    return 0;
}

static PySequenceMethods buffer_as_sequence = {
    .sq_length = (lenfunc)buffer_length,
    .sq_item = (ssizeargfunc)buffer_item,
};

static PyMappingMethods buffer_as_mapping = {
    .mp_length = (lenfunc)buffer_length,
    .mp_subscript = (binaryfunc)buffer_subscript,
    .mp_ass_subscript = (objobjargproc)buffer_ass_subscript,
};

static PyMethodDef buffer_methods[] = {
    {"extend", (PyCFunction)buffer_extend, METH_O,
     "extend(values): appends whole events (EVENT_INTS ints each)"},
    {NULL},
};

static PyTypeObject EventBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.EventBuffer",
    .tp_basicsize = sizeof(EventBuffer),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lane's events as 64-bit ints, EVENT_INTS per event.",
    .tp_as_sequence = &buffer_as_sequence,
    .tp_as_mapping = &buffer_as_mapping,
    .tp_methods = buffer_methods,
    .tp_new = buffer_new,
};

/* ---- LaneCore ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *buffer;      /* an EventBuffer */
    PyObject *record;      /* buffer.extend, unless replaced (tests, tools) */
    RequestCore *request;  /* NULL until __init__ */
    unsigned long thread;  /* the thread whose events this lane takes */
    char direct;           /* record is still buffer.extend: append to buffer directly */
} LaneCore;

static PyTypeObject LaneCoreType;
/* recording.Lane is a direct subclass: spare the MRO walk for it */
#define LaneCore_Check(op)                                                               \
    (Py_TYPE(op) == &LaneCoreType || Py_TYPE(op)->tp_base == &LaneCoreType ||             \
     PyType_IsSubtype(Py_TYPE(op), &LaneCoreType))

static PyObject *
lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    LaneCore *self = (LaneCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->buffer = EventBufferType.tp_alloc(&EventBufferType, 0);
    if (self->buffer == NULL)
        goto fail;
    self->record = PyObject_GetAttrString(self->buffer, "extend");
    if (self->record == NULL)
        goto fail;
    self->direct = 1;
    self->thread = PyThread_get_thread_ident();
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
lane_init(LaneCore *self, PyObject *args, PyObject *kwds)
{
    PyObject *request;
    static char *kwlist[] = {"request", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:LaneCore", kwlist, &RequestCoreType,
                                     &request))
        return -1;
    Py_INCREF(request);
    Py_XSETREF(self->request, (RequestCore *)request);
    self->thread = PyThread_get_thread_ident();
    return 0;
}

static int
lane_traverse(LaneCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buffer);
    Py_VISIT(self->record);
    Py_VISIT(self->request);
    return 0;
}

static int
lane_clear(LaneCore *self)
{
    /* buffer stays: the hooks rely on it being an EventBuffer (it holds no objects) */
    Py_CLEAR(self->record);
    Py_CLEAR(self->request);
    self->direct = 0;
    return 0;
}

static void
lane_dealloc(LaneCore *self)
{
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_CLEAR(self->buffer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
lane_get_buffer(LaneCore *self, void *closure)
{
    return Py_NewRef(self->buffer);
}

static PyObject *
lane_get_record(LaneCore *self, void *closure)
{
    if (self->record == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->record);
}

/* Whether `value` is this lane's buffer.extend (a fresh bound method each time it is read,
 * so compare what it is bound to). */
static int
is_buffer_extend(LaneCore *self, PyObject *value)
{
    return PyCFunction_Check(value) && PyCFunction_GET_SELF(value) == self->buffer &&
           strcmp(((PyCFunctionObject *)value)->m_ml->ml_name, "extend") == 0;
}

static int
lane_set_record(LaneCore *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete record");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->record, value);
    self->direct = (char)is_buffer_extend(self, value);
    return 0;
}

static PyObject *
lane_get_request(LaneCore *self, void *closure)
{
    if (self->request == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->request);
}

static PyObject *
lane_get_thread(LaneCore *self, void *closure)
{
    return PyLong_FromUnsignedLong(self->thread);
}

static int
lane_set_thread(LaneCore *self, PyObject *value, void *closure)
{
    unsigned long ident;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete thread");
        return -1;
    }
    ident = PyLong_AsUnsignedLong(value);
    if (ident == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    self->thread = ident;
    return 0;
}

static PyGetSetDef lane_getset[] = {
    {"buffer", (getter)lane_get_buffer, NULL, "events, three ints each", NULL},
    {"record", (getter)lane_get_record, (setter)lane_set_record,
     "record((function << KIND_BITS | kind, call, ns)); buffer.extend by default", NULL},
    {"request", (getter)lane_get_request, NULL, "the request this lane belongs to", NULL},
    {"thread", (getter)lane_get_thread, (setter)lane_set_thread,
     "ident of the thread whose events this lane takes", NULL},
    {NULL},
};

static PyTypeObject LaneCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.LaneCore",
    .tp_basicsize = sizeof(LaneCore),
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The per-lane state the hooks touch.",
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_getset = lane_getset,
    .tp_init = (initproc)lane_init,
    .tp_new = lane_new,
};

/* ---- CallToken --------------------------------------------------------------------- */

/* A plain call's token: its lane and ids, the ids as C ints, so entering makes one object
 * and exiting reads two fields. It reads as the Python hooks' tuple does (events.py).
 *
 * Tokens come and go with every recorded call, so spent ones are kept for reuse (at most
 * TOKENS_KEPT; all under the GIL). They are not tracked by the garbage collector: a token
 * refers to a lane only, and nothing a lane refers to (its request, buffer, parent lane)
 * refers to a frame, where tokens live, so no cycle runs through one. */
typedef struct {
    PyObject_HEAD
    PyObject *lane; /* a LaneCore */
    long long fk;   /* fid << KIND_BITS */
    long long call;
} CallToken;

static PyTypeObject CallTokenType;

#define TOKENS_KEPT 256
static CallToken *tokens_kept[TOKENS_KEPT];
static int tokens_kept_count = 0;

/* A token for `lane` (a new reference it takes over), or NULL with MemoryError set. */
static CallToken *
token_new(PyObject *lane, long long fk, long long call)
{
    CallToken *token;
    if (tokens_kept_count > 0) {
        token = tokens_kept[--tokens_kept_count];
        PyObject_Init((PyObject *)token, &CallTokenType);
    }
    else {
        token = PyObject_New(CallToken, &CallTokenType);
        if (token == NULL)
            return NULL;
    }
    token->lane = lane;
    token->fk = fk;
    token->call = call;
    return token;
}

static void
token_dealloc(CallToken *self)
{
    Py_CLEAR(self->lane);
    if (tokens_kept_count < TOKENS_KEPT)
        tokens_kept[tokens_kept_count++] = self;
    else
        PyObject_Free(self);
}

static Py_ssize_t
token_length(CallToken *self)
{
    return PLAIN_TOKEN_SIZE;
}

static PyObject *
token_item(CallToken *self, Py_ssize_t i)
{
    if (i == TOKEN_LANE)
        return Py_NewRef(self->lane ? self->lane : Py_None);
    if (i == TOKEN_FK)
        return PyLong_FromLongLong(self->fk);
    if (i == TOKEN_CALL)
        return PyLong_FromLongLong(self->call);
    PyErr_SetString(PyExc_IndexError, "call token index out of range");
    return NULL;
}

static PySequenceMethods token_as_sequence = {
    .sq_length = (lenfunc)token_length,
    .sq_item = (ssizeargfunc)token_item,
};

static PyTypeObject CallTokenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.CallToken",
    .tp_basicsize = sizeof(CallToken),
    .tp_dealloc = (destructor)token_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A plain call's token: (lane, fid << KIND_BITS, call id).",
    .tp_as_sequence = &token_as_sequence,
};

/* ---- recording --------------------------------------------------------------------- */

static inline long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of time.monotonic_ns() */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* PyLong_AsLongLong without its detour through a byte array for ints of more than one
 * 30-bit digit (every nanosecond timestamp, on CPython 3.11): -1 with an error set when
 * `value` is not an int or does not fit in 64 bits. */
static inline long long
as_int64(PyObject *value)
{
    int overflow;
    long long result = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "an event value beyond 64 bits");
        return -1;
    }
    return result;
}

/* record((first, call, ns)) through `record`; straight into the buffer when `record` is
 * the lane's own buffer.extend. */
static int
record_via(LaneCore *lane, PyObject *record, long long first, long long call, long long ns)
{
    PyObject *event, *result;
    if (lane->request != NULL && lane->request->event_cap == 0)
        return 0; /* the request ended: calls still open record nothing (Request.finish) */
    if (record == lane->record && lane->direct)
        return buffer_push((EventBuffer *)lane->buffer, first, call, ns);
    if (record == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lane has no record");
        return -1;
    }
    event = Py_BuildValue("(LLL)", first, call, ns);
    if (event == NULL)
        return -1;
    result = PyObject_CallOneArg(record, event);
    Py_DECREF(event);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* One event of `kind` for the call whose token holds `fk` (fid << KIND_BITS) and `call`. */
static int
record_kind(LaneCore *lane, PyObject *record, PyObject *fk, int kind, PyObject *call,
            long long ns)
{
    long long packed = as_int64(fk), cid;
    if (packed == -1 && PyErr_Occurred())
        return -1;
    cid = as_int64(call);
    if (cid == -1 && PyErr_Occurred())
        return -1;
    return record_via(lane, record, packed | kind, cid, ns);
}

/* An error is set. An Exception goes to hooks._failed (counted, logged once) and is
 * cleared: returns 0. Anything else (KeyboardInterrupt, SystemExit) stays set: -1. */
static int
swallow(void)
{
    PyObject *exc, *result;
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    exc = PyErr_GetRaisedException();
    if (failed_cb != NULL) {
        result = PyObject_CallOneArg(failed_cb, exc);
        if (result != NULL)
            Py_DECREF(result);
        else if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_Clear(); /* the logging failed too: the count is what matters */
    }
    Py_DECREF(exc);
    return PyErr_Occurred() ? -1 : 0;
}

/* What a hook returns after a failure: `ok` (new reference) once an Exception is
 * swallowed, NULL while a BaseException propagates. */
static PyObject *
failed(PyObject *ok)
{
    if (swallow() < 0)
        return NULL;
    return Py_NewRef(ok);
}

/* ---- the running calls per lane (hooks._RUNNING) ------------------------------------ */

/* Index of `token` in `list` by identity, or -1. Identity is what `token in running`
 * finds too: equal tokens have equal call ids, and call ids are unique. */
static Py_ssize_t
index_of(PyObject *list, PyObject *token)
{
    Py_ssize_t i;
    for (i = PyList_GET_SIZE(list) - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(list, i) == token)
            return i;
    }
    return -1;
}

static int
running_push(PyObject *lane, PyObject *token)
{
    PyObject *list = PyDict_GetItemWithError(running, lane); /* borrowed */
    if (list == NULL) {
        int rc;
        if (PyErr_Occurred())
            return -1;
        list = PyList_New(1);
        if (list == NULL)
            return -1;
        PyList_SET_ITEM(list, 0, Py_NewRef(token));
        rc = PyDict_SetItem(running, lane, list);
        Py_DECREF(list);
        return rc;
    }
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "_RUNNING holds a non-list");
        return -1;
    }
    if (index_of(list, token) >= 0)
        return 0;
    return PyList_Append(list, token);
}

/* The lane's running calls (borrowed): 1 with *list set, 0 when it has none (or nothing
 * runs anywhere: the usual case outside asyncio), -1 with an error set. */
static int
lane_running(LaneCore *lane, PyObject **list)
{
    if (PyDict_GET_SIZE(running) == 0)
        return 0;
    *list = PyDict_GetItemWithError(running, (PyObject *)lane);
    if (*list == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_Check(*list)) {
        PyErr_SetString(PyExc_TypeError, "_RUNNING holds a non-list");
        return -1;
    }
    return PyList_GET_SIZE(*list) > 0;
}

/* Pops the top of a lane's running calls (`list`), a frame that gave control away without
 * a hook: unless its SUSPEND is recorded already, it is recorded at `since` (its own resume
 * hook then records only the RESUME). */
static int
suspend_top(LaneCore *lane, PyObject *list, long long since)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *top = Py_NewRef(PyList_GET_ITEM(list, n - 1));
    int rc = PyList_SetSlice(list, n - 1, n, NULL);
    if (rc == 0 && (!PyList_CheckExact(top) || PyList_GET_SIZE(top) != RESUMABLE_TOKEN_SIZE)) {
        PyErr_SetString(PyExc_TypeError, "bad token in _RUNNING");
        rc = -1;
    }
    else if (rc == 0 && PyList_GET_ITEM(top, TOKEN_SUSPENDED) != Py_True) {
        rc = PyList_SetItem(top, TOKEN_SUSPENDED, Py_NewRef(Py_True));
        if (rc == 0)
            rc = record_kind(lane, lane->record, PyList_GET_ITEM(top, TOKEN_FK), SUSPEND,
                             PyList_GET_ITEM(top, TOKEN_CALL), since);
    }
    Py_DECREF(top);
    return rc;
}

/* A lane whose running calls ran out leaves _RUNNING (its entry is `list` still). */
static int
forget_if_done(LaneCore *lane, PyObject *list)
{
    PyObject *current;
    if (PyList_GET_SIZE(list) > 0)
        return 0;
    current = PyDict_GetItemWithError(running, (PyObject *)lane);
    if (current == list)
        return PyDict_DelItem(running, (PyObject *)lane);
    return current == NULL && PyErr_Occurred() ? -1 : 0;
}

/* When a frame that gave control away without a hook stopped: at the lane's last event
 * (a buffer ends with an event's ns), else now. */
static long long
since_of(LaneCore *lane, long long now)
{
    EventBuffer *buffer = (EventBuffer *)lane->buffer;
    return buffer->size ? buffer->items[buffer->size - 1] : now;
}

/* Takes `token` off its lane's running calls; those above it gave control away without a
 * hook and are recorded as suspended since the lane's last event first
 * (hooks._running_pop). */
static int
running_pop(LaneCore *lane, PyObject *token, long long now)
{
    PyObject *list;
    long long since;
    int rc = lane_running(lane, &list);
    if (rc <= 0)
        return rc;
    if (index_of(list, token) < 0)
        return 0;
    rc = 0;
    Py_INCREF(list); /* a replaced record may run code that changes _RUNNING */
    since = since_of(lane, now);
    while (rc == 0 && PyList_GET_SIZE(list) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(list);
        if (PyList_GET_ITEM(list, n - 1) == token) {
            rc = PyList_SetSlice(list, n - 1, n, NULL);
            break;
        }
        rc = suspend_top(lane, list, since);
    }
    if (rc == 0)
        rc = forget_if_done(lane, list);
    Py_DECREF(list);
    return rc;
}

/* A woken await chain (hooks.ready) that runs a hook other than its resume hooks had an
 * exception thrown in (a cancellation, a failed await): that resumed it with no hook, so its
 * frames resume at `now`, outermost first (hooks._resume_thrown). */
static int
resume_thrown(LaneCore *lane, long long now)
{
    PyObject *list, *top;
    Py_ssize_t i;
    int rc = lane_running(lane, &list);
    if (rc <= 0)
        return rc;
    rc = 0;
    top = PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1);
    if (!PyList_CheckExact(top) || PyList_GET_SIZE(top) != RESUMABLE_TOKEN_SIZE ||
        PyList_GET_ITEM(top, TOKEN_SUSPENDED) != Py_True)
        return 0;
    Py_INCREF(list); /* a replaced record may run code that changes _RUNNING */
    for (i = 0; rc == 0 && i < PyList_GET_SIZE(list); i++) {
        PyObject *token = PyList_GET_ITEM(list, i);
        if (!PyList_CheckExact(token) || PyList_GET_SIZE(token) != RESUMABLE_TOKEN_SIZE) {
            PyErr_SetString(PyExc_TypeError, "bad token in _RUNNING");
            rc = -1;
        }
        else if (PyList_GET_ITEM(token, TOKEN_SUSPENDED) == Py_True) {
            Py_INCREF(token);
            rc = PyList_SetItem(token, TOKEN_SUSPENDED, Py_NewRef(Py_False));
            if (rc == 0)
                rc = record_kind(lane, lane->record, PyList_GET_ITEM(token, TOKEN_FK), RESUME,
                                 PyList_GET_ITEM(token, TOKEN_CALL), now);
            Py_DECREF(token);
        }
    }
    Py_DECREF(list);
    return rc;
}


/* The lane of a resumable token, or NULL with TypeError set. Borrowed. */
static LaneCore *
resumable_lane(PyObject *token)
{
    PyObject *lane;
    if (!PyList_CheckExact(token) || PyList_GET_SIZE(token) != RESUMABLE_TOKEN_SIZE) {
        PyErr_SetString(PyExc_TypeError, "not a resumable token");
        return NULL;
    }
    lane = PyList_GET_ITEM(token, TOKEN_LANE);
    if (!LaneCore_Check(lane)) {
        PyErr_SetString(PyExc_TypeError, "token without a lane");
        return NULL;
    }
    return (LaneCore *)lane;
}

/* ---- the hooks --------------------------------------------------------------------- */

/* The lane an InLane runs its work in on this thread, and that lane's parent (both borrowed:
 * the running InLane holds them). Work handed over runs in the lane's context, but it may run
 * part of itself in a context it copied before the hand-over (asgiref's `sync_to_async` runs
 * the view in `context.run`), which holds the parent: that part belongs in the handed lane
 * too, nested under the work's calls, not in a thread lane of the parent's. */
static _Thread_local PyObject *handed_lane = NULL;
static _Thread_local PyObject *handed_parent = NULL;

/* The handed lane (a new reference, claimed for this thread) when `lane` is its parent,
 * else NULL (no exception set). */
static PyObject *
handed_here(PyObject *lane)
{
    LaneCore *handed = (LaneCore *)handed_lane;
    unsigned long ident;
    if (handed == NULL || handed_parent != lane)
        return NULL;
    ident = PyThread_get_thread_ident();
    if (handed->thread == 0) /* UNCLAIMED: the first call of the work claims it */
        handed->thread = ident;
    return handed->thread == ident ? Py_NewRef(handed_lane) : NULL;
}

/* Records the ENTER of a call of `fid` on `lane` (or this thread's own lane).
 * 1: recorded, *lane_out is a new reference, *fk_out and *call_out are set; 0: not recorded
 * (over the event cap, or a failure that was swallowed); -1: a BaseException propagates. */
static int
enter_core(PyObject *lane_arg, PyObject *fid_arg, PyObject **lane_out, long long *fk_out,
           long long *call_out)
{
    PyObject *lane_obj = NULL;
    LaneCore *lane;
    RequestCore *request;
    long long cid, fid, ns;

    if (!LaneCore_Check(lane_arg)) {
        PyErr_SetString(PyExc_TypeError, "enter() needs a Lane");
        goto fail;
    }
    lane = (LaneCore *)lane_arg;
    if (lane->thread != PyThread_get_thread_ident() && (lane_obj = handed_here(lane_arg))) {
        lane = (LaneCore *)lane_obj;
    }
    else if (lane->thread != PyThread_get_thread_ident()) {
        /* a context copied into another thread: that thread gets its own lane */
        if (own_lane_cb == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "_hotpath.configure() was not called");
            goto fail;
        }
        lane_obj = PyObject_CallOneArg(own_lane_cb, lane_arg);
        if (lane_obj == NULL)
            goto fail;
        if (!LaneCore_Check(lane_obj)) {
            PyErr_SetString(PyExc_TypeError, "_own_lane() did not return a Lane");
            goto fail;
        }
        lane = (LaneCore *)lane_obj;
    }
    else {
        lane_obj = Py_NewRef(lane_arg);
    }
    request = lane->request;
    if (request == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lane without a request");
        goto fail;
    }
    cid = ++request->calls;
    if (cid > request->event_cap >> 1) {
        if (request->event_cap > 0) { /* 0: the request ended (hooks.enter) */
            request->truncated = 1;
            request->unrecorded++;
        }
        Py_DECREF(lane_obj);
        return 0;
    }
    fid = as_int64(fid_arg);
    if (fid == -1 && PyErr_Occurred())
        goto fail;
    ns = now_ns();
    if (resume_thrown(lane, ns) < 0 ||
        record_via(lane, lane->record, (fid << KIND_BITS) | ENTER, cid, ns) < 0)
        goto fail;
    *lane_out = lane_obj;
    *fk_out = fid << KIND_BITS;
    *call_out = cid;
    return 1;
fail:
    Py_XDECREF(lane_obj);
    return swallow();
}

static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return -1;
}

/* The lane of this context (a new reference) or NULL with no error when it has none. The
 * open gate's read of the ContextVar, inside `enter` so that a sampled call pays one builtin
 * call, not two. */
static PyObject *
context_lane(void)
{
    PyObject *lane = NULL;
    if (current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.configure() was not called");
        return NULL;
    }
    if (PyContextVar_Get(current_var, NULL, &lane) < 0)
        return NULL;
    if (lane == Py_None)
        Py_CLEAR(lane);
    return lane;
}

/* Records the ENTER of `fid` in this context's lane: 1 as enter_core; 0 also when the context
 * has no lane (not in a sampled request). */
static int
enter_here(PyObject *fid_arg, PyObject **lane_out, long long *fk_out, long long *call_out)
{
    int rc;
    PyObject *lane = context_lane();
    if (lane == NULL)
        return PyErr_Occurred() ? swallow() : 0;
    rc = enter_core(lane, fid_arg, lane_out, fk_out, call_out);
    Py_DECREF(lane);
    return rc;
}

/* enter(fid) -> CallToken (lane, fid << KIND_BITS, call id), or None outside a sampled
 * request */
static PyObject *
hp_enter(PyObject *module, PyObject *fid)
{
    PyObject *lane = NULL;
    CallToken *token;
    long long fk = 0, call = 0;
    int rc = enter_here(fid, &lane, &fk, &call);
    if (rc <= 0)
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    token = token_new(lane, fk, call);
    if (token == NULL) {
        Py_DECREF(lane);
        return failed(Py_None);
    }
    return (PyObject *)token;
}

/* enter_resumable(fid) -> [lane, fid << KIND_BITS, call id, False, call id] or None */
static PyObject *
hp_enter_resumable(PyObject *module, PyObject *fid)
{
    PyObject *lane = NULL, *fk, *call, *token;
    long long fk_int = 0, call_int = 0;
    int rc = enter_here(fid, &lane, &fk_int, &call_int);
    if (rc <= 0)
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    fk = PyLong_FromLongLong(fk_int);
    call = PyLong_FromLongLong(call_int);
    token = fk && call ? PyList_New(RESUMABLE_TOKEN_SIZE) : NULL;
    if (token == NULL) {
        Py_DECREF(lane);
        Py_XDECREF(fk);
        Py_XDECREF(call);
        return failed(Py_None);
    }
    PyList_SET_ITEM(token, TOKEN_LANE, lane);
    PyList_SET_ITEM(token, TOKEN_FK, fk);
    PyList_SET_ITEM(token, TOKEN_CALL, call);
    PyList_SET_ITEM(token, TOKEN_SUSPENDED, Py_NewRef(Py_False));
    PyList_SET_ITEM(token, TOKEN_STAMP, Py_NewRef(call));
    if (running_push(lane, token) < 0 && swallow() < 0) {
        Py_DECREF(token);
        return NULL;
    }
    return token;
}

/* A plain call `call` exits: the resumable calls its frame let run (stamped after it) that
 * are still listed gave control away without a hook, so they are suspended, innermost
 * first (hooks._suspend_let_run). */
static int
suspend_let_run(LaneCore *lane, long long cid, long long now)
{
    PyObject *list;
    long long since;
    int rc = lane_running(lane, &list);
    if (rc <= 0)
        return rc;
    rc = 0;
    Py_INCREF(list); /* a replaced record may run code that changes _RUNNING */
    since = since_of(lane, now);
    while (rc == 0 && PyList_GET_SIZE(list) > 0) {
        PyObject *above = PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1);
        long long stamp;
        if (!PyList_CheckExact(above) || PyList_GET_SIZE(above) != RESUMABLE_TOKEN_SIZE) {
            PyErr_SetString(PyExc_TypeError, "bad token in _RUNNING");
            rc = -1;
            break;
        }
        stamp = as_int64(PyList_GET_ITEM(above, TOKEN_STAMP));
        if (stamp == -1 && PyErr_Occurred())
            rc = -1;
        else if (stamp <= cid)
            break;
        else
            rc = suspend_top(lane, list, since);
    }
    if (rc == 0)
        rc = forget_if_done(lane, list);
    Py_DECREF(list);
    return rc;
}

/* A plain call's exit: lane.record((fk | kind, call, now)) */
static PyObject *
exit_plain(PyObject *token, int kind)
{
    long long ns, fk, call;
    PyObject *lane;
    int rc;
    if (!Py_IS_TYPE(token, &CallTokenType) || ((CallToken *)token)->lane == NULL) {
        PyErr_SetString(PyExc_TypeError, "not a call token");
        return failed(Py_None);
    }
    ns = now_ns();
    /* held: a replaced record (Python code) may run */
    lane = Py_NewRef(((CallToken *)token)->lane);
    fk = ((CallToken *)token)->fk;
    call = ((CallToken *)token)->call;
    rc = resume_thrown((LaneCore *)lane, ns);
    if (rc == 0)
        rc = suspend_let_run((LaneCore *)lane, call, ns);
    if (rc == 0)
        rc = record_via((LaneCore *)lane, ((LaneCore *)lane)->record, fk | kind, call, ns);
    Py_DECREF(lane);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

static PyObject *exit_resumable(PyObject *token, int kind);

static PyObject *
hp_exit(PyObject *module, PyObject *token)
{
    return exit_plain(token, EXIT);
}

static PyObject *
hp_exit_resumable(PyObject *module, PyObject *token)
{
    return exit_resumable(token, EXIT);
}

/* How `exc` ends a call (hooks.exit_exception): asyncio's cancellation and close()
 * (GeneratorExit) cancel it, anything else is raised out of it. -1 with an error set. */
static int
exit_kind(PyObject *exc)
{
    if (PyErr_GivenExceptionMatches(exc, PyExc_GeneratorExit))
        return EXIT_CANCELLED;
    if (cancelled_error == NULL) {
        /* asyncio is not imported here: until the app imports it, nothing is cancelled */
        PyObject *module = PyImport_GetModule(cancelled_module);
        if (module == NULL)
            return PyErr_Occurred() ? -1 : EXIT_EXCEPTION;
        cancelled_error = PyObject_GetAttrString(module, "CancelledError");
        Py_DECREF(module);
        if (cancelled_error == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear(); /* asyncio.exceptions is being imported */
            return EXIT_EXCEPTION;
        }
    }
    return PyErr_GivenExceptionMatches(exc, cancelled_error) ? EXIT_CANCELLED : EXIT_EXCEPTION;
}

/* exit_exception(token, exc): either kind of token */
static PyObject *
hp_exit_exception(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int kind;
    if (check_nargs("exit_exception", nargs, 2) < 0)
        return NULL;
    kind = exit_kind(args[1]);
    if (kind < 0) {
        if (swallow() < 0)
            return NULL;
        kind = EXIT_EXCEPTION; /* counted as a failure, still recorded as an exit */
    }
    if (PyList_CheckExact(args[0]))
        return exit_resumable(args[0], kind);
    return exit_plain(args[0], kind);
}

/* The shared start of suspend/resume/resume_delegated: the token's lane and fields
 * (borrowed, the token is held by the caller's frame), its suspended flag and now. */
typedef struct {
    LaneCore *lane;
    PyObject *fk, *call;
    long long ns;
    int suspended;
} Resumable;

static int
unpack(PyObject *token, Resumable *r)
{
    r->lane = resumable_lane(token);
    if (r->lane == NULL)
        return -1;
    r->fk = PyList_GET_ITEM(token, TOKEN_FK);
    r->call = PyList_GET_ITEM(token, TOKEN_CALL);
    r->suspended = PyObject_IsTrue(PyList_GET_ITEM(token, TOKEN_SUSPENDED));
    if (r->suspended < 0)
        return -1;
    r->ns = now_ns();
    return 0;
}

/* Holds the token's parts while a replaced record (Python code) may run; releases them
 * after. */
static void
hold(Resumable *r, int take)
{
    if (take) {
        Py_INCREF(r->lane);
        Py_INCREF(r->fk);
        Py_INCREF(r->call);
    }
    else {
        Py_DECREF(r->lane);
        Py_DECREF(r->fk);
        Py_DECREF(r->call);
    }
}

static int
set_suspended(PyObject *token, PyObject *flag)
{
    if (!PyList_CheckExact(token) || PyList_GET_SIZE(token) != RESUMABLE_TOKEN_SIZE) {
        PyErr_SetString(PyExc_TypeError, "not a resumable token");
        return -1;
    }
    return PyList_SetItem(token, TOKEN_SUSPENDED, Py_NewRef(flag));
}

/* The token runs from now on: not suspended, stamped with a fresh call id (ids need only
 * be unique and increasing; see hooks._set_running), and listed as running on its lane. */
static int
set_running(PyObject *token, LaneCore *lane)
{
    PyObject *stamp;
    if (set_suspended(token, Py_False) < 0)
        return -1;
    stamp = PyLong_FromLongLong(++lane->request->calls);
    if (stamp == NULL || PyList_SetItem(token, TOKEN_STAMP, stamp) < 0)
        return -1;
    return running_push((PyObject *)lane, token);
}

/* A resumable call's exit: the calls above it on the lane are suspended first. A frame
 * still marked suspended was resumed by an exception thrown in (or by its delegate
 * returning on one) with no hook: its RESUME comes first (hooks._exit_resumable). */
static PyObject *
exit_resumable(PyObject *token, int kind)
{
    Resumable r;
    int rc;
    if (unpack(token, &r) < 0)
        return failed(Py_None);
    hold(&r, 1);
    rc = resume_thrown(r.lane, r.ns);
    if (rc == 0 && PyList_GET_ITEM(token, TOKEN_SUSPENDED) == Py_True) {
        rc = record_kind(r.lane, r.lane->record, r.fk, RESUME, r.call, r.ns);
        if (rc == 0)
            rc = set_suspended(token, Py_False);
    }
    if (rc == 0)
        rc = running_pop(r.lane, token, r.ns);
    if (rc == 0)
        rc = record_kind(r.lane, r.lane->record, r.fk, kind, r.call, r.ns);
    hold(&r, 0);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

/* suspend(token): before a plain yield */
static PyObject *
hp_suspend(PyObject *module, PyObject *token)
{
    Resumable r;
    int rc;
    if (unpack(token, &r) < 0)
        return failed(Py_None);
    hold(&r, 1);
    rc = resume_thrown(r.lane, r.ns);
    if (rc == 0 && PyList_GET_ITEM(token, TOKEN_SUSPENDED) == Py_True) {
        /* a throw() caught inside the generator resumed it without a hook */
        rc = record_kind(r.lane, r.lane->record, r.fk, RESUME, r.call, r.ns);
    }
    else if (rc == 0)
        rc = running_pop(r.lane, token, r.ns);
    if (rc == 0)
        rc = record_kind(r.lane, r.lane->record, r.fk, SUSPEND, r.call, r.ns);
    if (rc == 0)
        rc = set_suspended(token, Py_True);
    hold(&r, 0);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

/* resume(token): after a plain yield */
static PyObject *
hp_resume(PyObject *module, PyObject *token)
{
    Resumable r;
    int rc;
    if (unpack(token, &r) < 0)
        return failed(Py_None);
    hold(&r, 1);
    rc = record_kind(r.lane, r.lane->record, r.fk, RESUME, r.call, r.ns);
    if (rc == 0)
        rc = set_running(token, r.lane);
    hold(&r, 0);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

/* resume_delegated(token): after yield from / await gave control away; suspended since the
 * lane's last event unless its SUSPEND is recorded already (see hooks.resume_delegated) */
static PyObject *
hp_resume_delegated(PyObject *module, PyObject *token)
{
    Resumable r;
    int rc = 0;
    if (unpack(token, &r) < 0)
        return failed(Py_None);
    hold(&r, 1);
    if (!r.suspended) {
        long long since = since_of(r.lane, r.ns);
        rc = running_pop(r.lane, token, r.ns);
        if (rc == 0)
            rc = record_kind(r.lane, r.lane->record, r.fk, SUSPEND, r.call, since);
    }
    if (rc == 0)
        rc = record_kind(r.lane, r.lane->record, r.fk, RESUME, r.call, r.ns);
    if (rc == 0)
        rc = set_running(token, r.lane);
    hold(&r, 0);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

/* thrown(token): an exception handler of a generator or coroutine starts; a suspended frame
 * was resumed by the exception thrown in, with no hook: it runs from now (hooks.thrown) */
static PyObject *
hp_thrown(PyObject *module, PyObject *token)
{
    Resumable r;
    int rc;
    if (unpack(token, &r) < 0)
        return failed(Py_None);
    if (!r.suspended)
        Py_RETURN_NONE;
    hold(&r, 1);
    rc = resume_thrown(r.lane, r.ns);
    if (rc == 0 && PyList_GET_ITEM(token, TOKEN_SUSPENDED) == Py_True) {
        rc = record_kind(r.lane, r.lane->record, r.fk, RESUME, r.call, r.ns);
        if (rc == 0)
            rc = set_running(token, r.lane);
    }
    hold(&r, 0);
    if (rc < 0)
        return failed(Py_None);
    Py_RETURN_NONE;
}

/* ---- InLane: work handed to another thread ---------------------------------------- */

/* InLane(lane, work) runs `work` once, with CURRENT set to `lane` in the context the work
 * runs in anyway (a new thread's, a pool worker's own, the copy asyncio.to_thread or anyio
 * make), and puts CURRENT back after it: that context then holds nothing of the
 * profiler's. A C call, so the work's stack and tracebacks show no frame of ours. It lets
 * go of lane and work as it starts, so nothing it held outlives the work. */
typedef struct {
    PyObject_HEAD
    PyObject *lane; /* NULL once it ran */
    PyObject *work; /* NULL once it ran */
    vectorcallfunc vectorcall;
} InLane;

static PyObject *in_lane_call(InLane *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames);

static PyObject *
in_lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *lane, *work;
    InLane *self;
    static char *kwlist[] = {"lane", "work", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:InLane", kwlist, &lane, &work))
        return NULL;
    if (current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.configure() was not called");
        return NULL;
    }
    self = (InLane *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lane = Py_NewRef(lane);
    self->work = Py_NewRef(work);
    self->vectorcall = (vectorcallfunc)in_lane_call;
    return (PyObject *)self;
}

static int
in_lane_traverse(InLane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->lane);
    Py_VISIT(self->work);
    return 0;
}

static int
in_lane_clear(InLane *self)
{
    Py_CLEAR(self->lane);
    Py_CLEAR(self->work);
    return 0;
}

static void
in_lane_dealloc(InLane *self)
{
    PyObject_GC_UnTrack(self);
    in_lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Runs `step(arg)` once the work ended, leaving the work's own outcome (its exception, if
 * any) as the caller sees it; a step that fails is counted like a hook failure. 0, or -1
 * with a BaseException of ours set. */
static int
after_work(int (*step)(PyObject *), PyObject *arg)
{
    PyObject *outcome = PyErr_GetRaisedException(); /* NULL: the work returned */
    int rc = 0;
    if (step(arg) < 0)
        rc = swallow();
    if (rc == 0) {
        if (outcome != NULL)
            PyErr_SetRaisedException(outcome);
        return 0;
    }
    Py_XDECREF(outcome);
    return -1;
}

/* CURRENT back as it was before the work. */
static int
reset_current(PyObject *token)
{
    return PyContextVar_Reset(current_var, token);
}

/* lane.done = True: its work finished (Request.finish lists the lanes still running). */
static int
mark_done(PyObject *lane)
{
    return PyObject_SetAttrString(lane, "done", Py_True);
}

static PyObject *
in_lane_call(InLane *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *lane = self->lane, *work = self->work, *token, *result, *parent;
    PyObject *saved_lane, *saved_parent;
    if (work == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "InLane: its work ran already");
        return NULL;
    }
    self->lane = self->work = NULL; /* ours now, released as the work ends */
    token = PyContextVar_Set(current_var, lane); /* the context holds the lane from here */
    if (token == NULL && swallow() < 0) { /* else the work runs outside the lane */
        Py_DECREF(lane);
        Py_DECREF(work);
        return NULL;
    }
    parent = PyObject_GetAttrString(lane, "parent");
    if (parent == NULL && swallow() < 0) {
        Py_DECREF(lane);
        Py_DECREF(work);
        Py_XDECREF(token);
        return NULL;
    }
    saved_lane = handed_lane;
    saved_parent = handed_parent;
    handed_lane = lane;
    handed_parent = parent;
    result = PyObject_Vectorcall(work, args, nargsf, kwnames);
    handed_lane = saved_lane;
    handed_parent = saved_parent;
    Py_XDECREF(parent);
    Py_DECREF(work);
    if (token != NULL) {
        if (after_work(reset_current, token) < 0)
            Py_CLEAR(result);
        Py_DECREF(token);
    }
    if (after_work(mark_done, lane) < 0)
        Py_CLEAR(result);
    Py_DECREF(lane);
    return result;
}

static PyTypeObject InLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.InLane",
    .tp_basicsize = sizeof(InLane),
    .tp_dealloc = (destructor)in_lane_dealloc,
    .tp_vectorcall_offset = offsetof(InLane, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "InLane(lane, work): work handed to another thread, run once with CURRENT set "
              "to lane.",
    .tp_traverse = (traverseproc)in_lane_traverse,
    .tp_clear = (inquiry)in_lane_clear,
    .tp_new = in_lane_new,
};

/* ---- stand-ins for the methods propagation patches ----------------------------------
 * A class's method that `propagation` wraps is replaced by a StandIn, which calls the
 * original while the gate is closed (no sampled request in flight) with no Python frame of
 * ours, and otherwise: `gated`, the Python wrapper where the call concerns a sampled lane
 * (else the original); `handle_run` and `call_soon`, the C twins of
 * `propagation._handle_run` and `propagation._call_soon` (see there for what they do), which
 * every loop callback of every request passes through while they are in. */

static PyObject *task_type = NULL;  /* asyncio.Task */
static PyObject *on_step_cb = NULL; /* propagation._on_step(lane, task, context) */
static PyObject *gate_list = NULL;  /* hooks.ACTIVE: open while not empty */

/* The lane `context` holds (new reference, Py_None for none), or NULL with an exception. */
static PyObject *
lane_in(PyObject *context)
{
    int has;
    if (!PyContext_CheckExact(context))
        return PyObject_CallMethod(context, "get", "O", current_var);
    has = PySequence_Contains(context, current_var);
    if (has <= 0)
        return has < 0 ? NULL : Py_NewRef(Py_None);
    return PyObject_GetItem(context, current_var);
}

/* The task `callback` is a step or wakeup of (`isinstance(callback.__self__, Task)`): 1 with
 * *task a new reference, 0 when it is none, -1 with an exception. */
static int
step_task(PyObject *callback, PyObject **task)
{
    PyObject *self = NULL;
    int is;
    *task = NULL;
    if (PyCFunction_Check(callback))
        self = Py_XNewRef(PyCFunction_GET_SELF(callback));
    else if (PyMethod_Check(callback))
        self = Py_NewRef(PyMethod_GET_SELF(callback));
    else if (!PyFunction_Check(callback) &&
             PyObject_GetOptionalAttr(callback, self_str, &self) < 0)
        return -1;
    if (self == NULL)
        return 0;
    is = PyObject_IsInstance(self, task_type);
    if (is > 0)
        *task = self;
    else
        Py_DECREF(self);
    return is;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original; /* the function it stands in for */
    PyObject *wrapper;  /* `gated`: what runs while the gate is open; else NULL */
} StandIn;

static int
gate_open(void)
{
    return gate_list != NULL && PyList_GET_SIZE(gate_list) > 0;
}

/* The `context=` keyword of a call (borrowed), or NULL when it has none or None. */
static PyObject *
context_keyword(PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), k;
    if (kwnames == NULL)
        return NULL;
    for (k = 0; k < PyTuple_GET_SIZE(kwnames); k++)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), "context") == 0)
            return args[nargs + k] == Py_None ? NULL : args[nargs + k];
    return NULL;
}

/* The wrapper only for a call that concerns a sampled lane: its `context=` holds one, or,
 * without a context, the caller's does (what `propagation._laneless` tests first). Every
 * other call goes to the original with no Python frame, also while the gate is open, so a
 * request not sampled pays one ContextVar read while another is in flight. A lane that
 * cannot be read (a context that is not one) leaves the call to the wrapper. */
static PyObject *
gated(StandIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *target = self->original, *context, *lane = NULL;
    if (gate_open()) {
        context = context_keyword(args, nargsf, kwnames);
        if (context != NULL)
            lane = lane_in(context);
        else if (PyContextVar_Get(current_var, Py_None, &lane) < 0)
            lane = NULL;
        if (lane == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return NULL;
            PyErr_Clear();
            target = self->wrapper;
        } else {
            if (lane != Py_None)
                target = self->wrapper;
            Py_DECREF(lane);
        }
    }
    return PyObject_Vectorcall(target, args, nargsf, kwnames);
}

static PyTypeObject StandInType;

/* Sets CURRENT to `value` in `context`, which is not entered: the token, or NULL. */
static PyObject *
set_in(PyObject *context, PyObject *value)
{
    PyObject *token;
    if (PyContext_Enter(context) < 0)
        return NULL;
    token = PyContextVar_Set(current_var, value);
    if (PyContext_Exit(context) < 0)
        Py_CLEAR(token);
    return token;
}

static PyObject *reset_context = NULL; /* the context `reset_in` works in */

static int
reset_in(PyObject *token)
{
    int rc;
    if (PyContext_Enter(reset_context) < 0)
        return -1;
    rc = PyContextVar_Reset(current_var, token);
    if (PyContext_Exit(reset_context) < 0)
        rc = -1;
    return rc;
}

/* Handle._run(handle): a callback that is not a task's step, scheduled in a sampled lane,
 * runs with no lane in that same context (its calls would nest under suspended frames). */
static PyObject *
handle_run(StandIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *context = NULL, *lane = NULL, *callback = NULL, *task = NULL, *token = NULL;
    PyObject *result;
    int step;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL || !gate_open())
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    context = PyObject_GetAttr(args[0], context_str);
    if (context != NULL && context != Py_None)
        lane = lane_in(context);
    if (lane != NULL && lane != Py_None) {
        callback = PyObject_GetAttr(args[0], callback_str);
        step = callback == NULL ? -1 : step_task(callback, &task);
        if (step == 0)
            token = set_in(context, Py_None);
        else if (step > 0)
            Py_DECREF(task);
        Py_XDECREF(callback);
    }
    Py_XDECREF(lane);
    if (PyErr_Occurred() && swallow() < 0) { /* else it runs as it would plainly */
        Py_XDECREF(context);
        Py_XDECREF(token);
        return NULL;
    }
    result = PyObject_Vectorcall(self->original, args, nargsf, NULL);
    if (token != NULL) {
        reset_context = context;
        if (after_work(reset_in, token) < 0)
            Py_CLEAR(result);
        reset_context = NULL;
        Py_DECREF(token);
    }
    Py_XDECREF(context);
    return result;
}

/* loop.call_soon(callback, *args, context=None): a task's step scheduled in a sampled lane
 * marks the task's coroutines ready from now on. */
static PyObject *
call_soon(StandIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context = NULL, *lane, *task, *done;
    int step;
    if (nargs >= 2 && gate_open())
        context = context_keyword(args, nargsf, kwnames);
    if (context != NULL) {
        lane = lane_in(context);
        if (lane != NULL && lane != Py_None) {
            step = step_task(args[1], &task);
            if (step > 0) {
                done = PyObject_CallFunctionObjArgs(on_step_cb, lane, task, context, NULL);
                Py_XDECREF(done);
                Py_DECREF(task);
            }
        }
        Py_XDECREF(lane);
        if (PyErr_Occurred() && swallow() < 0)
            return NULL;
    }
    return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
}

static PyObject *
stand_in_make(PyObject *original, PyObject *wrapper, vectorcallfunc call)
{
    StandIn *self;
    if (task_type == NULL || on_step_cb == NULL || current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.configure_loop() was not called");
        return NULL;
    }
    self = PyObject_GC_New(StandIn, &StandInType);
    if (self == NULL)
        return NULL;
    self->vectorcall = call;
    self->original = Py_NewRef(original);
    self->wrapper = Py_XNewRef(wrapper);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
hp_handle_run(PyObject *module, PyObject *original)
{
    return stand_in_make(original, NULL, (vectorcallfunc)handle_run);
}

static PyObject *
hp_call_soon(PyObject *module, PyObject *original)
{
    return stand_in_make(original, NULL, (vectorcallfunc)call_soon);
}

/* gated(original, wrapper) */
static PyObject *
hp_gated(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("gated", nargs, 2) < 0)
        return NULL;
    return stand_in_make(args[0], args[1], (vectorcallfunc)gated);
}

/* configure_loop(task_type, on_step, gate) */
static PyObject *
hp_configure_loop(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("configure_loop", nargs, 3) < 0)
        return NULL;
    if (!PyType_Check(args[0]) || !PyCallable_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "configure_loop(task_type, on_step, gate: list)");
        return NULL;
    }
    Py_XSETREF(task_type, Py_NewRef(args[0]));
    Py_XSETREF(on_step_cb, Py_NewRef(args[1]));
    Py_XSETREF(gate_list, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* As a class attribute it is a method: bound to the instance it is read from. */
static PyObject *
stand_in_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* Its name, docs and the rest are the original's (`functools.wraps`). */
static PyObject *
stand_in_getattro(StandIn *self, PyObject *name)
{
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return found;
    PyErr_Clear();
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
        return Py_NewRef(self->original);
    return PyObject_GetAttr(self->original, name);
}

static int
stand_in_traverse(StandIn *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->wrapper);
    return 0;
}

static int
stand_in_clear(StandIn *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->wrapper);
    return 0;
}

static void
stand_in_dealloc(StandIn *self)
{
    PyObject_GC_UnTrack(self);
    stand_in_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject StandInType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._hotpath.StandIn",
    .tp_basicsize = sizeof(StandIn),
    .tp_dealloc = (destructor)stand_in_dealloc,
    .tp_vectorcall_offset = offsetof(StandIn, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = (getattrofunc)stand_in_getattro,
    .tp_descr_get = stand_in_get,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A method propagation wraps: the original while no sampled request is in "
              "flight (gated, handle_run, call_soon).",
    .tp_traverse = (traverseproc)stand_in_traverse,
    .tp_clear = (inquiry)stand_in_clear,
};

/* Writes `value` as a protobuf varint at `at`; returns the end. */
static char *
put_varint(char *at, unsigned long long value)
{
    while (value > 0x7F) {
        *at++ = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    *at++ = (char)value;
    return at;
}

/* Makes room for `extra` more bytes after the `used` ones of bytearray `out`; returns where
 * they start, or NULL with an exception set. */
static char *
reserve(PyObject *out, Py_ssize_t used, Py_ssize_t extra)
{
    if (PyByteArray_Resize(out, used + extra) < 0)
        return NULL;
    return PyByteArray_AS_STRING(out) + used;
}

/* Cuts bytearray `out` back to where `end` points. */
static int
settle(PyObject *out, const char *end)
{
    return PyByteArray_Resize(out, end - PyByteArray_AS_STRING(out));
}

/* pack(buffer, start, stop, previous_ns, kinds, functions, calls, deltas) -> (first, last):
 * the wire's columns of buffer[start:stop] appended to four bytearrays as the payloads of
 * `Events` fields: one kind byte per event, packed varints of function ids and call ids,
 * packed zigzag varints of ns minus the previous event's (`previous_ns` for the first; None:
 * the first event's own ns, so its delta is 0). Returns the first and last event's ns. */
static PyObject *
hp_pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *buffer, *out[4];
    char *kind, *function, *call_at, *delta_at;
    Py_ssize_t start, stop, i, n, used[4];
    long long previous = 0, first = 0, last = 0;
    int have_previous, k;
    if (check_nargs("pack", nargs, 8) < 0)
        return NULL;
    buffer = args[0];
    if (!EventBuffer_Check(buffer)) {
        PyErr_SetString(PyExc_TypeError, "pack() needs an EventBuffer");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    stop = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || stop == -1) && PyErr_Occurred())
        return NULL;
    if (start < 0 || stop > ((EventBuffer *)buffer)->size || stop < start ||
        (stop - start) % EVENT_INTS != 0) {
        PyErr_SetString(PyExc_ValueError, "pack(): not whole events of the buffer");
        return NULL;
    }
    for (k = 0; k < 4; k++) {
        out[k] = args[4 + k];
        if (!PyByteArray_Check(out[k])) {
            PyErr_SetString(PyExc_TypeError, "pack(): the columns go to bytearrays");
            return NULL;
        }
    }
    have_previous = args[3] != Py_None;
    if (have_previous) {
        previous = as_int64(args[3]);
        if (previous == -1 && PyErr_Occurred())
            return NULL;
    }
    for (k = 0; k < 4; k++)
        used[k] = PyByteArray_GET_SIZE(out[k]);
    n = (stop - start) / EVENT_INTS;
    /* at most 1 kind byte, and 10 bytes for each varint */
    kind = reserve(out[0], used[0], n);
    function = kind ? reserve(out[1], used[1], 10 * n) : NULL;
    call_at = function ? reserve(out[2], used[2], 10 * n) : NULL;
    delta_at = call_at ? reserve(out[3], used[3], 10 * n) : NULL;
    if (delta_at == NULL)
        goto fail;
    for (i = 0; i < n; i++) {
        const long long *event = ((EventBuffer *)buffer)->items + start + EVENT_INTS * i;
        long long packed = event[0], call = event[1], ns = event[2];
        unsigned long long delta;
        if (packed < 0 || call < 0) {
            PyErr_SetString(PyExc_ValueError, "pack(): a negative function or call id");
            goto fail;
        }
        if (i == 0) {
            first = ns;
            if (!have_previous)
                previous = ns;
        }
        delta = (unsigned long long)ns - (unsigned long long)previous;
        previous = last = ns;
        *kind++ = (char)(packed & ((1 << KIND_BITS) - 1));
        function = put_varint(function, (unsigned long long)(packed >> KIND_BITS));
        call_at = put_varint(call_at, (unsigned long long)call);
        /* zigzag: sint64 */
        delta_at = put_varint(delta_at, (delta << 1) ^ (0 - (delta >> 63)));
    }
    if (settle(out[1], function) < 0 || settle(out[2], call_at) < 0 ||
        settle(out[3], delta_at) < 0)
        goto fail;
    return Py_BuildValue("(LL)", first, last);
fail: { /* nothing half-written stays */
        PyObject *exc = PyErr_GetRaisedException();
        for (k = 0; k < 4; k++)
            if (PyByteArray_GET_SIZE(out[k]) > used[k] && PyByteArray_Resize(out[k], used[k]) < 0)
                PyErr_Clear();
        PyErr_SetRaisedException(exc);
    }
    return NULL;
}

/* configure(own_lane, failed, running, current): the Python parts the hooks call back into */
static PyObject *
hp_configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("configure", nargs, 4) < 0)
        return NULL;
    if (!PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyContextVar_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(own_lane, failed, running: dict, current: ContextVar)");
        return NULL;
    }
    Py_XSETREF(own_lane_cb, Py_NewRef(args[0]));
    Py_XSETREF(failed_cb, Py_NewRef(args[1]));
    Py_XSETREF(running, Py_NewRef(args[2]));
    Py_XSETREF(current_var, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"enter", hp_enter, METH_O, "enter(fid) -> token, or None outside a sampled request"},
    {"enter_resumable", hp_enter_resumable, METH_O,
     "enter_resumable(fid) -> token, or None outside a sampled request"},
    {"exit", hp_exit, METH_O, "exit(token)"},
    {"exit_resumable", hp_exit_resumable, METH_O, "exit_resumable(token)"},
    {"exit_exception", (PyCFunction)(void (*)(void))hp_exit_exception, METH_FASTCALL,
     "exit_exception(token, exc)"},
    {"suspend", hp_suspend, METH_O, "suspend(token): before a plain yield"},
    {"resume", hp_resume, METH_O, "resume(token): after a plain yield"},
    {"resume_delegated", hp_resume_delegated, METH_O,
     "resume_delegated(token): after yield from / await"},
    {"thrown", hp_thrown, METH_O,
     "thrown(token): an exception handler of a generator or coroutine starts"},
    {"pack", (PyCFunction)(void (*)(void))hp_pack, METH_FASTCALL,
     "pack(buffer, start, stop, previous_ns, kinds, functions, calls, deltas) -> (first, last)"},
    {"configure", (PyCFunction)(void (*)(void))hp_configure, METH_FASTCALL,
     "configure(own_lane, failed, running, current)"},
    {"configure_loop", (PyCFunction)(void (*)(void))hp_configure_loop, METH_FASTCALL,
     "configure_loop(task_type, on_step, gate)"},
    {"handle_run", hp_handle_run, METH_O, "handle_run(original) -> Handle._run's stand-in"},
    {"call_soon", hp_call_soon, METH_O,
     "call_soon(original) -> BaseEventLoop.call_soon's stand-in"},
    {"gated", (PyCFunction)(void (*)(void))hp_gated, METH_FASTCALL,
     "gated(original, wrapper) -> wrapper where a call concerns a sampled lane, else original"},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._hotpath",
    .m_doc = "The hooks' hot path in C (see profiler_host.hooks).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *module;
    size_t i;
    if (PyType_Ready(&RequestCoreType) < 0 || PyType_Ready(&CallsType) < 0 ||
        PyType_Ready(&LaneCoreType) < 0 || PyType_Ready(&InLaneType) < 0 ||
        PyType_Ready(&StandInType) < 0 || PyType_Ready(&EventBufferType) < 0 ||
        PyType_Ready(&CallTokenType) < 0)
        return NULL;
    cancelled_module = PyUnicode_InternFromString("asyncio.exceptions");
    context_str = PyUnicode_InternFromString("_context");
    callback_str = PyUnicode_InternFromString("_callback");
    self_str = PyUnicode_InternFromString("__self__");
    if (cancelled_module == NULL || context_str == NULL || callback_str == NULL ||
        self_str == NULL)
        return NULL;
    module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RequestCore", (PyObject *)&RequestCoreType) < 0 ||
        PyModule_AddObjectRef(module, "LaneCore", (PyObject *)&LaneCoreType) < 0 ||
        PyModule_AddObjectRef(module, "InLane", (PyObject *)&InLaneType) < 0 ||
        PyModule_AddObjectRef(module, "EventBuffer", (PyObject *)&EventBufferType) < 0 ||
        PyModule_AddObjectRef(module, "CallToken", (PyObject *)&CallTokenType) < 0)
        goto fail;
    for (i = 0; events_constants[i].name != NULL; i++) {
        const char *name = events_constants[i].name;
        if (PyModule_AddIntConstant(module, name, events_constants[i].value) < 0)
            goto fail;
    }
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}
