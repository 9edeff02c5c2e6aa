/* The fuzz targets' CPython: isolated, without site, Python's allocator off (PYTHONMALLOC=malloc: ASan
 * sees every object), the extension under test compiled in and imported. NULL if the import failed. */
#ifndef VKACT_FUZZ_EMBEDDED_PYTHON_H
#define VKACT_FUZZ_EMBEDDED_PYTHON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

static PyObject *embedded_module(const char *name, PyObject *(*init)(void)) {
    PyPreConfig pre;
    PyPreConfig_InitIsolatedConfig(&pre);
    pre.allocator = PYMEM_ALLOCATOR_MALLOC;
    if (PyStatus_Exception(Py_PreInitialize(&pre))) abort();
    if (PyImport_AppendInittab(name, init) < 0) abort();
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.site_import = 0;
    if (PyStatus_Exception(Py_InitializeFromConfig(&config))) abort();
    PyConfig_Clear(&config);
    return PyImport_ImportModule(name);
}

#endif
