"""Deprecated (one release): controllers by name moved to autospec.controller.factory."""
from autospec.controller.factory import NAMES, make_controller

make_policy = make_controller

__all__ = ["NAMES", "make_controller", "make_policy"]
