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
 * function's current code, which it reads from the function itself. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *code_str = NULL;

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

static PyMethodDef methods[] = {
    {"set_code", (PyCFunction)(void (*)(void))set_code, METH_FASTCALL,
     "set_code(function, code): function.__code__ = code, its calls still specialisable"},
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
    return PyModule_Create(&module_def);
}
