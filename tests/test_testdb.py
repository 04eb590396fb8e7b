"""The suite's cheap uses of its test database (tests/testdb.py) leave each test what Django
would: an empty database after a transactional test, and a module's shared rows, untouched by
the module's other tests."""

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from compute.models import VirtualMachine
from tenants.models import Project
from tests.factories import make_project, make_template, make_vm
from tests.testdb import module_rows

# The transactional test comes first: ``module_rows`` holds a transaction open from the first
# test that asks for it to the end of the module.


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_flush_between_transactional_tests_empties_every_table():
    assert connection.ops.sql_flush.__func__.by_delete
    project = make_project()
    make_vm(project, template=make_template(gpus=1))  # rows that point at each other
    assert VirtualMachine.objects.exists()
    # What TransactionTestCase runs after each test, without the rows post_migrate makes again.
    call_command(
        "flush", verbosity=0, interactive=False, reset_sequences=False, inhibit_post_migrate=True
    )
    left = [m.__name__ for m in apps.get_models() if m._meta.managed and m.objects.exists()]
    assert left == []


@pytest.fixture(scope="module")
def shared(django_db_setup, django_db_blocker):
    with module_rows(django_db_blocker, lambda: make_project(slug="shared-by-the-module")) as p:
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
