"""The remote-execution properties of a `gpu_test` (pure: unit-tested by //rules/tests:exec_props_test).

A remote executor (BuildGrid, Buildbarn, BuildBuddy, EngFlow, Google RBE...) picks
a worker whose platform matches an action's properties (docs/REMOTE.md). Locally
they are ignored; with --remote_cache they are part of the action's remote key
(the Action's platform), so a result recorded on one pool is never served for
another.
"""

# The keys, fixed so that an executor can be configured once for every gpu_test.
GPUS_KEY = "gpus"
GPU_KIND_KEY = "gpu-kind"

# "Pool" (capital P) is the key BuildBuddy, EngFlow and Google RBE route on.
POOL_KEY = "Pool"

_VALUE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/"

def _problem(attr, msg):
    return struct(attr = attr, msg = msg)

def _check_value(attr, value):
    if type(value) != "string":
        return _problem(attr, "must be a string, got %s" % type(value))
    if not value:
        return _problem(attr, "must not be empty (omit it instead)")
    for c in value.elems():
        if c not in _VALUE_CHARS:
            return _problem(attr, "%r: only letters, digits and . _ - : / are allowed" % value)
    return None

def gpu_exec_properties(gpus, gpu_kind, pool, given):
    """The `exec_properties` of a gpu_test: returns struct(props, problems).

    Args:
      gpus: the declared GPU count (an int, already validated).
      gpu_kind: None or the GPU model a worker must have (e.g. "a100-80gb"); needs gpus > 0.
      pool: None or the executor pool to run on.
      given: None or the caller's own `exec_properties` (a dict); its other keys are
        kept, and it may repeat a derived key only with the same value.

    `props` has `gpus` (when gpus > 0), `gpu-kind` (when given) and `Pool` (when
    given), plus the caller's keys; an empty dict when there is nothing to say.
    """
    problems = []
    props = {}
    if gpus > 0:
        props[GPUS_KEY] = str(gpus)
    if gpu_kind != None:
        p = _check_value("gpu_kind", gpu_kind)
        if p:
            problems.append(p)
        elif gpus <= 0:
            problems.append(_problem("gpu_kind", "%r needs gpus > 0 (the test declares gpus = %d)" % (gpu_kind, gpus)))
        else:
            props[GPU_KIND_KEY] = gpu_kind
    if pool != None:
        p = _check_value("pool", pool)
        if p:
            problems.append(p)
        else:
            props[POOL_KEY] = pool
    if given == None:
        given = {}
    if type(given) != "dict":
        problems.append(_problem("exec_properties", "must be a plain dict (a select() cannot be merged with gpus, gpu_kind and pool), got %s" % type(given)))
        return struct(props = props, problems = problems)
    for key in sorted(given.keys()):
        value = given[key]
        if type(key) != "string" or type(value) != "string":
            problems.append(_problem("exec_properties", "%r: keys and values must be strings" % key))
        elif key in props and props[key] != value:
            problems.append(_problem("exec_properties", "%r = %r contradicts the declaration (%r); declare it with gpus, gpu_kind or pool" % (key, value, props[key])))
        else:
            props[key] = value
    return struct(props = props, problems = problems)
