"""Test data. Projects and memberships are made through the services, as the API makes them."""

import itertools

import factory

from tenants import services
from tenants.choices import Role
from tenants.models import User

_seq = itertools.count(1)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.ac.jp")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery-staple")

    @classmethod
    def _after_postgeneration(cls, instance, create, results=None):
        if create:
            instance.save()


def make_project(owner=None, **fields):
    n = next(_seq)
    owner = owner or UserFactory()
    return services.project_create(
        slug=fields.pop("slug", f"proj-{n:04d}"),
        name=fields.pop("name", f"Project {n}"),
        owner=owner,
        **fields,
    )


def add_member(project, user=None, role=Role.MEMBER):
    user = user or UserFactory()
    services.membership_add(project=project, user=user, role=role)
    return user


def token_for(user, project=None) -> str:
    return services.token_create(user=user, name="test", project=project)[1]
