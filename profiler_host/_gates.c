/* The gates of rewritten code: one constant slot per code object, switched for all at once.
 *
 * A rewritten code object starts with `LOAD_CONST <slot>; POP_JUMP_IF_NOT_NONE`: None in
 * the slot keeps its frames in the original instructions, `gates.OPEN` sends them to the
 * instrumented copy. An identity test with None is the cheapest branch the interpreter
 * has (no truth test, no call: about 40 machine instructions per call less than testing a
 * list's length, and no TO_BOOL on 3.13), so the closed gate costs what two instructions
 * cost. The interpreter reads a constant from its code's co_consts at each LOAD_CONST, so
 * writing the slot switches every frame that reaches its gate from then on.
 *
 * `track` remembers a slot and writes the current state into it; `switch` writes every
 * slot. A slot only ever holds None or OPEN, both kept alive elsewhere, so no write frees
 * anything, and the interpreter never caches what LOAD_CONST read. The code object's hash
 * stays the same: OPEN hashes as None does. A slot holds its code object's constants, not
 * the code object: `types.coroutine` and others replace a function's code by a copy that
 * shares them. Constants only this module still holds are let go of at the next switch,
 * so the slots stay as many as the live rewritten code objects; until then they keep the
 * code objects nested in them. `forget`, as the profiler stops, lets go of them all.
 * Everything runs under the GIL, so a frame sees a slot before or after a write, never
 * during one. Twin: `gates._PythonSlots`. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject *consts; /* a code object's co_consts (a strong reference) */
    Py_ssize_t index;
} Slot;

static Slot *slots = NULL;
static Py_ssize_t count = 0, capacity = 0;
static PyObject *open_value = NULL; /* gates.OPEN */
static int is_open = 0;

static void
write_slot(Slot *slot)
{
    PyObject *value = is_open ? open_value : Py_None;
    PyObject *old = PyTuple_GET_ITEM(slot->consts, slot->index);
    if (old == value)
        return;
    PyTuple_SET_ITEM(slot->consts, slot->index, Py_NewRef(value));
    Py_DECREF(old);
}

/* Writes every slot whose tuple something else still holds (a code object: the one it was
 * tracked with, or a copy made by code.replace(), which shares it) and forgets the rest. */
static void
write_all(void)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (Py_REFCNT(slots[i].consts) == 1) {
            Py_DECREF(slots[i].consts);
            continue;
        }
        slots[kept] = slots[i];
        write_slot(&slots[kept]);
        kept++;
    }
    count = kept;
}

/* configure(open_value): the object an open slot holds */
static PyObject *
configure(PyObject *module, PyObject *value)
{
    Py_XSETREF(open_value, Py_NewRef(value));
    Py_RETURN_NONE;
}

/* track(code, index): the slot `code.co_consts[index]`, which holds OPEN, switched from
 * now on */
static PyObject *
track(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCode_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "track(code, index)");
        return NULL;
    }
    PyObject *consts = ((PyCodeObject *)args[0])->co_consts;
    Py_ssize_t index = PyLong_AsSsize_t(args[1]);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (open_value == NULL || index < 0 || index >= PyTuple_GET_SIZE(consts) ||
        PyTuple_GET_ITEM(consts, index) != open_value) {
        PyErr_SetString(PyExc_ValueError, "the slot does not hold gates.OPEN");
        return NULL;
    }
    if (count == capacity) {
        write_all(); /* forgets the slots of code objects that are gone first */
        if (count * 2 >= capacity) {
            Py_ssize_t grown = capacity ? capacity * 2 : 256;
            Slot *more = PyMem_Realloc(slots, (size_t)grown * sizeof(Slot));
            if (more == NULL)
                return PyErr_NoMemory();
            slots = more;
            capacity = grown;
        }
    }
    slots[count].consts = Py_NewRef(consts);
    slots[count].index = index;
    write_slot(&slots[count]);
    count++;
    Py_RETURN_NONE;
}

/* switch(open): every slot holds OPEN (true) or None (false) */
static PyObject *
switch_all(PyObject *module, PyObject *flag)
{
    int value = PyObject_IsTrue(flag);
    if (value < 0)
        return NULL;
    is_open = value;
    write_all();
    Py_RETURN_NONE;
}

/* forget(): every slot opened for good and let go of (the profiler stops). Code that
 * outlives the stop and runs again (a suspended coroutine, a method gated by propagation
 * and put in again by a later start) takes the instrumented copy, whose enter hook
 * declines outside a sampled request: correct, if slower, as an untracked gate is. */
static PyObject *
forget(PyObject *module, PyObject *unused)
{
    is_open = 1;
    write_all();
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(slots[i].consts);
    count = 0;
    is_open = 0;
    Py_RETURN_NONE;
}

/* tracked(): how many slots are switched */
static PyObject *
tracked(PyObject *module, PyObject *unused)
{
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O, "configure(open_value): what an open slot holds"},
    {"track", (PyCFunction)(void (*)(void))track, METH_FASTCALL,
     "track(code, index): code.co_consts[index] (gates.OPEN) switched from now on"},
    {"switch", switch_all, METH_O, "switch(open): every slot open or closed"},
    {"forget", forget, METH_NOARGS, "forget(): every slot opened for good and let go of"},
    {"tracked", tracked, METH_NOARGS, "tracked(): how many slots are switched"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "profiler_host._gates",
    .m_doc = "The gates of rewritten code, switched all at once (see profiler_host.gates).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__gates(void)
{
    return PyModule_Create(&module_def);
}
