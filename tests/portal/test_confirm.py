"""What cannot be undone asks first: the portal's forms that delete a VM (its disk), a
volume, a share, a bucket or an image, or power off or reset a VM, carry the question
(``data-confirm``, asked by ``portal.js`` before the form is sent), naming the object; the
forms of what can be undone carry none. The browser test answers one both ways."""

import html
import re

import pytest
from django.urls import reverse

from compute.choices import VmState
from compute.models import VirtualMachine
from storage import services as storage
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_image, make_vm
from tests.portal.test_storage_actions import backends  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.django_db


def questions(page) -> dict[str, str]:
    """Each form's action and its question ("" for none)."""
    found = {}
    for form in re.findall(r"<form [^>]*>", page.content.decode()):
        action = re.search(r'action="([^"]*)"', form)
        asks = re.search(r'data-confirm="([^"]*)"', form)
        if action:
            found[action.group(1)] = html.unescape(asks.group(1)) if asks else ""
    return found


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def test_deleting_storage_asks_first_naming_it(login, project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=1000, buckets=5)
    volume = storage.volume_create(project=project, name="scratch", size_gib=10)
    share = storage.share_create(project=project, name="data", tier="fast", quota_gib=10)
    bucket = storage.bucket_create(project=project, name="results", quota_gib=10)
    asked = questions(login(cloud["users"][Role.MEMBER]).get(url("storage", project)))
    assert asked[url("volume-delete", project, pk=volume.pk)] == (
        "Delete volume scratch and the data on it? This cannot be undone."
    )
    assert asked[url("share-delete", project, pk=share.pk)] == (
        "Delete share data and every file in it? This cannot be undone."
    )
    assert asked[url("bucket-delete", project, pk=bucket.pk)] == (
        "Delete bucket results and every object in it? This cannot be undone."
    )
    assert asked[url("volume-extend", project, pk=volume.pk)] == ""  # undone by nothing lost


def test_deleting_an_image_asks_first(login, project, cloud):
    image = make_image(name="mine", project=project)
    asked = questions(login(cloud["users"][Role.MEMBER]).get(url("images", project)))
    assert asked[url("image-delete", project, pk=image.pk)] == (
        "Delete image mine? Its file goes from the image store."
    )


def test_a_vms_delete_power_off_and_reset_ask_first_its_stop_does_not(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="train-1")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    page = login(cloud["users"][Role.MEMBER]).get(url("vm-detail", project, pk=vm.pk))
    asked = questions(page)

    def action(name):
        return asked[url("vm-action", project, pk=vm.pk, action=name)]

    assert action("delete") == "Delete VM train-1? Its disk and everything on it go with it."
    assert action("power_off").startswith("Power off VM train-1 without shutting it down?")
    assert action("reset").startswith("Reset VM train-1? It restarts at once")
    assert action("stop") == "" and action("reboot") == ""


def test_the_questions_are_in_japanese_for_a_japanese_reader(login, project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=1000)
    volume = storage.volume_create(project=project, name="scratch", size_gib=10)
    client = login(cloud["users"][Role.MEMBER])
    page = client.get(url("storage", project), HTTP_ACCEPT_LANGUAGE="ja")
    asked = questions(page)[url("volume-delete", project, pk=volume.pk)]
    assert "scratch" in asked and "Delete" not in asked


def test_a_vms_buttons_and_questions_are_in_japanese_for_a_japanese_reader(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="train-1")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    client = login(cloud["users"][Role.MEMBER])
    page = client.get(url("vm-detail", project, pk=vm.pk), HTTP_ACCEPT_LANGUAGE="ja")
    delete = url("vm-action", project, pk=vm.pk, action="delete")
    asked = questions(page)[delete]
    assert asked.startswith("VM train-1 を削除しますか") and "Delete" not in asked
    text = page.content.decode()
    assert 'data-action="delete" class="danger">削除</button>' in text
    assert 'data-action="stop">停止</button>' in text
