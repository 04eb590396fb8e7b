"""A module's rows made once (tests/testdb.py) are seen by each of its tests as they were
made, untouched by the module's other tests; a module with transactional tests cannot have
them. (The flush between transactional tests: ``test_testdb_flush.py``.)"""

import types
from types import SimpleNamespace

import pytest

from tenants.models import Project
from tests.factories import make_project
from tests.testdb import module_rows


@pytest.fixture(scope="module")
def shared(request, django_db_setup, django_db_blocker):
    made = lambda: make_project(slug="shared-by-the-module")  # noqa: E731
    with module_rows(request, django_db_blocker, made) as p:
        yield p


@pytest.mark.django_db
def test_a_test_sees_the_modules_rows_and_writes_its_own(shared):
    assert Project.objects.get(pk=shared.pk).slug == "shared-by-the-module"
    make_project(slug="written-by-one-test")
    Project.objects.filter(pk=shared.pk).update(name="changed by one test")


@pytest.mark.django_db
def test_the_next_test_sees_the_modules_rows_as_made_and_nothing_of_the_test_before(shared):
    assert Project.objects.get(pk=shared.pk).name != "changed by one test"
    assert not Project.objects.filter(slug="written-by-one-test").exists()


class _Item:
    """As much of a collected test as ``module_rows`` reads."""

    cls = None

    def __init__(self, module, name, marker=None, fixturenames=()):
        self.module, self.name, self.marker = module, name, marker
        self.fixturenames = fixturenames

    def get_closest_marker(self, name):
        return self.marker if name == "django_db" else None


@pytest.mark.parametrize(
    "commits",
    [
        _Item(None, "test_commits", pytest.mark.django_db(transaction=True).mark),
        _Item(None, "test_commits", pytest.mark.django_db(True).mark),
        _Item(None, "test_commits", fixturenames=("transactional_db",)),
        _Item(None, "test_commits", fixturenames=("live_server",)),
    ],
    ids=["marker", "marker-positional", "transactional_db", "live_server"],
)
def test_a_module_with_a_transactional_test_cannot_make_rows_once(commits, django_db_blocker):
    module = types.ModuleType("tests.a_module")
    commits.module = module
    elsewhere = _Item(types.ModuleType("tests.b_module"), "test_elsewhere", commits.marker)
    items = [_Item(module, "test_reads", pytest.mark.django_db().mark), commits, elsewhere]
    request = SimpleNamespace(module=module, session=SimpleNamespace(items=items))
    with (
        pytest.raises(pytest.UsageError, match=r"\['test_commits'\]"),
        module_rows(request, django_db_blocker, lambda: pytest.fail("made rows")),
    ):
        pass
