"""The Lustre share driver: the ``lfs`` commands it builds and its reading of ``lfs quota``
output, in the formats real ``lfs`` prints (a plain row; the row wrapped after a long
file system name; ``*`` over a limit; the "default quota" note after it). No Lustre here:
``run`` records the commands and answers like ``lfs``."""

import pytest

from storage.drivers.base import GIB, ShareSpec, StorageError
from storage.drivers.lustre import LustreShareDriver, parse_quota

PLAIN = """Disk quotas for prj 100001 (pid 100001):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
          /fast  524288       0 10485760       -     211       0       0       -
"""
WRAPPED = """Disk quotas for prj 100002 (pid 100002):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lustre/fast/projects
                1225350212       0 2147483648       -  714982       0       0       -
pid 100002 is using default file quota setting
"""
OVER = """Disk quotas for prj 100003 (pid 100003):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
         /large 1048580*      0 1048576       -       3       0       0       -
"""


def test_parse_a_plain_row():
    assert parse_quota(PLAIN, "/fast") == (524288, 10485760)


def test_parse_a_row_wrapped_after_a_long_name():
    assert parse_quota(WRAPPED, "/lustre/fast/projects") == (1225350212, 2147483648)


def test_parse_a_row_over_its_limit():
    assert parse_quota(OVER, "/large") == (1048580, 1048576)


def test_output_without_the_root_is_an_error():
    with pytest.raises(StorageError, match="no usage row"):
        parse_quota(PLAIN, "/large")


class Lfs:
    """Records commands; answers ``lfs quota`` with ``PLAIN``, or fails when told to."""

    def __init__(self, fail_on: str = ""):
        self.commands: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv):
        self.commands.append(list(argv))
        if self.fail_on and self.fail_on in argv:
            raise StorageError(f"lfs {self.fail_on}: Operation not permitted")
        # lfs names the file system as it was given
        return PLAIN.replace("/fast", argv[-1]) if argv[1] == "quota" else ""


@pytest.fixture
def lfs():
    return Lfs()


@pytest.fixture
def driver(tmp_path, lfs):
    (tmp_path / "fast").mkdir()
    return LustreShareDriver(str(tmp_path / "fast"), run=lfs)


def test_ensure_share_tags_the_directory_sets_the_hard_limit_and_reads_usage(driver, lfs, tmp_path):
    root = str(tmp_path / "fast")
    usage = driver.ensure_share(ShareSpec(name="genome-1a2b", project_number=100001, quota_gib=10))
    assert (tmp_path / "fast" / "genome-1a2b").is_dir()
    assert lfs.commands == [
        ["lfs", "project", "-p", "100001", "-s", "-r", f"{root}/genome-1a2b"],
        ["lfs", "setquota", "-p", "100001", "-b", "0", "-B", f"{10 * GIB // 1024}k", root],
        ["lfs", "quota", "-p", "100001", root],
    ]
    assert usage.used_bytes == 524288 * 1024 and usage.limit_bytes == 10485760 * 1024


def test_absent_removes_the_directory_and_clears_the_limit(driver, lfs, tmp_path):
    spec = ShareSpec(name="genome-1a2b", project_number=100001, quota_gib=10)
    driver.ensure_share(spec)
    (tmp_path / "fast" / "genome-1a2b" / "data").write_text("x")
    lfs.commands.clear()
    driver.ensure_share_absent(spec)
    driver.ensure_share_absent(spec)
    assert not (tmp_path / "fast" / "genome-1a2b").exists()
    assert lfs.commands[0][:7] == ["lfs", "setquota", "-p", "100001", "-b", "0", "-B"]
    assert lfs.commands[0][7] == "0"


def test_a_refused_lfs_is_a_storage_error(tmp_path):
    (tmp_path / "fast").mkdir()
    driver = LustreShareDriver(str(tmp_path / "fast"), run=Lfs(fail_on="setquota"))
    with pytest.raises(StorageError, match="not permitted"):
        driver.ensure_share(ShareSpec(name="s", project_number=7, quota_gib=1))


def test_usage_of_a_missing_share_is_an_error(driver):
    with pytest.raises(StorageError, match="does not exist"):
        driver.usage(ShareSpec(name="nope", project_number=7, quota_gib=1))
