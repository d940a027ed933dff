/* Every request's count in C (profiler_host._counts.CountTable).
 *
 * Every request the middleware sees is counted, sampled or not, so this runs once per
 * request of the app: in Python the table costs about ten thousand instructions a request
 * (a tuple, a bucket search, a dict and list updates); here it is one dict lookup and a
 * few adds. It is the twin of `profiler_host.request_counts.CountTable` (tests compare
 * the two on random requests); every bound and the bucket bounds come from that module, so
 * they are written once.
 *
 * An `add` runs under the GIL from start to end: it calls no Python code while it changes
 * the table (keys are exact str and int, whose hash and comparison are C's), so an app
 * thread's add and the transport thread's take never interleave. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_compat.h"

#define CLASSES 6 /* status classes: 0 (none or out of range), 1xx .. 5xx */

typedef struct {
    PyObject_HEAD
    int64_t *bounds;      /* inclusive upper bounds of the buckets but the last, ascending */
    Py_ssize_t nbounds;
    Py_ssize_t width;     /* int64s per entry: count, duration sum, one count per bucket */
    Py_ssize_t max_routes;
    Py_ssize_t max_route_chars;
    Py_ssize_t max_methods;
    Py_ssize_t max_method_chars;
    PyObject *other;      /* the name of what is past a bound */
    PyObject *wake;       /* called by the first add after the transport set `waiting` */
    PyObject *routes;     /* set: routes admitted (for the process' life) */
    PyObject *methods;    /* set: methods admitted */
    PyObject *classes[CLASSES];
    PyObject *index;      /* dict: (route, method, class) -> entry number since the last take */
    int64_t *entries;     /* `used` entries of `width` int64s */
    Py_ssize_t used;
    Py_ssize_t capacity;
    int waiting;
    unsigned long long lost; /* requests not counted: no memory for them */
    /* the last request's key as it came (exact str) and its entry: an endpoint's requests
     * mostly follow each other, and then no key is built nor looked up */
    PyObject *last_route;
    PyObject *last_method;
    int last_class;
    Py_ssize_t last_at; /* -1: none since the last take */
} CountTable;

static int
table_traverse(CountTable *self, visitproc visit, void *arg)
{
    Py_VISIT(self->other);
    Py_VISIT(self->wake);
    Py_VISIT(self->routes);
    Py_VISIT(self->methods);
    Py_VISIT(self->index);
    return 0;
}

static void
forget_last(CountTable *self)
{
    Py_CLEAR(self->last_route);
    Py_CLEAR(self->last_method);
    self->last_at = -1;
}

static int
table_clear(CountTable *self)
{
    forget_last(self);
    Py_CLEAR(self->other);
    Py_CLEAR(self->wake);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->methods);
    Py_CLEAR(self->index);
    for (int i = 0; i < CLASSES; i++)
        Py_CLEAR(self->classes[i]);
    return 0;
}

static void
table_dealloc(CountTable *self)
{
    PyObject_GC_UnTrack(self);
    table_clear(self);
    PyMem_Free(self->bounds);
    PyMem_Free(self->entries);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
table_init(CountTable *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"bounds", "max_routes", "max_route_chars", "max_methods",
                               "max_method_chars", "other", "wake", NULL};
    PyObject *bounds, *other, *wake, *seq;
    Py_ssize_t max_routes, max_route_chars, max_methods, max_method_chars;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnnnUO", keywords, &bounds, &max_routes,
                                     &max_route_chars, &max_methods, &max_method_chars,
                                     &other, &wake))
        return -1;
    if (self->index != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CountTable is initialised once");
        return -1;
    }
    seq = PySequence_Fast(bounds, "bounds must be a sequence of ints");
    if (seq == NULL)
        return -1;
    self->nbounds = PySequence_Fast_GET_SIZE(seq);
    self->bounds = PyMem_Calloc(self->nbounds ? self->nbounds : 1, sizeof(int64_t));
    if (self->bounds == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->nbounds; i++) {
        self->bounds[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (self->bounds[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    self->width = 2 + self->nbounds + 1;
    self->max_routes = max_routes;
    self->max_route_chars = max_route_chars;
    self->max_methods = max_methods;
    self->max_method_chars = max_method_chars;
    self->other = Py_NewRef(other);
    self->wake = Py_NewRef(wake);
    self->routes = PySet_New(NULL);
    self->methods = PySet_New(NULL);
    self->index = PyDict_New();
    if (self->routes == NULL || self->methods == NULL || self->index == NULL)
        return -1;
    for (int i = 0; i < CLASSES; i++) {
        self->classes[i] = PyLong_FromLong(i);
        if (self->classes[i] == NULL)
            return -1;
    }
    self->waiting = 1;
    self->last_at = -1;
    return 0;
}

/* `name` if it is admitted or can be (a new reference), else `other`: exact str only, so
 * nothing but C runs while the table changes (a str subclass is copied to a str). */
static PyObject *
admitted(CountTable *self, PyObject *name, PyObject *seen, Py_ssize_t max_count,
         Py_ssize_t max_chars)
{
    PyObject *exact;
    int found;
    if (!PyUnicode_Check(name))
        return Py_NewRef(self->other);
    exact = PyUnicode_CheckExact(name) ? Py_NewRef(name) : PyUnicode_FromObject(name);
    if (exact == NULL)
        return NULL;
    found = PySet_Contains(seen, exact);
    if (found == 1)
        return exact;
    if (found == 0 && PySet_GET_SIZE(seen) < max_count &&
        PyUnicode_GET_LENGTH(exact) <= max_chars) {
        if (PySet_Add(seen, exact) == 0)
            return exact;
    }
    Py_DECREF(exact);
    return found < 0 || PyErr_Occurred() ? NULL : Py_NewRef(self->other);
}

/* The entry of (route, method, class), made when new; NULL with an error set. */
static int64_t *
entry_of(CountTable *self, PyObject *route, PyObject *method, int status_class)
{
    PyObject *key, *number;
    Py_ssize_t at;
    key = PyTuple_Pack(3, route, method, self->classes[status_class]);
    if (key == NULL)
        return NULL;
    number = PyDict_GetItemWithError(self->index, key);
    if (number != NULL) {
        Py_DECREF(key);
        at = PyLong_AsSsize_t(number);
        return at < 0 ? NULL : self->entries + at * self->width;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    if (self->used == self->capacity) {
        Py_ssize_t capacity = self->capacity ? 2 * self->capacity : 16;
        int64_t *grown = PyMem_Realloc(self->entries,
                                       (size_t)(capacity * self->width) * sizeof(int64_t));
        if (grown == NULL) {
            Py_DECREF(key);
            PyErr_NoMemory();
            return NULL;
        }
        self->entries = grown;
        self->capacity = capacity;
    }
    number = PyLong_FromSsize_t(self->used);
    if (number == NULL || PyDict_SetItem(self->index, key, number) < 0) {
        Py_XDECREF(number);
        Py_DECREF(key);
        return NULL;
    }
    Py_DECREF(number);
    Py_DECREF(key);
    memset(self->entries + self->used * self->width, 0, (size_t)self->width * sizeof(int64_t));
    return self->entries + self->used++ * self->width;
}

static Py_ssize_t
bucket_of(CountTable *self, int64_t duration_ns)
{
    /* the first bucket whose inclusive upper bound the duration does not pass (bisect_left) */
    Py_ssize_t low = 0, high = self->nbounds;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (self->bounds[middle] < duration_ns)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* A WSGI status line's code (request_counts.status_of): its leading ASCII digits up to a
 * space or the end, 1 to 9 of them; else 0. */
static int
status_line_code(PyObject *line, long long *status)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(line), i;
    int kind = PyUnicode_KIND(line);
    const void *data = PyUnicode_DATA(line);
    long long code = 0;
    for (i = 0; i < length; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == ' ')
            break;
        if (c < '0' || c > '9' || i >= 9) {
            *status = 0;
            return 0;
        }
        code = code * 10 + (c - '0');
    }
    *status = i > 0 ? code : 0;
    return 0;
}

/* str `text` holds what str `other` does (C's comparison: no Python code runs); the same
 * object or another length answer at once */
static int
equal_text(PyObject *text, PyObject *other)
{
    return text == other || (PyUnicode_GET_LENGTH(text) == PyUnicode_GET_LENGTH(other) &&
                             PyUnicode_Compare(text, other) == 0);
}

/* `name` is the exact str `last` holds */
static int
same_name(PyObject *name, PyObject *last)
{
    return name == last || (PyUnicode_CheckExact(name) && equal_text(name, last));
}

static int
count(CountTable *self, PyObject *const *args)
{
    PyObject *route, *method;
    long long status, duration_ns;
    int overflow, status_class;
    int64_t *entry;
    if (PyUnicode_Check(args[2])) {
        if (status_line_code(args[2], &status) < 0)
            return -1;
        overflow = 0;
    }
    else {
        status = PyLong_AsLongLongAndOverflow(args[2], &overflow);
        if (status == -1 && PyErr_Occurred())
            return -1;
    }
    status_class = !overflow && status >= 100 && status < 600 ? (int)(status / 100) : 0;
    duration_ns = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (duration_ns == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        duration_ns = overflow > 0 ? INT64_MAX : 0;
    if (self->last_at >= 0 && status_class == self->last_class &&
        same_name(args[0], self->last_route) && same_name(args[1], self->last_method)) {
        entry = self->entries + self->last_at * self->width;
        goto add;
    }
    route = admitted(self, args[0], self->routes, self->max_routes, self->max_route_chars);
    if (route == NULL)
        return -1;
    method = admitted(self, args[1], self->methods, self->max_methods, self->max_method_chars);
    if (method == NULL) {
        Py_DECREF(route);
        return -1;
    }
    entry = entry_of(self, route, method, status_class);
    Py_DECREF(route);
    Py_DECREF(method);
    if (entry == NULL)
        return -1;
    if (PyUnicode_CheckExact(args[0]) && PyUnicode_CheckExact(args[1])) {
        Py_XSETREF(self->last_route, Py_NewRef(args[0]));
        Py_XSETREF(self->last_method, Py_NewRef(args[1]));
        self->last_class = status_class;
        self->last_at = (entry - self->entries) / self->width;
    }
add:
    entry[0] += 1;
    if (duration_ns > 0) /* the sum stops at INT64_MAX (request_counts.SUM_LIMIT) */
        entry[1] = entry[1] > INT64_MAX - duration_ns ? INT64_MAX : entry[1] + duration_ns;
    entry[2 + bucket_of(self, duration_ns)] += 1;
    return 0;
}

/* One request ended: counted, or lost and counted as lost; the first after the transport
 * set `waiting` wakes it. Never raises. */
static void
added(CountTable *self, PyObject *const *args)
{
    if (count(self, args) < 0) {
        PyErr_Clear();
        self->lost++;
    }
    if (self->waiting) {
        PyObject *result;
        self->waiting = 0;
        result = PyObject_CallNoArgs(self->wake);
        if (result == NULL)
            PyErr_WriteUnraisable(self->wake);
        Py_XDECREF(result);
    }
}

static PyObject *
table_add(CountTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "add(route, method, status, duration_ns)");
        return NULL;
    }
    if (self->index == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CountTable is not initialised");
        return NULL;
    }
    added(self, args);
    Py_RETURN_NONE;
}

/* --- Counted: a request that is not sampled, timed and counted ----------------------------
 *
 * What a middleware hands the app in place of WSGI's `start_response` or ASGI's `send`: it
 * passes every call through unchanged, keeps the response's status (and, for WSGI, the
 * route, read from the environ by `route_of` as the response starts: Flask forgets it
 * afterwards), and `end` adds the request to the table. Twin of
 * `request_counts.Counted`. */

typedef struct {
    PyObject_HEAD
    CountTable *table;
    PyObject *target;   /* start_response or send */
    PyObject *path;     /* the route when none is known */
    PyObject *method;
    PyObject *environ;  /* WSGI: what route_of reads; NULL for ASGI */
    PyObject *route_of;
    PyObject *route;    /* NULL: none known yet */
    PyObject *status;   /* an int or a status line; NULL: no response started */
    vectorcallfunc vectorcall; /* called as the app calls start_response or send */
    int64_t started_ns;
    int failed;
    int ended;
} Counted;

static PyTypeObject CountedType;
static PyObject *counted_call(Counted *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames);
static PyObject *HTTP_RESPONSE_START, *WEBSOCKET_ACCEPT, *TYPE_KEY, *STATUS_KEY, *ZERO,
    *SWITCHING, *INTERNAL_ERROR;

static int64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns's clock */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int
counted_traverse(Counted *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->target);
    Py_VISIT(self->path);
    Py_VISIT(self->method);
    Py_VISIT(self->environ);
    Py_VISIT(self->route_of);
    Py_VISIT(self->route);
    Py_VISIT(self->status);
    return 0;
}

static int
counted_clear(Counted *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->target);
    Py_CLEAR(self->path);
    Py_CLEAR(self->method);
    Py_CLEAR(self->environ);
    Py_CLEAR(self->route_of);
    Py_CLEAR(self->route);
    Py_CLEAR(self->status);
    return 0;
}

static void
counted_dealloc(Counted *self)
{
    PyObject_GC_UnTrack(self);
    counted_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* table.counted(target, path, method, environ=None, route_of=None): the clock starts */
static PyObject *
table_counted(CountTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    Counted *counted;
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "counted(target, path, method, environ=None, route_of=None)");
        return NULL;
    }
    counted = PyObject_GC_New(Counted, &CountedType);
    if (counted == NULL)
        return NULL;
    counted->table = (CountTable *)Py_NewRef(self);
    counted->target = Py_NewRef(args[0]);
    counted->path = Py_NewRef(args[1]);
    counted->method = Py_NewRef(args[2]);
    counted->environ = nargs >= 4 && args[3] != Py_None ? Py_NewRef(args[3]) : NULL;
    counted->route_of = nargs == 5 && args[4] != Py_None ? Py_NewRef(args[4]) : NULL;
    counted->route = NULL;
    counted->status = NULL;
    counted->failed = counted->ended = 0;
    counted->vectorcall = (vectorcallfunc)counted_call;
    counted->started_ns = monotonic_ns();
    PyObject_GC_Track(counted);
    return (PyObject *)counted;
}

/* WSGI: (status, headers[, exc_info]); ASGI: (message). Passed through as given, by
 * vectorcall: no argument tuple is built on the way. */
static PyObject *
counted_call(Counted *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->environ != NULL) {
        if (nargs >= 1) {
            Py_XSETREF(self->status, Py_NewRef(args[0]));
            if (self->route_of != NULL) {
                /* the app's response goes on whatever reading the route does */
                PyObject *route = PyObject_CallOneArg(self->route_of, self->environ);
                if (route == NULL)
                    PyErr_Clear();
                else if (route == Py_None)
                    Py_DECREF(route);
                else
                    Py_XSETREF(self->route, route);
            }
        }
    }
    else if ((self->status == NULL || self->status == Py_None) && nargs == 1 &&
             kwnames == NULL && PyDict_Check(args[0])) {
        /* until the response starts: what follows it cannot change its status */
        PyObject *kind = PyDict_GetItemWithError(args[0], TYPE_KEY);
        if (kind != NULL && PyUnicode_Check(kind)) {
            if (equal_text(kind, HTTP_RESPONSE_START)) {
                PyObject *status = PyDict_GetItemWithError(args[0], STATUS_KEY);
                Py_XSETREF(self->status, Py_NewRef(status != NULL ? status : ZERO));
            }
            else if (equal_text(kind, WEBSOCKET_ACCEPT))
                Py_XSETREF(self->status, Py_NewRef(SWITCHING));
        }
        if (PyErr_Occurred())
            PyErr_Clear(); /* a key whose hash or comparison failed: the app's send sees it */
    }
    return PyObject_Vectorcall(self->target, args, nargsf, kwnames);
}

static PyObject *
counted_fail(Counted *self, PyObject *Py_UNUSED(ignored))
{
    self->failed = 1;
    Py_RETURN_NONE;
}

/* end(route=None): counts the request once (never raises) */
static PyObject *
counted_end(Counted *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fields[4], *duration;
    if (self->ended)
        Py_RETURN_NONE;
    self->ended = 1;
    duration = PyLong_FromLongLong(monotonic_ns() - self->started_ns);
    if (duration == NULL) {
        PyErr_Clear();
        self->table->lost++;
        Py_RETURN_NONE;
    }
    fields[0] = nargs >= 1 && args[0] != Py_None ? args[0]
                : self->route != NULL          ? self->route
                                               : self->path;
    fields[1] = self->method;
    fields[2] = self->status != NULL ? self->status : self->failed ? INTERNAL_ERROR : ZERO;
    fields[3] = duration;
    added(self->table, fields);
    Py_DECREF(duration);
    Py_RETURN_NONE;
}

static PyObject *counted_run(Counted *self, PyObject *const *args, Py_ssize_t nargs);

static PyMethodDef counted_methods[] = {
    {"fail", (PyCFunction)counted_fail, METH_NOARGS,
     "fail(): the app raised (500 unless a response started)"},
    {"end", (PyCFunction)(void (*)(void))counted_end, METH_FASTCALL,
     "end(route=None): the request ended; counts it once"},
    {"run", (PyCFunction)(void (*)(void))counted_run, METH_FASTCALL,
     "run(app, scope, receive, route_of) -> Awaiting: the ASGI request, counted when the "
     "app's awaitable ends"},
    {NULL},
};

static PyTypeObject CountedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._counts.Counted",
    .tp_basicsize = sizeof(Counted),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A request that is not sampled, timed and counted (CountTable.counted).",
    .tp_dealloc = (destructor)counted_dealloc,
    .tp_traverse = (traverseproc)counted_traverse,
    .tp_clear = (inquiry)counted_clear,
    .tp_vectorcall_offset = offsetof(Counted, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_methods = counted_methods,
};

/* --- Awaiting: an ASGI request that is not sampled, as its server awaits it --------------
 *
 * `counted.run(app, scope, receive, route_of)` is what the ASGI middleware returns for a
 * request that is not sampled: an awaitable with no Python frame, which calls
 * `app(scope, receive, counted)` when it is first stepped and passes every step through to
 * the app's awaitable (send, throw, close). When the app's awaitable ends it adds the
 * request to the table, with the route `route_of(scope)` reads then: on a return, as it
 * stands; on an exception (a cancellation, a close), as failed. A Python coroutine around
 * the app costs a frame, a coroutine object and a resume per step; this costs one object.
 * Twin of `request_counts.Counted.run` (an `async def`): it behaves as that coroutine
 * does, and tests compare the two. */

/* Where it is is what it holds: `app` (and `receive`) until it is first stepped, `inner`
 * while the app's awaitable runs, neither once it has ended. */
typedef struct {
    PyObject_HEAD
    Counted *counted;
    PyObject *app;
    PyObject *scope;
    PyObject *receive;
    PyObject *route_of;
    PyObject *inner;    /* the app's awaitable's iterator */
    int executing;      /* a step is in progress (re-entering it is an error, as for a coroutine) */
} Awaiting;

static PyTypeObject AwaitingType;
static PyObject *THROW_NAME, *CLOSE_NAME;

static int
awaiting_traverse(Awaiting *self, visitproc visit, void *arg)
{
    Py_VISIT(self->counted);
    Py_VISIT(self->app);
    Py_VISIT(self->scope);
    Py_VISIT(self->receive);
    Py_VISIT(self->route_of);
    Py_VISIT(self->inner);
    return 0;
}

/* ended: what it held to run the app goes */
static void
awaiting_forget(Awaiting *self)
{
    Py_CLEAR(self->app);
    Py_CLEAR(self->receive);
    Py_CLEAR(self->inner);
}

static int
awaiting_clear(Awaiting *self)
{
    awaiting_forget(self);
    Py_CLEAR(self->counted);
    Py_CLEAR(self->scope);
    Py_CLEAR(self->route_of);
    return 0;
}

/* counted.run(app, scope, receive, route_of) -> Awaiting */
static PyObject *
counted_run(Counted *self, PyObject *const *args, Py_ssize_t nargs)
{
    Awaiting *awaiting;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run(app, scope, receive, route_of)");
        return NULL;
    }
    awaiting = PyObject_GC_New(Awaiting, &AwaitingType);
    if (awaiting == NULL)
        return NULL;
    awaiting->counted = (Counted *)Py_NewRef(self);
    awaiting->app = Py_NewRef(args[0]);
    awaiting->scope = Py_NewRef(args[1]);
    awaiting->receive = Py_NewRef(args[2]);
    awaiting->route_of = Py_NewRef(args[3]);
    awaiting->inner = NULL;
    awaiting->executing = 0;
    PyObject_GC_Track(awaiting);
    return (PyObject *)awaiting;
}

/* The app's awaitable ended (failed: with an exception, which stays set): the request is
 * counted under the route read now. Nothing here raises: the app's outcome stands. */
static void
awaiting_finish(Awaiting *self, int failed)
{
    PyObject *exc = PyErr_GetRaisedException(), *route;
    if (failed)
        self->counted->failed = 1;
    route = PyObject_CallOneArg(self->route_of, self->scope);
    if (route == NULL)
        PyErr_Clear();
    Py_XDECREF(counted_end(self->counted, route != NULL ? &route : NULL, route != NULL));
    Py_XDECREF(route);
    awaiting_forget(self);
    PyErr_SetRaisedException(exc);
}

/* Calls the app and takes its awaitable's iterator (as `await` does). */
static int
awaiting_start(Awaiting *self)
{
    PyObject *call[3] = {self->scope, self->receive, (PyObject *)self->counted};
    PyObject *awaitable = PyObject_Vectorcall(self->app, call, 3, NULL), *iterator;
    unaryfunc getter;
    Py_CLEAR(self->app);
    Py_CLEAR(self->receive);
    if (awaitable == NULL)
        return -1;
    if (PyCoro_CheckExact(awaitable)) {
        self->inner = awaitable;
        return 0;
    }
    getter = Py_TYPE(awaitable)->tp_as_async != NULL ? Py_TYPE(awaitable)->tp_as_async->am_await
                                                      : NULL;
    if (getter == NULL) {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression",
                     Py_TYPE(awaitable)->tp_name);
        Py_DECREF(awaitable);
        return -1;
    }
    iterator = getter(awaitable);
    Py_DECREF(awaitable);
    if (iterator == NULL)
        return -1;
    if (!PyIter_Check(iterator)) {
        PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'",
                     Py_TYPE(iterator)->tp_name);
        Py_DECREF(iterator);
        return -1;
    }
    self->inner = iterator;
    return 0;
}

static int
awaiting_usable(Awaiting *self)
{
    if (self->executing) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return 0;
    }
    if (self->app == NULL && self->inner == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return 0;
    }
    return 1;
}

static PySendResult
awaiting_send(Awaiting *self, PyObject *arg, PyObject **result)
{
    PySendResult status;
    *result = NULL;
    if (!awaiting_usable(self))
        return PYGEN_ERROR;
    self->executing = 1;
    if (self->app != NULL) {
        if (arg != Py_None) {
            self->executing = 0;
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        if (awaiting_start(self) < 0) {
            self->executing = 0;
            awaiting_finish(self, 1);
            return PYGEN_ERROR;
        }
    }
    status = PyIter_Send(self->inner, arg, result);
    self->executing = 0;
    if (status != PYGEN_NEXT)
        awaiting_finish(self, status == PYGEN_ERROR);
    return status;
}

/* StopIteration(value) as the raised exception */
static void
stop_with(PyObject *value)
{
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
}

static PyObject *
awaiting_iternext(Awaiting *self)
{
    PyObject *result;
    PySendResult status = awaiting_send(self, Py_None, &result);
    if (status != PYGEN_RETURN)
        return result;
    if (result != Py_None)
        stop_with(result);
    Py_DECREF(result);
    return NULL; /* with no exception set: StopIteration(None) */
}

static PyObject *
awaiting_send_method(Awaiting *self, PyObject *arg)
{
    PyObject *result;
    PySendResult status = awaiting_send(self, arg, &result);
    if (status != PYGEN_RETURN)
        return result;
    if (result == Py_None)
        PyErr_SetNone(PyExc_StopIteration);
    else
        stop_with(result);
    Py_DECREF(result);
    return NULL;
}

/* throw(value) or throw(type[, value[, traceback]]) as raised by `raise` in a frame that
 * has not started: the exception set. */
static void
raise_thrown(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *typ = args[0], *value = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(typ))
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    else if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, value);
    else
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
}

static PyObject *
awaiting_throw(Awaiting *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *throw, *result;
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    if (!awaiting_usable(self))
        return NULL;
    if (self->app != NULL) { /* the exception ends it before the app is called */
        awaiting_forget(self);
        raise_thrown(args, nargs);
        return NULL;
    }
    self->executing = 1;
    throw = PyObject_GetAttr(self->inner, THROW_NAME);
    if (throw == NULL) {
        PyErr_Clear();
        raise_thrown(args, nargs);
        self->executing = 0;
        awaiting_finish(self, 1);
        return NULL;
    }
    result = PyObject_Vectorcall(throw, args, nargs, NULL);
    Py_DECREF(throw);
    self->executing = 0;
    if (result == NULL)
        awaiting_finish(self, !PyErr_ExceptionMatches(PyExc_StopIteration));
    return result;
}

static PyObject *
awaiting_close(Awaiting *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *close, *result;
    if (self->executing) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return NULL;
    }
    if (self->inner == NULL) { /* never started (the app is not called) or ended */
        awaiting_forget(self);
        Py_RETURN_NONE;
    }
    self->executing = 1;
    close = PyObject_GetAttr(self->inner, CLOSE_NAME);
    if (close == NULL) {
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    }
    else {
        result = PyObject_CallNoArgs(close);
        Py_DECREF(close);
    }
    self->executing = 0;
    awaiting_finish(self, 1); /* closed: GeneratorExit went through the request */
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* Dropped while the app's awaitable was suspended: closed, as a coroutine would be. */
static void
awaiting_finalize(Awaiting *self)
{
    PyObject *exc, *result;
    if (self->inner == NULL || self->executing)
        return;
    exc = PyErr_GetRaisedException();
    result = awaiting_close(self, NULL);
    if (result == NULL)
        PyErr_WriteUnraisable((PyObject *)self);
    Py_XDECREF(result);
    PyErr_SetRaisedException(exc);
}

static void
awaiting_dealloc(Awaiting *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected */
    PyObject_GC_UnTrack(self);
    awaiting_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
awaiting_await(Awaiting *self)
{
    return Py_NewRef(self);
}

static PyMethodDef awaiting_methods[] = {
    {"send", (PyCFunction)awaiting_send_method, METH_O, "send(value): one step of the app"},
    {"throw", (PyCFunction)(void (*)(void))awaiting_throw, METH_FASTCALL,
     "throw(exception): raised in the app where it waits"},
    {"close", (PyCFunction)awaiting_close, METH_NOARGS, "close(): the app is closed"},
    {NULL},
};

static PyAsyncMethods awaiting_async = {
    .am_await = (unaryfunc)awaiting_await,
    .am_send = (sendfunc)awaiting_send,
};

static PyTypeObject AwaitingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._counts.Awaiting",
    .tp_basicsize = sizeof(Awaiting),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An ASGI request that is not sampled, as its server awaits it (Counted.run).",
    .tp_dealloc = (destructor)awaiting_dealloc,
    .tp_traverse = (traverseproc)awaiting_traverse,
    .tp_clear = (inquiry)awaiting_clear,
    .tp_finalize = (destructor)awaiting_finalize,
    .tp_as_async = &awaiting_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)awaiting_iternext,
    .tp_methods = awaiting_methods,
};

/* --- Dispatch: the ASGI middleware's work, in C where a request is not sampled ----------
 *
 * `Dispatch(app, runtime, fallback, sampled, route_of, middleware)` is what
 * `asgi.ProfilerMiddleware.dispatch` is when this module is built: called as
 * `dispatch(scope, receive, send)` for each connection. The common case, an http request
 * of a dict scope with a path and a method, no force header among its headers (when a
 * force secret is set) and the sampler saying no, returns
 * `counts.counted(send, path, method).run(app, scope, receive, route_of)` without a
 * Python frame; a request the sampler takes goes to
 * `sampled(profiler, scope, receive, send, path, method, False)`; anything else (no
 * profiler started, lifespan, websocket, a force header, a scope of another shape) to
 * `fallback(scope, receive, send)`, the Python dispatch it is the twin of (tests compare
 * the two). The profiler is `runtime["STARTED"]`, read per call as Python reads it; its
 * `force_secret`, `counts` and `decide` are read when it is first seen. */

typedef struct {
    PyObject_HEAD
    PyObject *app;
    PyObject *runtime;    /* the runtime module's namespace */
    PyObject *fallback;
    PyObject *sampled;
    PyObject *route_of;
    PyObject *middleware; /* exposed as __self__, as by the bound method it stands for */
    /* what every request reads of the profiler, read once per profiler (Profiler keeps
     * them from its start on): its force secret, count table and sampler's decide */
    PyObject *profiler, *secret, *counts, *decide;
    vectorcallfunc vectorcall;
} Dispatch;

static PyObject *STARTED_KEY, *PATH_KEY, *METHOD_KEY, *HTTP, *FORCE_SECRET_NAME, *DECIDE_NAME,
    *COUNTS_NAME, *HEADERS_KEY;
static const char FORCE_HEADER[] = "x-profiler-force"; /* asgi.FORCE_HEADER */
static PyTypeObject CountTableType;

static int
dispatch_traverse(Dispatch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->app);
    Py_VISIT(self->runtime);
    Py_VISIT(self->fallback);
    Py_VISIT(self->sampled);
    Py_VISIT(self->route_of);
    Py_VISIT(self->middleware);
    Py_VISIT(self->profiler);
    Py_VISIT(self->secret);
    Py_VISIT(self->counts);
    Py_VISIT(self->decide);
    return 0;
}

/* forgets the profiler read last (one that stopped is not kept alive) */
static void
dispatch_forget(Dispatch *self)
{
    Py_CLEAR(self->profiler);
    Py_CLEAR(self->secret);
    Py_CLEAR(self->counts);
    Py_CLEAR(self->decide);
}

static int
dispatch_clear(Dispatch *self)
{
    dispatch_forget(self);
    Py_CLEAR(self->app);
    Py_CLEAR(self->runtime);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->sampled);
    Py_CLEAR(self->route_of);
    Py_CLEAR(self->middleware);
    return 0;
}

static void
dispatch_dealloc(Dispatch *self)
{
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *dispatch_call(Dispatch *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames);

static PyObject *
dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"app", "runtime", "fallback", "sampled", "route_of",
                               "middleware", NULL};
    PyObject *app, *runtime, *fallback, *sampled, *route_of, *middleware;
    Dispatch *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOO:Dispatch", keywords, &app,
                                     &PyDict_Type, &runtime, &fallback, &sampled, &route_of,
                                     &middleware))
        return NULL;
    self = (Dispatch *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->app = Py_NewRef(app);
    self->runtime = Py_NewRef(runtime);
    self->fallback = Py_NewRef(fallback);
    self->sampled = Py_NewRef(sampled);
    self->route_of = Py_NewRef(route_of);
    self->middleware = Py_NewRef(middleware);
    self->vectorcall = (vectorcallfunc)dispatch_call;
    return (PyObject *)self;
}

/* scope[key] if it is a non-empty exact str, else NULL (no error set) */
static PyObject *
scope_text(PyObject *scope, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(scope, key);
    if (value == NULL) {
        PyErr_Clear(); /* the fallback reads it again, and raises what Python raises */
        return NULL;
    }
    return PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) > 0 ? value : NULL;
}

/* profiler.name, or NULL (no error set) */
static PyObject *
profiler_attr(PyObject *profiler, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(profiler, name);
    if (value == NULL)
        PyErr_Clear();
    return value;
}

/* 0 when the scope's headers are a list or tuple of (bytes, value) pairs none of which is
 * the force header (whatever its letters' case, as `asgi._header` lowers them), else -1:
 * the header is there, or headers of another shape, which the fallback reads as Python
 * does (no error set) */
static int
no_force_header(PyObject *scope)
{
    PyObject *headers = PyDict_GetItemWithError(scope, HEADERS_KEY), *pair, *key;
    Py_ssize_t size, i, j;
    const Py_ssize_t length = (Py_ssize_t)sizeof(FORCE_HEADER) - 1;
    if (headers == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (PyList_CheckExact(headers))
        size = PyList_GET_SIZE(headers);
    else if (PyTuple_CheckExact(headers))
        size = PyTuple_GET_SIZE(headers);
    else
        return headers == Py_None ? 0 : -1;
    for (i = 0; i < size; i++) {
        /* a list's items are read under the GIL, with no Python code run between */
        pair = PyList_CheckExact(headers) ? PyList_GET_ITEM(headers, i)
                                          : PyTuple_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            return -1;
        key = PyTuple_GET_ITEM(pair, 0);
        if (!PyBytes_CheckExact(key))
            return -1;
        if (PyBytes_GET_SIZE(key) != length)
            continue;
        for (j = 0; j < length; j++) {
            char c = PyBytes_AS_STRING(key)[j];
            if ((c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c) != FORCE_HEADER[j])
                break;
        }
        if (j == length)
            return -1;
    }
    return 0;
}

/* 0 when `profiler` is the one whose secret, count table and decide the dispatch holds
 * (read now if it was not), -1 when they cannot be read or are not what it serves: no
 * error set, the fallback then reads them as Python does */
static int
dispatch_read(Dispatch *self, PyObject *profiler)
{
    PyObject *secret, *counts, *decide;
    if (profiler == self->profiler)
        return 0;
    /* held first: letting the last one go, or reading attributes, may run Python that
     * swaps it */
    Py_INCREF(profiler);
    dispatch_forget(self);
    secret = profiler_attr(profiler, FORCE_SECRET_NAME);
    counts = profiler_attr(profiler, COUNTS_NAME);
    decide = profiler_attr(profiler, DECIDE_NAME);
    if (secret == NULL || counts == NULL || decide == NULL ||
        Py_TYPE(counts) != &CountTableType) {
        Py_XDECREF(secret);
        Py_XDECREF(counts);
        Py_XDECREF(decide);
        Py_DECREF(profiler);
        return -1;
    }
    self->profiler = profiler;
    self->secret = secret;
    self->counts = counts;
    self->decide = decide;
    return 0;
}

static PyObject *
dispatch_call(Dispatch *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *scope, *kind, *path, *method, *profiler, *counts, *decide, *decision, *counted,
        *result = NULL;
    int sampled;
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL)
        goto fallback;
    scope = args[0];
    profiler = PyDict_GetItemWithError(self->runtime, STARTED_KEY);
    if (profiler == NULL || profiler == Py_None) {
        dispatch_forget(self);
        goto fallback;
    }
    /* what may run Python comes before the scope's borrowed values are taken */
    if (dispatch_read(self, profiler) < 0 || !PyDict_CheckExact(scope))
        goto fallback;
    kind = PyDict_GetItemWithError(scope, TYPE_KEY);
    if (kind == NULL || !PyUnicode_CheckExact(kind) || !equal_text(kind, HTTP))
        goto fallback;
    path = scope_text(scope, PATH_KEY);
    method = scope_text(scope, METHOD_KEY);
    if (path == NULL || method == NULL ||
        (self->secret != Py_None && no_force_header(scope) < 0))
        goto fallback;
    /* held for the call: the sampler's may run Python that swaps the profiler */
    profiler = Py_NewRef(self->profiler);
    counts = Py_NewRef(self->counts);
    decide = Py_NewRef(self->decide);
    Py_INCREF(path);
    Py_INCREF(method);
    decision = PyObject_CallOneArg(decide, path);
    sampled = decision == NULL ? -1 : PyObject_IsTrue(decision);
    Py_XDECREF(decision);
    if (sampled > 0) {
        PyObject *call[7] = {profiler, scope, args[1], args[2], path, method, Py_False};
        result = PyObject_Vectorcall(self->sampled, call, 7, NULL);
    }
    else if (sampled == 0) {
        PyObject *call[4] = {args[2], path, method, NULL};
        counted = table_counted((CountTable *)counts, call, 3);
        if (counted != NULL) {
            PyObject *run[4] = {self->app, scope, args[1], self->route_of};
            result = counted_run((Counted *)counted, run, 4);
            Py_DECREF(counted);
        }
    }
    Py_DECREF(path);
    Py_DECREF(method);
    Py_DECREF(decide);
    Py_DECREF(counts);
    Py_DECREF(profiler);
    return result;
fallback:
    if (PyErr_Occurred())
        PyErr_Clear();
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyMemberDef dispatch_members[] = {
    {"__self__", T_OBJECT, offsetof(Dispatch, middleware), READONLY,
     "the middleware whose dispatch this is"},
    {NULL},
};

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._counts.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Dispatch(app, runtime, fallback, sampled, route_of, middleware): the ASGI "
              "middleware's dispatch, in C for a request that is not sampled.",
    .tp_new = dispatch_new,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_traverse = (traverseproc)dispatch_traverse,
    .tp_clear = (inquiry)dispatch_clear,
    .tp_vectorcall_offset = offsetof(Dispatch, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_members = dispatch_members,
};

/* --- AsgiRoute: Starlette's route of a request, read in C in the common case -----------
 *
 * `AsgiRoute(leaf_types, python, named)(scope)` is `routes.asgi_route(scope)`, the route
 * every ASGI request is counted under as it ends: the template of a route whose type is
 * known not to be a mount (`leaf_types`, a set `routes` fills), when no mount, no FastAPI
 * state and no route named inside the app is in the scope; None where no router ran;
 * anything else (mounts, FastAPI, a scope that is not exactly a dict) from
 * `python(scope)`, the `asgi_route` it is the twin of (tests compare the two). */

typedef struct {
    PyObject_HEAD
    PyObject *leaf_types;
    PyObject *python;
    PyObject *named; /* the scope's key of a route named inside the app (routes.ROUTE_KEY) */
    vectorcallfunc vectorcall;
} AsgiRoute;

static PyObject *ROUTE_NAME, *ROUTER_NAME, *APP_ROOT_PATH, *FASTAPI_NAME;

static int
route_traverse(AsgiRoute *self, visitproc visit, void *arg)
{
    Py_VISIT(self->leaf_types);
    Py_VISIT(self->python);
    Py_VISIT(self->named);
    return 0;
}

static int
route_clear(AsgiRoute *self)
{
    Py_CLEAR(self->leaf_types);
    Py_CLEAR(self->python);
    Py_CLEAR(self->named);
    return 0;
}

static void
route_dealloc(AsgiRoute *self)
{
    PyObject_GC_UnTrack(self);
    route_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *route_call(AsgiRoute *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames);

static PyObject *
route_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"leaf_types", "python", "named", NULL};
    PyObject *leaf_types, *python, *named;
    AsgiRoute *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OU:AsgiRoute", keywords, &PySet_Type,
                                     &leaf_types, &python, &named))
        return NULL;
    self = (AsgiRoute *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->leaf_types = Py_NewRef(leaf_types);
    self->python = Py_NewRef(python);
    self->named = Py_NewRef(named);
    self->vectorcall = (vectorcallfunc)route_call;
    return (PyObject *)self;
}

/* 1 if none of the keys is in the dict, 0 if one is, -1 on an error */
static int
none_in(PyObject *dict, PyObject *a, PyObject *b)
{
    int found = PyDict_Contains(dict, a);
    if (found == 0 && b != NULL)
        found = PyDict_Contains(dict, b);
    return found < 0 ? -1 : !found;
}

static PyObject *
route_call(AsgiRoute *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *scope, *route, *path;
    int leaf;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL || !PyDict_CheckExact(args[0]))
        goto python;
    scope = args[0];
    route = PyDict_GetItemWithError(scope, ROUTE_NAME);
    if (route == NULL && PyErr_Occurred())
        goto python;
    if (route == NULL || route == Py_None) {
        /* asgi_route_in_full: a route named inside the app, else none where no router ran */
        if (none_in(scope, self->named, ROUTER_NAME) == 1)
            Py_RETURN_NONE;
        goto python;
    }
    leaf = PySet_Contains(self->leaf_types, (PyObject *)Py_TYPE(route));
    if (leaf != 1 || none_in(scope, APP_ROOT_PATH, FASTAPI_NAME) != 1 ||
        none_in(scope, self->named, NULL) != 1)
        goto python;
    Py_INCREF(route); /* reading its path may run Python that changes the scope */
    path = PyObject_GetAttr(route, PATH_KEY);
    Py_DECREF(route);
    if (path == NULL || PyUnicode_CheckExact(path))
        return path;
    Py_SETREF(path, PyObject_Str(path));
    return path;
python:
    PyErr_Clear(); /* Python reads it again, and raises what it raises */
    return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
}

static PyTypeObject AsgiRouteType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._counts.AsgiRoute",
    .tp_basicsize = sizeof(AsgiRoute),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AsgiRoute(leaf_types, python, named)(scope) -> route or None: routes.asgi_route in C "
              "for the common case.",
    .tp_new = route_new,
    .tp_dealloc = (destructor)route_dealloc,
    .tp_traverse = (traverseproc)route_traverse,
    .tp_clear = (inquiry)route_clear,
    .tp_vectorcall_offset = offsetof(AsgiRoute, vectorcall),
    .tp_call = PyVectorcall_Call,
};

static PyObject *
table_take(CountTable *self, PyObject *Py_UNUSED(ignored))
{
    /* the table is swapped for an empty one first: building the rows may run a collection,
     * and a finalizer an add, which then goes to the new table */
    PyObject *rows = NULL, *index = self->index, *fresh, *key, *number, *row, *buckets;
    int64_t *entries = self->entries;
    Py_ssize_t position = 0;
    if (index == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CountTable is not initialised");
        return NULL;
    }
    fresh = PyDict_New();
    if (fresh == NULL)
        return NULL;
    self->index = fresh;
    self->entries = NULL;
    self->used = self->capacity = 0;
    forget_last(self);
    rows = PyList_New(0);
    if (rows == NULL)
        goto done;
    while (PyDict_Next(index, &position, &key, &number)) {
        int64_t *entry = entries + PyLong_AsSsize_t(number) * self->width;
        buckets = PyList_New(self->width - 2);
        if (buckets == NULL)
            goto failed;
        for (Py_ssize_t i = 2; i < self->width; i++) {
            PyObject *value = PyLong_FromLongLong(entry[i]);
            if (value == NULL) {
                Py_DECREF(buckets);
                goto failed;
            }
            PyList_SET_ITEM(buckets, i - 2, value);
        }
        row = Py_BuildValue("(OOOLLN)", PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(key, 1),
                            PyTuple_GET_ITEM(key, 2), (long long)entry[0], (long long)entry[1],
                            buckets);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            goto failed;
        }
        Py_DECREF(row);
    }
    goto done;
failed:
    Py_CLEAR(rows);
done:
    Py_DECREF(index);
    PyMem_Free(entries);
    return rows;
}

static PyObject *
table_get_pending(CountTable *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->used > 0);
}

static PyObject *
table_get_waiting(CountTable *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->waiting);
}

static int
table_set_waiting(CountTable *self, PyObject *value, void *Py_UNUSED(closure))
{
    int truth;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "waiting cannot be deleted");
        return -1;
    }
    truth = PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    self->waiting = truth;
    return 0;
}

static PyObject *
table_get_lost(CountTable *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->lost);
}

static int
table_set_lost(CountTable *self, PyObject *value, void *Py_UNUSED(closure))
{
    unsigned long long lost;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "lost cannot be deleted");
        return -1;
    }
    lost = PyLong_AsUnsignedLongLong(value);
    if (lost == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    self->lost = lost;
    return 0;
}

static PyMethodDef table_methods[] = {
    {"add", (PyCFunction)(void (*)(void))table_add, METH_FASTCALL,
     "add(route, method, status, duration_ns): one request ended (never raises); status is "
     "an int or a WSGI status line"},
    {"counted", (PyCFunction)(void (*)(void))table_counted, METH_FASTCALL,
     "counted(target, path, method, environ=None, route_of=None) -> Counted: a request "
     "that is not sampled, its clock started"},
    {"take", (PyCFunction)table_take, METH_NOARGS,
     "take() -> [(route, method, status_class, count, duration_ns_sum, buckets)]: what was "
     "counted since the last take"},
    {NULL},
};

static PyGetSetDef table_getset[] = {
    {"pending", (getter)table_get_pending, NULL, "something was counted since the last take",
     NULL},
    {"waiting", (getter)table_get_waiting, (setter)table_set_waiting,
     "the next add calls wake (the transport sets it before it sleeps)", NULL},
    {"lost", (getter)table_get_lost, (setter)table_set_lost,
     "requests not counted (no memory for them)", NULL},
    {NULL},
};

static PyTypeObject CountTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._counts.CountTable",
    .tp_basicsize = sizeof(CountTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CountTable(bounds, max_routes, max_route_chars, max_methods, max_method_chars, "
              "other, wake): every request counted (see profiler_host.request_counts).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_traverse = (traverseproc)table_traverse,
    .tp_clear = (inquiry)table_clear,
    .tp_methods = table_methods,
    .tp_getset = table_getset,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._counts",
    .m_doc = "Every request's count in C (see profiler_host.request_counts).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__counts(void)
{
    PyObject *module;
    if (PyType_Ready(&CountTableType) < 0 || PyType_Ready(&CountedType) < 0 ||
        PyType_Ready(&AwaitingType) < 0 || PyType_Ready(&DispatchType) < 0 ||
        PyType_Ready(&AsgiRouteType) < 0)
        return NULL;
    HTTP_RESPONSE_START = PyUnicode_InternFromString("http.response.start");
    WEBSOCKET_ACCEPT = PyUnicode_InternFromString("websocket.accept");
    TYPE_KEY = PyUnicode_InternFromString("type");
    STATUS_KEY = PyUnicode_InternFromString("status");
    ZERO = PyLong_FromLong(0);
    SWITCHING = PyLong_FromLong(101);
    INTERNAL_ERROR = PyLong_FromLong(500);
    THROW_NAME = PyUnicode_InternFromString("throw");
    CLOSE_NAME = PyUnicode_InternFromString("close");
    STARTED_KEY = PyUnicode_InternFromString("STARTED");
    PATH_KEY = PyUnicode_InternFromString("path");
    METHOD_KEY = PyUnicode_InternFromString("method");
    HTTP = PyUnicode_InternFromString("http");
    FORCE_SECRET_NAME = PyUnicode_InternFromString("force_secret");
    DECIDE_NAME = PyUnicode_InternFromString("decide");
    COUNTS_NAME = PyUnicode_InternFromString("counts");
    ROUTE_NAME = PyUnicode_InternFromString("route");
    ROUTER_NAME = PyUnicode_InternFromString("router");
    APP_ROOT_PATH = PyUnicode_InternFromString("app_root_path");
    FASTAPI_NAME = PyUnicode_InternFromString("fastapi");
    HEADERS_KEY = PyUnicode_InternFromString("headers");
    if (!THROW_NAME || !CLOSE_NAME || !HTTP_RESPONSE_START || !WEBSOCKET_ACCEPT || !TYPE_KEY ||
        !STATUS_KEY || !ZERO || !SWITCHING || !INTERNAL_ERROR || !STARTED_KEY || !PATH_KEY ||
        !METHOD_KEY || !HTTP || !FORCE_SECRET_NAME || !DECIDE_NAME || !COUNTS_NAME ||
        !ROUTE_NAME || !ROUTER_NAME || !APP_ROOT_PATH || !FASTAPI_NAME || !HEADERS_KEY)
        return NULL;
    module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "CountTable", (PyObject *)&CountTableType) < 0 ||
        PyModule_AddObjectRef(module, "Counted", (PyObject *)&CountedType) < 0 ||
        PyModule_AddObjectRef(module, "Awaiting", (PyObject *)&AwaitingType) < 0 ||
        PyModule_AddObjectRef(module, "Dispatch", (PyObject *)&DispatchType) < 0 ||
        PyModule_AddObjectRef(module, "AsgiRoute", (PyObject *)&AsgiRouteType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
