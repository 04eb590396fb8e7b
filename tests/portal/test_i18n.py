"""The portal in Japanese and English: the Japanese catalogue covers every portal string, the
language follows the browser's Accept-Language unless the language switch chose one (a
cookie), English stays the default, and the API and the audit log stay English."""

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.models import AuditEvent
from tenants.choices import Role
from tests.factories import make_vm

pytestmark = pytest.mark.django_db

ROOT = Path(settings.BASE_DIR)
CATALOGUE = ROOT / "locale" / "ja" / "LC_MESSAGES" / "django.po"
#: what holds the portal's strings: its Python (views, forms, access) and its templates
PORTAL_SOURCES = ["controlplane/portal", "controlplane/templates/portal"]


def read_po(path: Path) -> list[dict]:
    """The entries of a .po file (header included): msgid, msgstr and flags."""
    entries, entry, key = [], None, None

    def unquote(text: str) -> str:
        return text.strip()[1:-1].encode("raw_unicode_escape").decode("unicode_escape")

    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line.strip():
            if entry is not None:
                entries.append(entry)
            entry, key = None, None
            continue
        entry = entry or {"msgid": "", "msgstr": "", "flags": set()}
        if line.startswith("#,"):
            entry["flags"] |= {f.strip() for f in line[2:].split(",")}
        elif line.startswith("#"):
            continue
        elif line.startswith(("msgid ", "msgstr ")):
            key, _, rest = line.partition(" ")
            entry[key] = unquote(rest)
        elif line.startswith('"') and key:
            entry[key] += unquote(line)
    return entries


@pytest.fixture
def extracted(tmp_path, settings, monkeypatch):
    """The committed catalogue after ``makemessages -l ja`` over a copy of the portal's
    sources: every msgid the portal has today, with the committed translations merged in."""
    for source in PORTAL_SOURCES:
        shutil.copytree(ROOT / source, tmp_path / source)
    target = tmp_path / "locale" / "ja" / "LC_MESSAGES"
    target.mkdir(parents=True)
    shutil.copy(CATALOGUE, target / "django.po")
    settings.LOCALE_PATHS = [tmp_path / "locale"]
    monkeypatch.chdir(tmp_path)
    call_command("makemessages", locale=["ja"], no_obsolete=True, verbosity=0)
    return read_po(target / "django.po")


def test_the_japanese_catalogue_translates_every_portal_string(extracted):
    entries = [e for e in extracted if e["msgid"]]
    assert len(entries) > 500  # the whole portal, not an empty extraction
    untranslated = [e["msgid"] for e in entries if not e["msgstr"].strip()]
    fuzzy = [e["msgid"] for e in entries if "fuzzy" in e["flags"]]
    assert not untranslated, f"msgids without a Japanese msgstr: {untranslated}"
    assert not fuzzy, f"fuzzy entries in locale/ja: {fuzzy}"


def test_the_committed_catalogue_has_no_fuzzy_or_empty_entry():
    entries = [e for e in read_po(CATALOGUE) if e["msgid"]]
    assert entries
    assert not [e["msgid"] for e in entries if "fuzzy" in e["flags"] or not e["msgstr"]]


def test_the_compiled_catalogue_is_not_committed():
    assert "*.mo" in (ROOT / ".gitignore").read_text().splitlines()


def dashboard(project):
    return reverse("portal:dashboard", args=[project.slug])


def test_accept_language_ja_shows_the_portal_in_japanese(login, project):
    client = login(project.owner)
    response = client.get(dashboard(project), HTTP_ACCEPT_LANGUAGE="ja-JP,ja;q=0.9,en;q=0.5")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<html lang="ja">' in html
    for text in ("ダッシュボード", "仮想マシン", "ネットワーク", "請求", "監査ログ", "ログアウト"):
        assert text in html
    assert ">Dashboard<" not in html and ">Audit log<" not in html
    assert response["Content-Language"] == "ja"


def test_accept_language_en_and_none_show_english(login, project):
    client = login(project.owner)
    for header in ({"HTTP_ACCEPT_LANGUAGE": "en-US,en;q=0.9"}, {}):
        html = client.get(dashboard(project), **header).content.decode()
        assert '<html lang="en">' in html
        assert ">Dashboard<" in html and ">Audit log<" in html
        assert "ダッシュボード" not in html


def test_the_language_switch_sets_the_cookie_and_the_next_page_follows_it(login, project):
    client = login(project.owner)
    page = dashboard(project)
    html = client.get(page).content.decode()
    assert 'action="/i18n/setlang/"' in html and 'name="language"' in html

    response = client.post("/i18n/setlang/", {"language": "ja", "next": page})
    assert response.status_code == 302 and response["Location"] == page
    assert response.cookies[settings.LANGUAGE_COOKIE_NAME].value == "ja"
    assert "ダッシュボード" in client.get(page).content.decode()

    # The choice beats the browser's Accept-Language, both ways.
    client.post("/i18n/setlang/", {"language": "en", "next": page})
    html = client.get(page, HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert ">Dashboard<" in html and "ダッシュボード" not in html


def test_the_login_page_follows_accept_language(client):
    html = client.get(reverse("portal:login"), HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "ログイン" in html


def test_the_api_stays_english_whatever_the_client_asks(client):
    response = client.get("/api/v1/projects/", HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code in (401, 403)
    assert "Authentication credentials were not provided." in response.content.decode()
    assert response.get("Content-Language") != "ja"


def test_a_refusal_page_is_japanese_but_its_audit_record_stays_english(
    login, project, users_by_role
):
    reader = users_by_role[Role.READER]
    response = login(reader).post(
        reverse("portal:project-settings", args=[project.slug]),
        {"name": "x"},
        HTTP_ACCEPT_LANGUAGE="ja",
    )
    assert response.status_code == 403
    html = response.content.decode()
    assert "許可されていません" in html and "以上のロールが必要です" in html
    event = AuditEvent.objects.filter(project=project).latest("pk")
    assert event.detail["message"].startswith(f"Your role in project {project.slug} is reader")


def test_form_labels_and_messages_are_translated(login, project):
    client = login(project.owner)
    html = client.get(
        reverse("portal:networks", args=[project.slug]), HTTP_ACCEPT_LANGUAGE="ja"
    ).content.decode()
    assert "外部への通信 (SNAT)" in html  # a form label
    assert "英小文字、数字、ハイフンが使えます。" in html  # a help text
    response = client.post(
        reverse("portal:networks", args=[project.slug]),
        {"name": "net-a", "cidr": "10.9.0.0/24"},
        HTTP_ACCEPT_LANGUAGE="ja",
        follow=True,
    )
    assert "ネットワーク net-a を作成しました。" in response.content.decode()


def test_a_vms_page_names_its_actions_and_script_texts_in_japanese(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="web-1")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    client = login(project.owner)
    page = reverse("portal:vm-detail", args=[project.slug, vm.pk])
    html = client.get(page, HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert 'data-action="stop">停止</button>' in html
    assert 'data-action="reboot">再起動</button>' in html
    console = reverse("portal:vm-console", args=[project.slug, vm.pk])
    html = client.get(console, HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert 'data-text-connected="シリアルコンソールに接続しました。' in html
    html = client.get(page).content.decode()
    assert 'data-action="stop">Stop</button>' in html


def test_catalogues_are_compiled_when_missing_or_stale_and_only_then(tmp_path, settings):
    from controlplane.portal.locale import compile_catalogues

    target = tmp_path / "ja" / "LC_MESSAGES"
    target.mkdir(parents=True)
    shutil.copy(CATALOGUE, target / "django.po")
    settings.LOCALE_PATHS = [tmp_path]
    assert compile_catalogues() == [target / "django.mo"]
    assert (target / "django.mo").stat().st_size > 0
    assert compile_catalogues() == []  # fresh: left alone
    later = (target / "django.mo").stat().st_mtime + 10
    os.utime(target / "django.po", (later, later))
    assert compile_catalogues() == [target / "django.mo"]
    assert not list(target.glob("*.tmp"))
