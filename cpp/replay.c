/* mgx_graph._native: the replay path of a repeated call of a one-region program, in one C call.
 *
 * The same path as the Python one (mgx_graph/graph/replay.py: the call record, the region state's repeat
 * and replay checks, the plan's slots), not a layer of its own: a `Replay` is armed after a replay through
 * the Python path with the runtime's launch, capture-status and current-device functions (C addresses:
 * hipGraphLaunch / hipStreamIsCapturing / hipGetDevice, or the CUDA driver's cuGraphLaunch /
 * cuStreamIsCapturing / cuCtxGetDevice), the graph exec and the queue, and each owner's checks and updates
 * as data (the record's parameters and layouts; the Guards rows of GraphLaunchState.replay_guards, the
 * executor and the plan).  Called as run_async is, it makes those checks on the same objects (the locks
 * free, the call's parameters the recorded objects with their shapes, the queue, the attributes and slots
 * the path reads, the device current, no capture open on the queue) and, when all hold, launches the exec,
 * applies the updates and returns the program's outputs; when one does not hold (or the launch fails) it
 * returns None having changed nothing, and the caller runs the Python path, which raises what it would
 * raise.
 *
 * Only the CPython limited API (3.10) is used, so one build serves every later CPython.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_fn)(void *exec, void *stream);
typedef int (*capturing_fn)(void *stream, int *status);
typedef int (*device_fn)(int *device);

typedef struct {
    PyObject_HEAD
    PyObject *spec;           /* the argument tuple: every reference the object holds */
    launch_fn launch;
    capturing_fn capturing;
    device_fn current_device;
    void *exec;
    void *stream;
    int device;
    PyObject *stream_obj;     /* the queue as a Python int */
    PyObject *queue_owner;    /* queue None: getattr(queue_owner, "queue") */
    PyObject *locks;          /* tuple of locks taken with acquire(False) */
    Py_ssize_t n_params;
    PyObject *names, *values; /* tuples: the call's parameters */
    PyObject *layouts;        /* per value: (attribute names, recorded values), compared with == */
    PyObject *writeable;      /* arrays whose flags.writeable must be True */
    PyObject *attrs;          /* tuple of (obj, name, expected, mode): 0 is, 1 ==, 2 len(...) == */
    PyObject *items;          /* tuple of (container, key, expected): container[key] is expected */
    PyObject *counts;         /* tuple of (obj, name): += 1 */
    PyObject *sets;           /* tuple of (obj, name, value) */
    PyObject *returns, *env;  /* outputs: list(returns(env)) */
    Py_ssize_t hits;          /* calls replayed */
} Replay;

static int check_attr(PyObject *t) {
    PyObject *obj = PyTuple_GetItem(t, 0), *name = PyTuple_GetItem(t, 1), *want = PyTuple_GetItem(t, 2);
    long mode = PyLong_AsLong(PyTuple_GetItem(t, 3));
    PyObject *got = PyObject_GetAttr(obj, name);
    int ok;
    if (got == NULL)
        return 0;
    if (mode == 0)
        ok = got == want;
    else if (mode == 1)
        ok = PyObject_RichCompareBool(got, want, Py_EQ) == 1;
    else {
        Py_ssize_t n = PyObject_Length(got);
        ok = n >= 0 && n == PyLong_AsSsize_t(want);
    }
    Py_DECREF(got);
    return ok;
}

static int check_item(PyObject *t) {
    PyObject *got = PyObject_GetItem(PyTuple_GetItem(t, 0), PyTuple_GetItem(t, 1));
    int ok = got != NULL && got == PyTuple_GetItem(t, 2);
    Py_XDECREF(got);
    return ok;
}

/* The call's parameters: a dict (exactly) of n_params entries holding the recorded objects with their
 * recorded layouts, and the arrays written in place still writeable (CallRecord.matches). */
static int same_attrs(PyObject *v, PyObject *layout) {
    PyObject *attr_names = PyTuple_GetItem(layout, 0), *want = PyTuple_GetItem(layout, 1);
    Py_ssize_t j;
    for (j = 0; j < PyTuple_Size(attr_names); j++) {
        PyObject *got = PyObject_GetAttr(v, PyTuple_GetItem(attr_names, j));
        int ok = got != NULL && PyObject_RichCompareBool(got, PyTuple_GetItem(want, j), Py_EQ) == 1;
        Py_XDECREF(got);
        if (!ok)
            return 0;
    }
    return 1;
}

static int check_params(Replay *self, PyObject *params) {
    Py_ssize_t i;
    if (!PyDict_CheckExact(params) || PyDict_Size(params) != self->n_params)
        return 0;
    for (i = 0; i < self->n_params; i++) {
        PyObject *v = PyDict_GetItemWithError(params, PyTuple_GetItem(self->names, i));  /* borrowed */
        if (v == NULL || v != PyTuple_GetItem(self->values, i) || !same_attrs(v, PyTuple_GetItem(self->layouts, i)))
            return 0;
    }
    for (i = 0; i < PyTuple_Size(self->writeable); i++) {
        PyObject *flags = PyObject_GetAttrString(PyTuple_GetItem(self->writeable, i), "flags"), *w = NULL;
        int ok;
        if (flags != NULL)
            w = PyObject_GetAttrString(flags, "writeable");
        ok = w != NULL && PyObject_IsTrue(w) == 1;
        Py_XDECREF(w);
        Py_XDECREF(flags);
        if (!ok)
            return 0;
    }
    return 1;
}

static int check_queue(Replay *self, PyObject *queue, PyObject *copy) {
    PyObject *q;
    int ok;
    if (PyObject_IsTrue(copy) != 0)
        return 0;
    q = queue == Py_None ? PyObject_GetAttrString(self->queue_owner, "queue") : PyNumber_Long(queue);
    if (q == NULL)
        return 0;
    ok = PyObject_RichCompareBool(q, self->stream_obj, Py_EQ) == 1;
    Py_DECREF(q);
    return ok;
}

static int check_all(Replay *self, PyObject *params, PyObject *queue, PyObject *copy) {
    Py_ssize_t i;
    int dev = -1, status = -1;
    if (!check_queue(self, queue, copy) || !check_params(self, params))
        return 0;
    for (i = 0; i < PyTuple_Size(self->attrs); i++)
        if (!check_attr(PyTuple_GetItem(self->attrs, i)))
            return 0;
    for (i = 0; i < PyTuple_Size(self->items); i++)
        if (!check_item(PyTuple_GetItem(self->items, i)))
            return 0;
    if (self->current_device(&dev) != 0 || dev != self->device)
        return 0;
    return self->capturing(self->stream, &status) == 0 && status == 0;
}

static Py_ssize_t take_locks(PyObject *locks) {
    Py_ssize_t i;
    for (i = 0; i < PyTuple_Size(locks); i++) {
        PyObject *r = PyObject_CallMethod(PyTuple_GetItem(locks, i), "acquire", "O", Py_False);
        int ok = r != NULL && PyObject_IsTrue(r) == 1;
        Py_XDECREF(r);
        if (!ok)
            return i;
    }
    return i;
}

static void drop_locks(PyObject *locks, Py_ssize_t n) {
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    while (n-- > 0) {
        PyObject *r = PyObject_CallMethod(PyTuple_GetItem(locks, n), "release", NULL);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    PyErr_Restore(exc_type, exc, tb);
}

static int apply_updates(Replay *self) {
    Py_ssize_t i;
    for (i = 0; i < PyTuple_Size(self->counts); i++) {
        PyObject *t = PyTuple_GetItem(self->counts, i), *obj = PyTuple_GetItem(t, 0), *name = PyTuple_GetItem(t, 1);
        PyObject *v = PyObject_GetAttr(obj, name), *one = PyLong_FromLong(1), *nv = NULL;
        if (v != NULL && one != NULL)
            nv = PyNumber_Add(v, one);
        Py_XDECREF(v);
        Py_XDECREF(one);
        if (nv == NULL || PyObject_SetAttr(obj, name, nv) < 0) {
            Py_XDECREF(nv);
            return -1;
        }
        Py_DECREF(nv);
    }
    for (i = 0; i < PyTuple_Size(self->sets); i++) {
        PyObject *t = PyTuple_GetItem(self->sets, i);
        if (PyObject_SetAttr(PyTuple_GetItem(t, 0), PyTuple_GetItem(t, 1), PyTuple_GetItem(t, 2)) < 0)
            return -1;
    }
    return 0;
}

static PyObject *Replay_call(PyObject *op, PyObject *args, PyObject *kwargs) {
    Replay *self = (Replay *)op;
    PyObject *params, *queue = Py_None, *copy = Py_False, *outs, *result = NULL;
    Py_ssize_t held, n_locks = PyTuple_Size(self->locks);
    static char *kw[] = {"params", "queue", "copy", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO", kw, &params, &queue, &copy))
        return NULL;
    held = take_locks(self->locks);
    if (held < n_locks || !check_all(self, params, queue, copy) || self->launch(self->exec, self->stream) != 0) {
        PyErr_Clear();
        drop_locks(self->locks, held);
        Py_RETURN_NONE;
    }
    self->hits++;
    if (apply_updates(self) == 0) {
        outs = PyObject_CallFunctionObjArgs(self->returns, self->env, NULL);
        if (outs != NULL) {
            result = PySequence_List(outs);
            Py_DECREF(outs);
        }
    }
    drop_locks(self->locks, held);
    return result;
}

static PyObject *Replay_hits(PyObject *op, void *closure) {
    return PyLong_FromSsize_t(((Replay *)op)->hits);
}

static PyGetSetDef replay_getset[] = {
    {"hits", Replay_hits, NULL, "calls this object replayed (int)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int Replay_traverse(PyObject *op, visitproc visit, void *arg) {
    Py_VISIT(((Replay *)op)->spec);
    return 0;
}

static int Replay_clear(PyObject *op) {
    Replay *self = (Replay *)op;
    Py_CLEAR(self->spec);
    return 0;
}

static void Replay_dealloc(PyObject *op) {
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    Replay_clear(op);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(op);
    Py_DECREF(tp);
}

/* Every row of `rows` a tuple of `n` items, or a ValueError naming `what`. */
static int check_rows(PyObject *rows, Py_ssize_t n, const char *what) {
    Py_ssize_t i;
    for (i = 0; i < PyTuple_Size(rows); i++) {
        PyObject *t = PyTuple_GetItem(rows, i);
        if (!PyTuple_Check(t) || PyTuple_Size(t) != n) {
            PyErr_Format(PyExc_ValueError, "Replay: each of %s must be a tuple of %d items", what, (int)n);
            return -1;
        }
    }
    return 0;
}

/* The shape of the checks and updates, checked once here so that a call reads only well-formed rows
 * (a short row would hand NULL to the C API: a crash, or a set that deletes the attribute): layouts
 * (names, values) of one length, attrs (obj, name, expected, mode 0 / 1 / 2, an int expected for 2),
 * items (container, key, expected), counts (obj, name), sets (obj, name, value), names str, returns
 * callable.  -1 with ValueError / TypeError set when one is not. */
static int check_spec(PyObject *layouts, PyObject *attrs, PyObject *items, PyObject *counts, PyObject *sets,
                      PyObject *returns) {
    PyObject *named[3] = {attrs, counts, sets};
    Py_ssize_t i, k;
    if (check_rows(layouts, 2, "layouts") < 0 || check_rows(attrs, 4, "attrs") < 0 ||
        check_rows(items, 3, "items") < 0 || check_rows(counts, 2, "counts") < 0 || check_rows(sets, 3, "sets") < 0)
        return -1;
    for (i = 0; i < PyTuple_Size(layouts); i++) {
        PyObject *t = PyTuple_GetItem(layouts, i), *a = PyTuple_GetItem(t, 0), *w = PyTuple_GetItem(t, 1);
        if (!PyTuple_Check(a) || !PyTuple_Check(w) || PyTuple_Size(a) != PyTuple_Size(w)) {
            PyErr_SetString(PyExc_ValueError, "Replay: each layout must be (names, values), two tuples of one length");
            return -1;
        }
    }
    for (i = 0; i < PyTuple_Size(attrs); i++) {
        PyObject *t = PyTuple_GetItem(attrs, i), *mode = PyTuple_GetItem(t, 3);
        long m = PyLong_Check(mode) ? PyLong_AsLong(mode) : -1;
        if (m < 0 || m > 2 || (m == 2 && !PyLong_Check(PyTuple_GetItem(t, 2)))) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "Replay: an attribute check's mode must be 0, 1 or 2 (2 with an int)");
            return -1;
        }
    }
    for (k = 0; k < 3; k++)
        for (i = 0; i < PyTuple_Size(named[k]); i++)
            if (!PyUnicode_Check(PyTuple_GetItem(PyTuple_GetItem(named[k], i), 1))) {
                PyErr_SetString(PyExc_TypeError, "Replay: attribute names must be str");
                return -1;
            }
    if (!PyCallable_Check(returns)) {
        PyErr_SetString(PyExc_TypeError, "Replay: returns must be callable");
        return -1;
    }
    return 0;
}

static PyObject *Replay_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long launch, capturing, current, exec, stream;
    int device;
    Replay *self;
    PyObject *owner, *locks, *names, *values, *layouts, *writeable, *attrs, *items, *counts, *sets, *returns, *env;
    if (kwargs != NULL && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Replay takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "KKKKKiOO!O!O!O!O!O!O!O!O!OO", &launch, &capturing, &current, &exec, &stream,
                          &device, &owner, &PyTuple_Type, &locks, &PyTuple_Type, &names, &PyTuple_Type, &values,
                          &PyTuple_Type, &layouts, &PyTuple_Type, &writeable, &PyTuple_Type, &attrs, &PyTuple_Type,
                          &items, &PyTuple_Type, &counts, &PyTuple_Type, &sets, &returns, &env))
        return NULL;
    if (!launch || !capturing || !current) {
        PyErr_SetString(PyExc_ValueError, "Replay: a runtime function address is 0");
        return NULL;
    }
    if (PyTuple_Size(names) != PyTuple_Size(values) || PyTuple_Size(names) != PyTuple_Size(layouts)) {
        PyErr_SetString(PyExc_ValueError, "Replay: names, values and layouts differ in length");
        return NULL;
    }
    if (check_spec(layouts, attrs, items, counts, sets, returns) < 0)
        return NULL;
    self = (Replay *)((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(args);
    self->spec = args;
    self->launch = (launch_fn)(uintptr_t)launch;
    self->capturing = (capturing_fn)(uintptr_t)capturing;
    self->current_device = (device_fn)(uintptr_t)current;
    self->exec = (void *)(uintptr_t)exec;
    self->stream = (void *)(uintptr_t)stream;
    self->device = device;
    self->stream_obj = PyTuple_GetItem(args, 4);
    self->queue_owner = owner;
    self->locks = locks;
    self->n_params = PyTuple_Size(names);
    self->names = names, self->values = values, self->layouts = layouts, self->writeable = writeable;
    self->attrs = attrs, self->items = items, self->counts = counts, self->sets = sets;
    self->returns = returns, self->env = env;
    self->hits = 0;
    return (PyObject *)self;
}

static PyType_Slot replay_slots[] = {
    {Py_tp_doc, "Replay(launch, capturing, current_device, exec, stream, device, queue_owner, locks, names, "
                "values, layouts, writeable, attrs, items, counts, sets, returns, env): see mgx_graph/graph/replay.py"},
    {Py_tp_new, Replay_new},
    {Py_tp_call, Replay_call},
    {Py_tp_getset, replay_getset},
    {Py_tp_traverse, Replay_traverse},
    {Py_tp_clear, Replay_clear},
    {Py_tp_dealloc, Replay_dealloc},
    {0, NULL},
};

static PyType_Spec replay_spec = {"mgx_graph._native.Replay", sizeof(Replay), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, replay_slots};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "_native",
                                           "The repeated replay of a one-region program in one C call.", -1,
                                           NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module), *t;
    if (m == NULL)
        return NULL;
    t = PyType_FromSpec(&replay_spec);
    if (t == NULL || PyModule_AddObject(m, "Replay", t) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
