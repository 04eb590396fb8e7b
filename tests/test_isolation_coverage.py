"""Every endpoint on the project router must have an isolation contract test."""

import importlib
import pkgutil

import tests
from controlplane.api.urls import project_router
from tests.isolation import ProjectEndpointContract

FUZZ = "tests.test_api_fuzz"


def _contracts():
    for module in pkgutil.walk_packages(tests.__path__, "tests."):
        # The fuzz test loads the API's schema from the app when imported: no contracts.
        if module.name.rsplit(".", 1)[-1].startswith("test_") and module.name != FUZZ:
            importlib.import_module(module.name)

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    return {c.basename: c for c in walk(ProjectEndpointContract) if c.basename}


def test_every_project_endpoint_has_an_isolation_contract():
    registered = {basename for _prefix, _viewset, basename in project_router.registry}
    assert registered, "the project router is empty"
    missing = registered - set(_contracts())
    assert not missing, f"project endpoints without an isolation contract: {sorted(missing)}"


def test_every_project_endpoint_is_project_scoped():
    from controlplane.api.viewsets import ProjectScopedViewSet

    for prefix, viewset, _basename in project_router.registry:
        assert issubclass(viewset, ProjectScopedViewSet), prefix


def test_every_action_on_a_project_object_is_in_its_contract():
    """A route on one object beyond CRUD (``vms/<id>/reset/``, ``volumes/<id>/attach/``) is
    checked like the object itself: another project's answers 404 exactly like a missing one
    (``ProjectEndpointContract.object_actions``)."""
    contracts = _contracts()
    missing = []
    for _prefix, viewset, basename in project_router.registry:
        declared = {
            (method, suffix.rstrip("/"))
            for method, suffix in getattr(contracts.get(basename), "object_actions", ())
        }
        for action in viewset.get_extra_actions():
            if not action.detail:
                continue
            for method in action.mapping:
                if (method, action.url_path) not in declared:
                    missing.append(f"{basename}: {method.upper()} {action.url_path}/")
    assert not missing, f"actions without an isolation check: {missing}"
