/* Swapping a live function's code without making its calls slower for good.
 *
 * CPython 3.13 gives each function a version, and a call site specialises a call of a
 * Python function (CALL_PY_EXACT_ARGS, CALL_PY_WITH_DEFAULTS, CALL_BOUND_METHOD_EXACT_ARGS)
 * only when the function has one. MAKE_FUNCTION gives a new function its code object's
 * version; setting `__code__` resets it to 0, which 3.13 never replaces (3.11 and 3.12
 * assign a new version lazily). A function whose code the instrumenter swapped (or put back)
 * would be called through the generic CALL for the rest of the process's life. `set_code` sets the code as `function.__code__ = code` does (the same checks
 * and watchers) and then gives the function the new code's version, as MAKE_FUNCTION
 * would have. The version is what a specialised call checks before it runs the
 * function's current code, which it reads from the function itself.
 *
 * Finding the functions to swap means walking the garbage collector's objects, and
 * gc.get_objects() also returns objects another thread is still building: a tuple that
 * tuple(<generator>) fills holds one reference while it grows, and it is resized in
 * place only while that reference is the only one. A list of every object held by
 * Python code while another thread runs makes that resize fail (SystemError: bad
 * argument to internal function) in someone else's code. `live_functions` keeps only
 * the functions and drops the list before any other thread can run. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *code_str = NULL;
static PyObject *get_objects = NULL;
static PyObject *get_referrers = NULL;

/* set_code(function, code) */
static PyObject *
set_code(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyFunction_Check(args[0]) || !PyCode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_code(function, code)");
        return NULL;
    }
    if (PyObject_SetAttr(args[0], code_str, args[1]) < 0)
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyFunctionObject *function = (PyFunctionObject *)args[0];
    if (function->func_version == 0)
        function->func_version = ((PyCodeObject *)args[1])->co_version;
#endif
    Py_RETURN_NONE;
}

/* live_functions(namespace=None): the functions the garbage collector tracks, or those
 * whose globals are `namespace`; no thread runs between the walk and the filter. */
static PyObject *
live_functions(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *namespace = nargs > 0 && args[0] != Py_None ? args[0] : NULL;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "live_functions(namespace=None)");
        return NULL;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL)
        return NULL;
    PyObject *all = namespace == NULL ? PyObject_CallNoArgs(get_objects)
                                      : PyObject_CallOneArg(get_referrers, namespace);
    if (all == NULL) {
        Py_DECREF(found);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all); i++) {
        PyObject *obj = PyList_GET_ITEM(all, i);
        if (!PyFunction_Check(obj))
            continue;
        if (namespace != NULL && PyFunction_GET_GLOBALS(obj) != namespace)
            continue;
        if (PyList_Append(found, obj) < 0) {
            Py_DECREF(all);
            Py_DECREF(found);
            return NULL;
        }
    }
    Py_DECREF(all);
    return found;
}

static PyMethodDef methods[] = {
    {"set_code", (PyCFunction)(void (*)(void))set_code, METH_FASTCALL,
     "set_code(function, code): function.__code__ = code, its calls still specialisable"},
    {"live_functions", (PyCFunction)(void (*)(void))live_functions, METH_FASTCALL,
     "live_functions(namespace=None): the live functions (of `namespace`), safe from "
     "other threads"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._codeswap",
    .m_doc = "Swapping a live function's code, its calls still specialisable (see "
             "profiler_host.instrumenter).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__codeswap(void)
{
    code_str = PyUnicode_InternFromString("__code__");
    if (code_str == NULL)
        return NULL;
    PyObject *gc = PyImport_ImportModule("gc");
    if (gc == NULL)
        return NULL;
    get_objects = PyObject_GetAttrString(gc, "get_objects");
    get_referrers = PyObject_GetAttrString(gc, "get_referrers");
    Py_DECREF(gc);
    if (get_objects == NULL || get_referrers == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
