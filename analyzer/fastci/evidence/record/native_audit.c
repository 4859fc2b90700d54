/* FastCI's audit hook in C: the events the recorder asked for reach Python, no others.
 *
 * The recorder watches a few audit events (files opened, code exec'd, programs
 * started, modules imported: fastci/evidence/record/files.py). A hook added with
 * sys.addaudithook is a Python function, called for *every* audit event of the
 * process, and some are frequent: `builtins.id` at each id() call, `object.__getattr__`
 * at each frame.f_code read, `sys._getframe`. A call-heavy pure-Python suite raised
 * 150,000 of them, each a Python call that returned at once. This hook is added with
 * PySys_AddAuditHook instead: it compares the event name with the names asked for, in
 * C, and calls the Python callback for those alone, with tracing suspended for this
 * thread (what the interpreter does around a Python hook whose __cantrace__ is false).
 *
 * Audit hooks cannot be removed: install() adds it once per process; set_events()
 * changes what it lets through (an empty tuple: nothing). It serves the interpreter it
 * was installed from and stays silent in any other (subinterpreters). files.py falls
 * back to a Python hook where this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_EVENTS 32
#define MAX_NAME 64

static char wanted[MAX_EVENTS][MAX_NAME];
static int n_wanted = 0;
static PyObject *callback = NULL; /* strong reference, kept for the life of the process */
static PyInterpreterState *home = NULL;

static int
is_wanted(const char *event)
{
    for (int i = 0; i < n_wanted; i++) {
        if (event[0] == wanted[i][0] && strcmp(event, wanted[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static int
hook(const char *event, PyObject *args, void *data)
{
    (void)data;
    if (callback == NULL || n_wanted == 0 || !is_wanted(event)) {
        return 0;
    }
    PyThreadState *ts = PyThreadState_Get();
    if (PyThreadState_GetInterpreter(ts) != home) {
        return 0;
    }
    PyObject *name = PyUnicode_FromString(event);
    if (name == NULL) {
        return -1;
    }
    PyObject *cb = callback;
    Py_INCREF(cb);
    PyThreadState_EnterTracing(ts);
    PyObject *res = PyObject_CallFunctionObjArgs(cb, name, args ? args : Py_None, NULL);
    PyThreadState_LeaveTracing(ts);
    Py_DECREF(cb);
    Py_DECREF(name);
    if (res == NULL) {
        return -1; /* as a Python hook's exception: the audited operation fails */
    }
    Py_DECREF(res);
    return 0;
}

static PyObject *
set_events(PyObject *self, PyObject *names)
{
    (void)self;
    PyObject *seq = PySequence_Fast(names, "set_events() takes a sequence of event names");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_EVENTS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d audit events, got %zd", MAX_EVENTS, n);
    }
    char copy[MAX_EVENTS][MAX_NAME];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t len = 0;
        const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &len) : NULL;
        if (s == NULL || len == 0 || len >= MAX_NAME || (Py_ssize_t)strlen(s) != len) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "an audit event name is a non-empty str under 64 bytes");
            }
            return NULL;
        }
        memcpy(copy[i], s, (size_t)len + 1);
    }
    Py_DECREF(seq);
    /* The GIL is held: the hook never sees a half-written table. */
    n_wanted = 0;
    memcpy(wanted, copy, sizeof(copy));
    n_wanted = (int)n;
    Py_RETURN_NONE;
}

static PyObject *
install(PyObject *self, PyObject *args)
{
    PyObject *cb, *names;
    if (!PyArg_ParseTuple(args, "OO:install", &cb, &names)) {
        return NULL;
    }
    if (!PyCallable_Check(cb)) {
        return PyErr_Format(PyExc_TypeError, "install() needs a callable, got %.100s",
                            Py_TYPE(cb)->tp_name);
    }
    if (callback != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the audit hook is installed already");
        return NULL;
    }
    PyObject *ok = set_events(self, names);
    if (ok == NULL) {
        return NULL;
    }
    Py_DECREF(ok);
    if (PySys_AddAuditHook(hook, NULL) < 0) {
        /* Another hook vetoed the sys.addaudithook event (its exception is cleared). */
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "another audit hook refused this one");
        }
        return NULL;
    }
    Py_INCREF(cb);
    callback = cb;
    home = PyThreadState_GetInterpreter(PyThreadState_Get());
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(callback, names): add the hook once; callback(event, args) gets the named events."},
    {"set_events", set_events, METH_O,
     "set_events(names): the audit events the callback gets from now on."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_audit",
    "FastCI's audit hook in C: only the events asked for reach Python.", -1, methods,
};

PyMODINIT_FUNC
PyInit_native_audit(void)
{
    return PyModule_Create(&module);
}
