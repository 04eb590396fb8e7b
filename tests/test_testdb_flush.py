"""The flush between transactional tests (tests/testdb.py) leaves an empty database, as
Django's ``TRUNCATE`` would."""

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from compute.models import VirtualMachine
from tests.factories import make_project, make_template, make_vm


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
