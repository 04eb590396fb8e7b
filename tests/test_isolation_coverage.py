"""Every endpoint on the project router must have an isolation contract test."""

import importlib
import pkgutil

import tests
from controlplane.api.urls import project_router
from tests.isolation import ProjectEndpointContract


def _contracts():
    for module in pkgutil.walk_packages(tests.__path__, "tests."):
        if module.name.rsplit(".", 1)[-1].startswith("test_"):
            importlib.import_module(module.name)

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    return {c.basename for c in walk(ProjectEndpointContract) if c.basename}


def test_every_project_endpoint_has_an_isolation_contract():
    registered = {basename for _prefix, _viewset, basename in project_router.registry}
    assert registered, "the project router is empty"
    missing = registered - _contracts()
    assert not missing, f"project endpoints without an isolation contract: {sorted(missing)}"


def test_every_project_endpoint_is_project_scoped():
    from controlplane.api.viewsets import ProjectScopedViewSet

    for prefix, viewset, _basename in project_router.registry:
        assert issubclass(viewset, ProjectScopedViewSet), prefix
