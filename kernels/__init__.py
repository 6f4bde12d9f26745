"""Triton kernels for the hot loop, each with a pure-torch reference of the same signature.

The wrappers run Triton on CUDA tensors and the reference elsewhere (AUTOSPEC_KERNELS forces
one). A call may pass launch knobs (BLOCK_V, num_warps, num_stages); unset ones take the
kernel's defaults.

Installed, this folder is `autospec.kernels`. Run from the repository root (`python -m ...`,
pytest), the root is on sys.path and this folder would also answer `import kernels` — the
name of the Hugging Face `kernels` distribution, which transformers (>= 5.25 depends on it)
imports when it is installed. Imported under that name, the folder hands the import on to the
distribution, so transformers gets what it asked for. Where the distribution is not installed
(transformers 5.19, which vLLM's CPU build pins, does not depend on it), the folder answers as
an empty namespace: no `__file__`, no version, no submodules — what transformers' package check
reads as "not installed" (`_is_package_available`) — where raising here would fail every
`import transformers.modeling_utils` run from the repository root.
"""
if __name__ == "kernels":  # found as a top-level package: the distribution's name, not ours
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is None:  # not installed: an empty namespace, as transformers reads one
        __file__ = None
        __path__ = []
    else:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _module
        _spec.loader.exec_module(_module)
else:
    from autospec.kernels.verify import greedy_verify, greedy_verify_reference, greedy_verify_triton

    __all__ = ["greedy_verify", "greedy_verify_reference", "greedy_verify_triton"]
