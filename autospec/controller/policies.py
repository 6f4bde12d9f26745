"""Deprecated (one release): controllers by name are autospec.controller.factory's, from a
parsed autospec.method.Method."""
import importlib

from autospec.controller.factory import NAMES, make_controller


def make_policy(name, *args, **kwargs):
    """make_controller for a method's text."""
    method = importlib.import_module("autospec.method").parse_method(name)
    return make_controller(method, *args, **kwargs)


__all__ = ["NAMES", "make_controller", "make_policy"]
