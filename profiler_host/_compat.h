/* What the C modules use of the C API that older supported versions lack. */

#ifndef PROFILER_HOST_COMPAT_H
#define PROFILER_HOST_COMPAT_H

#if PY_VERSION_HEX < 0x030C0000
/* 3.12's way to hold the exception being raised (PyErr_Fetch/PyErr_Restore are deprecated
 * there), for 3.11: one normalized exception object that carries its traceback. */
static PyObject *
PyErr_GetRaisedException(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_DECREF(type);
    Py_XDECREF(tb);
    return value;
}

static void
PyErr_SetRaisedException(PyObject *exc)
{
    if (exc == NULL) {
        PyErr_Clear();
        return;
    }
    PyErr_Restore(Py_NewRef(Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}
#endif

#if PY_VERSION_HEX < 0x030D0000
/* 3.13's name for looking an attribute up without an AttributeError (0: absent). */
#define PyObject_GetOptionalAttr _PyObject_LookupAttr
#endif

#endif
