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
    """Records commands; answers ``lfs quota`` with ``PLAIN``, or fails when told to; keeps
    nodemaps and their ranges as the MGS would, printing them as ``lctl get_param`` does."""

    def __init__(self, fail_on: str = ""):
        self.commands: list[list[str]] = []
        self.fail_on = fail_on
        self.nodemaps: dict[str, list[str]] = {}

    def __call__(self, argv):
        self.commands.append(list(argv))
        if self.fail_on and self.fail_on in argv:
            raise StorageError(f"lfs {self.fail_on}: Operation not permitted")
        if argv[0] == "lctl":
            return self.lctl(argv[1:])
        # lfs names the file system as it was given
        return PLAIN.replace("/fast", argv[-1]) if argv[1] == "quota" else ""

    def lctl(self, args):
        if args[0] == "get_param":
            name = args[2].split(".")[1]
            if name not in self.nodemaps:
                raise StorageError(f"error: get_param: param_path 'nodemap/{name}/ranges'")
            rows = [
                f" {{ id: {i}, start_nid: {nid}, end_nid: {nid} }}"
                for i, nid in enumerate(self.nodemaps[name], start=1)
            ]
            return "[\n" + ",\n".join(rows) + "\n]\n"
        if args[0] == "nodemap_add":
            self.nodemaps[args[1]] = []
        elif args[0] == "nodemap_del":
            del self.nodemaps[args[1]]
        elif args[0] == "nodemap_add_range":
            self.nodemaps[args[2]].append(args[4])
        elif args[0] == "nodemap_del_range":
            self.nodemaps[args[2]].remove(args[4])
        return ""


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
    assert [c for c in lfs.commands if c[0] == "lfs"] == [
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
    setquota = next(c for c in lfs.commands if c[0] == "lfs")
    assert setquota[:7] == ["lfs", "setquota", "-p", "100001", "-b", "0", "-B"]
    assert setquota[7] == "0"


def test_a_refused_lfs_is_a_storage_error(tmp_path):
    (tmp_path / "fast").mkdir()
    driver = LustreShareDriver(str(tmp_path / "fast"), run=Lfs(fail_on="setquota"))
    with pytest.raises(StorageError, match="not permitted"):
        driver.ensure_share(ShareSpec(name="s", project_number=7, quota_gib=1))


def test_usage_of_a_missing_share_is_an_error(driver):
    with pytest.raises(StorageError, match="does not exist"):
        driver.usage(ShareSpec(name="nope", project_number=7, quota_gib=1))


def test_a_share_has_a_nodemap_of_exactly_its_clients_and_its_directory(driver, lfs):
    spec = ShareSpec(
        name="genome-1a2b", project_number=100001, quota_gib=10, clients=("10.0.0.5", "10.0.0.6")
    )
    driver.ensure_share(spec)
    nodemap = ["lctl", "nodemap_modify", "--name", "kumo-100001", "--property"]
    assert ["lctl", "nodemap_add", "kumo-100001"] in lfs.commands
    assert [*nodemap, "admin", "--value", "0"] in lfs.commands  # root squashed
    assert [
        "lctl", "nodemap_set_fileset", "--name", "kumo-100001", "--fileset", "/genome-1a2b"
    ] in lfs.commands  # fmt: skip
    assert lfs.nodemaps == {"kumo-100001": ["10.0.0.5@tcp", "10.0.0.6@tcp"]}
    # The project's VMs changed: one went, one came; a repeat changes nothing more.
    moved = ShareSpec(
        name=spec.name, project_number=100001, quota_gib=10, clients=("10.0.0.6", "10.0.0.9")
    )
    driver.ensure_share(moved)
    lfs.commands.clear()
    driver.ensure_share(moved)
    assert lfs.nodemaps == {"kumo-100001": ["10.0.0.6@tcp", "10.0.0.9@tcp"]}
    assert not [c for c in lfs.commands if c[1] in ("nodemap_add_range", "nodemap_del_range")]
    driver.ensure_share_absent(moved)
    driver.ensure_share_absent(moved)
    assert lfs.nodemaps == {}
