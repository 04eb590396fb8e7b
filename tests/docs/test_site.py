"""The documentation cannot break or slide back into history: the site builds offline with
``mkdocs build --strict`` (a broken link, a missing page or a bad nav entry fails it), every
page under docs/ is in the site, the README stays a front page, and nothing in the README or
docs/ is organised by issue number."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_site_builds_strictly_and_offline_with_every_page(tmp_path):
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    nav = (site / "index.html").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        html = page.relative_to(ROOT / "docs").with_suffix(".html")
        assert (site / html).exists(), f"{page} was not built"
        assert str(html) in nav, f"{page} is built but not in the navigation"
    for built in site.rglob("*.html"):
        text = built.read_text(encoding="utf-8")
        loads = re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(https?://[^\"]+)\"", text)
        assert not loads, f"{built} loads {loads} from the network"


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    (docs / "user").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\nSee [nothing](user/missing.md).\n")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    (docs / ".nav.yml").write_text("nav:\n  - index.md\n")
    (tmp_path / "mkdocs.yml").write_text(config)
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode != 0 and "missing.md" in build.stderr


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 15_000
    assert "make run" in readme.split("\n## ")[0] and "make test" in readme.split("\n## ")[0]


def test_nothing_is_organised_by_issue_number():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in documents()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "\n".join(found)
