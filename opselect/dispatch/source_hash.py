"""A backend's source hash, derived from its code.

The tune cache trusts a measured timing only while the code that was timed is unchanged, so the
hash must cover everything a launch runs: the kernels the backend launches, every @triton.jit
function they call (transitively, wherever it is defined), the module-level constants they read
(`tl.constexpr` globals such as a workspace width), the host module that plans and launches
them, and the environment switches those modules read. Nothing here is a hand-kept list: the
closure is found by reading each jit function's source (the same walk Triton's own
`JITFunction.cache_key` does for compiled kernels, and one that also works under the
interpreter, whose functions have no cache key).

Roots of a backend: every jit function defined in the module of its class, and every kernel of
a `Launcher` that module holds (shared kernels imported from elsewhere, such as a common
backward pass). With one module per backend, editing a helper re-measures exactly the backends
whose kernels reach it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import sys
import textwrap
from types import ModuleType
from typing import Any

from triton.runtime.jit import KernelInterface


def is_jit(obj: Any) -> bool:
    return isinstance(obj, KernelInterface) and callable(getattr(obj, "fn", None))


def _python_function(jit: Any):
    return jit.fn


def _source(jit: Any) -> str:
    src = getattr(jit, "src", None)  # compiled JITFunction keeps it; the interpreter does not
    if src is None:
        src = _function_source(_python_function(jit))
    return src


@functools.lru_cache(maxsize=None)
def _function_source(fn) -> str:
    return textwrap.dedent(inspect.getsource(fn))




def qualified_name(jit: Any) -> str:
    fn = _python_function(jit)
    return f"{fn.__module__}.{fn.__qualname__}"


# id(jit) -> (jit, its references): parsing is the slow part; holding jit keeps its id unique.
_REFERENCES: dict[int, tuple] = {}


def _referenced(jit: Any) -> list[tuple[str, Any]]:
    memo = _REFERENCES.get(id(jit))
    if memo is None:
        memo = _REFERENCES[id(jit)] = (jit, _parse_references(jit))
    return memo[1]


def _parse_references(jit: Any) -> list[tuple[str, Any]]:
    """(name, value) of each global the function's body names, resolved in its module; a dotted
    name (`helpers._cavg`) is followed through modules."""
    fn = _python_function(jit)
    scope = fn.__globals__
    tree = ast.parse(_function_source(fn))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = []
            base = node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in scope:
                continue
            value = scope[base.id]
            name = base.id
            for attr in reversed(chain):
                if not isinstance(value, ModuleType):
                    break
                value = getattr(value, attr, None)
                name = f"{name}.{attr}"
                found.append((name, value))
        elif isinstance(node, ast.Name) and node.id in scope:
            found.append((node.id, scope[node.id]))
    return found


def _constant(value: Any) -> str | None:
    """The text a module-level constant contributes, or None if it is not one a kernel reads."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        return repr(value.value)
    if isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, tl.dtype):
        return str(value)
    return None


def closure(roots) -> dict[str, str]:
    """{qualified name: source} of every jit function reachable from roots, plus
    {"<module>.<NAME>": value} for each constant global they read."""
    seen: dict[str, str] = {}
    stack = list(roots)
    while stack:
        jit = stack.pop()
        name = qualified_name(jit)
        if name in seen:
            continue
        seen[name] = _source(jit)
        module = _python_function(jit).__module__
        for ref, value in _referenced(jit):
            if is_jit(value):
                stack.append(value)
            else:
                text = _constant(value)
                if text is not None:
                    seen[f"{module}.{ref}"] = f"= {text}"
    return seen


def backend_roots(backend: Any) -> list[Any]:
    """The jit functions a backend's code can launch: every jit function defined in the module
    of its class, every kernel of a Launcher that module holds, and every kernel its host code
    reaches: the names its methods use, followed through the functions and classes of opselect
    they name (a shared `_run` that launches a common backward pass counts), plus any listed in
    the class's `kernels` attribute."""
    from ..kernels._common import Launcher

    roots = list(getattr(backend, "kernels", ()))
    hosts = host_modules(backend)
    for module_name in hosts:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, Launcher):
                roots.append(value.fn)
            elif is_jit(value) and _python_function(value).__module__ == module_name:
                roots.append(value)
    seen: set[int] = set()
    stack: list[Any] = [cls for cls in type(backend).__mro__ if _ours(cls, hosts)]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            stack.extend(v for v in vars(obj).values()
                         if inspect.isfunction(v) or isinstance(v, (staticmethod, classmethod,
                                                                    property)))
            continue
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            stack.extend(f for f in (obj.fget, obj.fset) if f is not None)
            continue
        if not inspect.isfunction(obj):
            continue
        scope = obj.__globals__
        for name in _code_names(obj.__code__):
            value = scope.get(name)
            if isinstance(value, Launcher):
                roots.append(value.fn)
            elif is_jit(value):
                roots.append(value)
            elif (inspect.isfunction(value) or isinstance(value, type)) and _ours(value, hosts):
                stack.append(value)
    return roots


def _ours(obj: Any, hosts: set[str]) -> bool:
    """Host code the walk follows: opselect's (but the Backend contract's), and a plug-in's
    backend modules (`hosts`)."""
    module = getattr(obj, "__module__", "") or ""
    return (module.startswith("opselect.") or module in hosts) and \
        module != "opselect.dispatch.backend"


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):  # nested functions, lambdas, comprehensions
            names |= _code_names(const)
    return names


#: Modules of base classes that hold no kernels and no launch code of a backend.
_NOT_HOSTS = frozenset({"builtins", "abc", "typing", __name__, "opselect.dispatch.backend"})


def host_modules(backend: Any) -> set[str]:
    """Modules of the backend's class and of its base classes (the host code that plans and
    launches its kernels): opselect's, and a plug-in's own modules (a backend defined outside
    opselect, in a user's package or script, is hashed from its module as ours are)."""
    return {cls.__module__ for cls in type(backend).__mro__
            if cls.__module__ not in _NOT_HOSTS}


def _source_of(obj: Any) -> str:
    """obj's source; a module or class without a file (defined at an interactive prompt or in
    `python -c`) is hashed by its name alone, so editing it there is not noticed."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return f"<no source: {getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}>"


def backend_hash(backend: Any) -> str:
    from ..switches import read_by

    h = hashlib.sha256(f"{type(backend).__qualname__}|{backend.revision}".encode())
    covered = closure(backend_roots(backend))
    for name in sorted(covered):
        h.update(f"\n#{name}\n{covered[name]}".encode())
    # The host code: the whole module of the class (its plan and launch code), and the bodies of
    # the opselect classes it derives from (a shared base class, not the rest of its module).
    own = type(backend)
    h.update(_source_of(sys.modules[own.__module__]).encode())
    for cls in own.__mro__[1:]:
        if cls.__module__ in host_modules(backend):
            h.update(_source_of(cls).encode())
    modules = host_modules(backend) | {n.rsplit(".", 1)[0] for n in covered}
    for item in read_by(modules):
        h.update(f"\n${item}".encode())
    return h.hexdigest()[:16]
