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
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#define MAX_ROUTES 1000 /* route shapes remembered (sampler.MAX_ROUTES) */
#define HEX_ID_LENGTH 16 /* hex-and-dash segments this long or longer are ids */

typedef struct {
    PyObject_HEAD
    double rate;
    double route_interval;
    double window_start;
    long long window_count;
    long long window_sampled;
    double arrivals; /* smoothed requests per second */
    PyObject *routes; /* dict: shape -> float time it was last sampled by the route rule */
    PyObject *clock;  /* None: CLOCK_MONOTONIC */
    PyObject *chance; /* None: xorshift */
    uint64_t state;   /* xorshift64* state, never 0 */
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

static int
is_id_segment(int kind, const void *data, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t i;
    int decimal = end > start, hex = end - start >= HEX_ID_LENGTH;
    for (i = start; i < end && (decimal || hex); i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (!Py_UNICODE_ISDECIMAL(c))
            decimal = 0;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
              c == '-'))
            hex = 0;
    }
    return decimal || hex;
}

/* Whether any `/`-separated segment of `path` is an id. */
static int
has_id_segment(PyObject *path)
{
    int kind = PyUnicode_KIND(path);
    const void *data = PyUnicode_DATA(path);
    Py_ssize_t length = PyUnicode_GET_LENGTH(path), start = 0, i;
    for (i = 0; i <= length; i++) {
        if (i < length && PyUnicode_READ(kind, data, i) != '/')
            continue;
        if (is_id_segment(kind, data, start, i))
            return 1;
        start = i + 1;
    }
    return 0;
}

/* sampler.route_shape: numbers and hex ids of 16 characters or more become `:id`. A new
 * reference to the path itself when it has no id (the usual case: no allocation). */
static PyObject *
route_shape(PyObject *path, PyObject *slash, PyObject *id)
{
    PyObject *segments, *shape;
    Py_ssize_t i;
    if (!has_id_segment(path))
        return Py_NewRef(path);
    segments = PyUnicode_Split(path, slash, -1);
    if (segments == NULL)
        return NULL;
    for (i = 0; i < PyList_GET_SIZE(segments); i++) {
        PyObject *segment = PyList_GET_ITEM(segments, i);
        int kind = PyUnicode_KIND(segment);
        if (is_id_segment(kind, PyUnicode_DATA(segment), 0, PyUnicode_GET_LENGTH(segment)))
            PyList_SetItem(segments, i, Py_NewRef(id));
    }
    shape = PyUnicode_Join(slash, segments);
    Py_DECREF(segments);
    return shape;
}

static PyObject *slash_str = NULL; /* "/" */
static PyObject *id_str = NULL;    /* ":id" */

/* decide(path) -> bool: counts the arrival and says whether to record it (see
 * sampler.Sampler.decide, which this follows step by step). */
static PyObject *
sampler_decide(Sampler *self, PyObject *path)
{
    double now, elapsed, last_time, chance, current, denominator;
    PyObject *shape, *last;
    int due;
    if (!PyUnicode_Check(path)) {
        PyErr_SetString(PyExc_TypeError, "decide() takes the request's path as a str");
        return NULL;
    }
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
    shape = route_shape(path, slash_str, id_str);
    if (shape == NULL)
        return NULL;
    last = PyDict_GetItemWithError(self->routes, shape); /* borrowed */
    if (last == NULL && PyErr_Occurred()) {
        Py_DECREF(shape);
        return NULL;
    }
    last_time = last == NULL ? 0.0 : PyFloat_AsDouble(last);
    due = last == NULL || now - last_time >= self->route_interval;
    if (due && (last != NULL || PyDict_GET_SIZE(self->routes) < MAX_ROUTES)) {
        PyObject *stamp = PyFloat_FromDouble(now);
        int rc = stamp == NULL ? -1 : PyDict_SetItem(self->routes, shape, stamp);
        Py_XDECREF(stamp);
        Py_DECREF(shape);
        if (rc < 0)
            return NULL;
        Py_RETURN_TRUE;
    }
    Py_DECREF(shape);
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
    Py_XSETREF(self->routes, PyDict_New());
    if (self->routes == NULL || read_clock(self, &now) < 0)
        return -1;
    self->rate = rate;
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
    Py_VISIT(self->routes);
    Py_VISIT(self->clock);
    Py_VISIT(self->chance);
    return 0;
}

static int
sampler_clear(Sampler *self)
{
    Py_CLEAR(self->routes);
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
    {"rate", T_DOUBLE, offsetof(Sampler, rate), READONLY, "sampled requests per second"},
    {"route_interval", T_DOUBLE, offsetof(Sampler, route_interval), READONLY,
     "seconds between two route-rule samples of one route shape"},
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

static PyObject *
shape_of(PyObject *module, PyObject *path)
{
    if (!PyUnicode_Check(path)) {
        PyErr_SetString(PyExc_TypeError, "route_shape() takes a str");
        return NULL;
    }
    return route_shape(path, slash_str, id_str);
}

static PyMethodDef module_methods[] = {
    {"route_shape", shape_of, METH_O, "route_shape(path) -> the path with ids as :id"},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._sampling",
    .m_doc = "The sampler's per-request decision in C (see profiler_host.sampler).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__sampling(void)
{
    PyObject *module;
    if (PyType_Ready(&SamplerType) < 0)
        return NULL;
    slash_str = PyUnicode_InternFromString("/");
    id_str = PyUnicode_InternFromString(":id");
    if (slash_str == NULL || id_str == NULL)
        return NULL;
    module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Sampler", (PyObject *)&SamplerType) < 0 ||
        PyModule_AddIntConstant(module, "MAX_ROUTES", MAX_ROUTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
