/* The sampler's per-request decision in C (profiler_host._sampling.Sampler).
 *
 * Every request the middleware sees pays for this decision, sampled or not: in Python it
 * costs about a microsecond (route shaping alone half of it), a percent of a fast
 * endpoint. This is the same decision as `profiler_host.sampler.Sampler`, its reference
 * (tests compare the two on random arrivals): a target rate per second, a per-window cap,
 * and the first request of each route shape in every interval. The clock and the chance
 * are C's own (CLOCK_MONOTONIC, a xorshift generator) unless callables are given, which
 * tests do. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030C0000
/* from 3.12 Python.h has the member types, as Py_T_* (structmember.h is deprecated there) */
#include <structmember.h>
#define Py_T_DOUBLE T_DOUBLE
#define Py_T_ULONGLONG T_ULONGLONG
#define Py_READONLY READONLY
#endif
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* sampler.py's MAX_ROUTES and HEX_ID_LENGTH: new_sampler uses this module only when the
 * constants it exports are those */
#define MAX_ROUTES 1000 /* route shapes remembered */
#define HEX_ID_LENGTH 16 /* hex-and-dash segments this long or longer are ids */

/* The route rule's memory: a shape's key and when the rule last sampled it, in an
 * open-addressed table (linear probing) of twice MAX_ROUTES slots, so a probe always ends at
 * an empty one. Key 0 marks an empty slot. A request reads one slot and makes no Python
 * object: a dict of int keys cost a fast endpoint's request more than the rest of the
 * decision together (an int and a float allocated, hashed, compared and freed). */
#define ROUTE_SLOTS 2048
_Static_assert(ROUTE_SLOTS >= 2 * MAX_ROUTES && (ROUTE_SLOTS & (ROUTE_SLOTS - 1)) == 0,
               "ROUTE_SLOTS: a power of two, at least 2 * MAX_ROUTES");

typedef struct {
    uint64_t key;
    double stamp;
} RouteSlot;

typedef struct {
    PyObject_HEAD
    double rate;
    double route_interval;
    double window_start;
    long long window_count;
    unsigned long long seen; /* requests decided on, sampled or not */
    long long window_sampled;
    double arrivals; /* smoothed requests per second */
    PyObject *clock;  /* None: CLOCK_MONOTONIC */
    PyObject *chance; /* None: xorshift */
    uint64_t state;   /* xorshift64* state, never 0 */
    Py_ssize_t route_count; /* shapes in `routes`, at most MAX_ROUTES */
    RouteSlot routes[ROUTE_SLOTS];
} Sampler;

static int
read_clock(Sampler *self, double *now)
{
    PyObject *value;
    if (self->clock == Py_None) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
        return 0;
    }
    value = PyObject_CallNoArgs(self->clock);
    if (value == NULL)
        return -1;
    *now = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *now == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int
read_chance(Sampler *self, double *chance)
{
    PyObject *value;
    if (self->chance == Py_None) {
        uint64_t x = self->state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self->state = x;
        *chance = (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
        return 0;
    }
    value = PyObject_CallNoArgs(self->chance);
    if (value == NULL)
        return -1;
    *chance = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *chance == -1.0 && PyErr_Occurred() ? -1 : 0;
}

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
/* ASCII digits are the only ASCII characters Unicode calls decimal */
#define IS_DECIMAL(c) ((c) < 128 ? (c) >= '0' && (c) <= '9' : Py_UNICODE_ISDECIMAL(c))
#define IS_HEX_OR_DASH(c)                                                                     \
    (((c) >= '0' && (c) <= '9') || ((c) >= 'a' && (c) <= 'f') || ((c) >= 'A' && (c) <= 'F') || \
     (c) == '-')

/* The route shape's key: a 64-bit FNV-1a hash of sampler.route_shape(path)'s characters,
 * computed in one pass over the path, so no str is built (every request pays this): each
 * segment is hashed on from the shape so far while it is read, and that hash is kept unless
 * the segment turns out to be an id, which hashes as `:id`. Two shapes of the up to
 * MAX_ROUTES remembered share a key with a chance of about 1 in 10^13 (a hash of 0 is
 * keyed 1, since 0 marks an empty slot). */
static uint64_t
shape_key(PyObject *path)
{
    static const char ID[] = ":id";
    int kind = PyUnicode_KIND(path);
    const void *data = PyUnicode_DATA(path);
    Py_ssize_t length = PyUnicode_GET_LENGTH(path), i = 0, start, j;
    uint64_t hash = FNV_OFFSET, segment;
    int decimal, hex;
    for (;;) {
        segment = hash;
        decimal = hex = 1;
        for (start = i; i < length; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c == '/')
                break;
            segment = (segment ^ (uint64_t)c) * FNV_PRIME;
            decimal = decimal && IS_DECIMAL(c);
            hex = hex && IS_HEX_OR_DASH(c);
        }
        if ((decimal && i > start) || (hex && i - start >= HEX_ID_LENGTH)) {
            for (j = 0; j < 3; j++)
                hash = (hash ^ (uint64_t)ID[j]) * FNV_PRIME;
        } else {
            hash = segment;
        }
        if (i >= length)
            return hash == 0 ? 1 : hash;
        hash = (hash ^ (uint64_t)'/') * FNV_PRIME;
        i++;
    }
}

/* The slot that holds `key`, or the empty slot where it goes. */
static RouteSlot *
route_slot(Sampler *self, uint64_t key)
{
    size_t i = (size_t)(key ^ (key >> 32)) & (ROUTE_SLOTS - 1);
    while (self->routes[i].key != 0 && self->routes[i].key != key)
        i = (i + 1) & (ROUTE_SLOTS - 1);
    return &self->routes[i];
}

/* decide(path) -> bool: counts the arrival and says whether to record it (see
 * sampler.Sampler.decide, which this follows step by step). */
static PyObject *
sampler_decide(Sampler *self, PyObject *path)
{
    double now, elapsed, chance, current, denominator;
    uint64_t key;
    RouteSlot *slot;
    int known, due;
    if (!PyUnicode_Check(path)) {
        PyErr_SetString(PyExc_TypeError, "decide() takes the request's path as a str");
        return NULL;
    }
    self->seen++;
    if (self->rate <= 0)
        Py_RETURN_FALSE;
    if (read_clock(self, &now) < 0)
        return NULL;
    self->window_count++;
    elapsed = now - self->window_start;
    if (elapsed >= 1.0) {
        self->arrivals = 0.5 * self->arrivals + 0.5 * ((double)self->window_count / elapsed);
        self->window_start = now;
        self->window_count = 0;
        self->window_sampled = 0;
    }
    key = shape_key(path);
    slot = route_slot(self, key);
    known = slot->key != 0;
    due = !known || now - slot->stamp >= self->route_interval;
    if (due && (known || self->route_count < MAX_ROUTES)) {
        if (!known) {
            slot->key = key;
            self->route_count++;
        }
        slot->stamp = now;
        Py_RETURN_TRUE;
    }
    if ((double)self->window_sampled >= self->rate * (elapsed > 1.0 ? elapsed : 1.0))
        Py_RETURN_FALSE;
    /* within the current window, arrivals beyond the smoothed rate lower the chance too */
    current = (double)self->window_count / (elapsed > 1.0 ? elapsed : 1.0);
    denominator = self->arrivals > current ? self->arrivals : current;
    if (denominator < 1e-9)
        denominator = 1e-9;
    if (read_chance(self, &chance) < 0)
        return NULL;
    if (chance < (self->rate / denominator < 1.0 ? self->rate / denominator : 1.0)) {
        self->window_sampled++;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *
sampler_get_probability(Sampler *self, void *closure)
{
    if (self->arrivals <= 0)
        return PyFloat_FromDouble(1.0);
    return PyFloat_FromDouble(self->rate / self->arrivals < 1.0 ? self->rate / self->arrivals
                                                               : 1.0);
}

static int
sampler_init(Sampler *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rate", "route_interval", "clock", "chance", NULL};
    double rate, route_interval = 60.0, now;
    PyObject *clock = Py_None, *chance = Py_None, *seed;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|dOO:Sampler", kwlist, &rate,
                                     &route_interval, &clock, &chance))
        return -1;
    if ((clock != Py_None && !PyCallable_Check(clock)) ||
        (chance != Py_None && !PyCallable_Check(chance))) {
        PyErr_SetString(PyExc_TypeError, "clock and chance are callables or None");
        return -1;
    }
    Py_XSETREF(self->clock, Py_NewRef(clock));
    Py_XSETREF(self->chance, Py_NewRef(chance));
    memset(self->routes, 0, sizeof(self->routes));
    self->route_count = 0;
    if (read_clock(self, &now) < 0)
        return -1;
    self->rate = rate;
    self->seen = 0;
    self->route_interval = route_interval;
    self->window_start = now;
    self->window_count = 0;
    self->window_sampled = 0;
    self->arrivals = rate;
    seed = PyLong_FromVoidPtr(self); /* mixed with the time: differs per process and object */
    if (seed == NULL)
        return -1;
    self->state = (uint64_t)PyLong_AsUnsignedLongLongMask(seed) ^
                  (uint64_t)(now * 1e9) ^ 0x9E3779B97F4A7C15ULL;
    Py_DECREF(seed);
    if (self->state == 0)
        self->state = 0x9E3779B97F4A7C15ULL;
    return 0;
}

static int
sampler_traverse(Sampler *self, visitproc visit, void *arg)
{
    Py_VISIT(self->clock);
    Py_VISIT(self->chance);
    return 0;
}

static int
sampler_clear(Sampler *self)
{
    Py_CLEAR(self->clock);
    Py_CLEAR(self->chance);
    return 0;
}

static void
sampler_dealloc(Sampler *self)
{
    PyObject_GC_UnTrack(self);
    sampler_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef sampler_methods[] = {
    {"decide", (PyCFunction)sampler_decide, METH_O,
     "decide(path) -> bool: counts the arrival and says whether to record it"},
    {NULL},
};

static PyGetSetDef sampler_getset[] = {
    {"probability", (getter)sampler_get_probability, NULL,
     "the chance of a request that no route rule picks", NULL},
    {NULL},
};

static PyMemberDef sampler_members[] = {
    {"rate", Py_T_DOUBLE, offsetof(Sampler, rate), Py_READONLY, "sampled requests per second"},
    {"route_interval", Py_T_DOUBLE, offsetof(Sampler, route_interval), Py_READONLY,
     "seconds between two route-rule samples of one route shape"},
    {"seen", Py_T_ULONGLONG, offsetof(Sampler, seen), Py_READONLY,
     "requests decided on so far, sampled or not"},
    {NULL},
};

static PyTypeObject SamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler_host._sampling.Sampler",
    .tp_basicsize = sizeof(Sampler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Sampler(rate, route_interval=60.0, clock=None, chance=None): which requests "
              "are recorded (see profiler_host.sampler).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sampler_init,
    .tp_dealloc = (destructor)sampler_dealloc,
    .tp_traverse = (traverseproc)sampler_traverse,
    .tp_clear = (inquiry)sampler_clear,
    .tp_methods = sampler_methods,
    .tp_getset = sampler_getset,
    .tp_members = sampler_members,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._sampling",
    .m_doc = "The sampler's per-request decision in C (see profiler_host.sampler).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__sampling(void)
{
    PyObject *module;
    if (PyType_Ready(&SamplerType) < 0)
        return NULL;
    module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Sampler", (PyObject *)&SamplerType) < 0 ||
        PyModule_AddIntConstant(module, "MAX_ROUTES", MAX_ROUTES) < 0 ||
        PyModule_AddIntConstant(module, "HEX_ID_LENGTH", HEX_ID_LENGTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
