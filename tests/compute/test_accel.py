"""How a real host's agent picks KVM or TCG (``compute.drivers.accel``), on fake /dev and
/sys trees so every case is decided whatever this machine is."""

import pytest

from compute.drivers import accel


@pytest.fixture
def host(tmp_path):
    dev, sys_module = tmp_path / "kvm", tmp_path / "module"
    sys_module.mkdir()
    return dev, sys_module


def resolve(setting, host):
    dev, sys_module = host
    return accel.resolve(setting, dev=dev, sys_module=sys_module)


def test_auto_without_a_usable_kvm_device_is_tcg(host):
    chosen = resolve("auto", host)
    assert (chosen.accel, chosen.domain_type) == ("tcg", "qemu")
    assert "cannot be opened" in chosen.reason


def test_auto_on_hardware_kvm_is_kvm(host):
    dev, sys_module = host
    dev.write_bytes(b"")
    (sys_module / "kvm_amd").mkdir()
    (sys_module / "kvm_pvm").mkdir()  # loaded beside hardware KVM: hardware wins
    assert (resolve("auto", host).accel, resolve("", host).domain_type) == ("kvm", "kvm")


def test_auto_on_pvm_alone_is_tcg(host):
    dev, sys_module = host
    dev.write_bytes(b"")
    (sys_module / "kvm_pvm").mkdir()
    chosen = resolve("auto", host)
    assert chosen.accel == "tcg" and "kvm_pvm" in chosen.reason


def test_forced_settings_and_a_bad_one(host):
    assert resolve("kvm", host).accel == "kvm"  # forced, even without /dev/kvm
    assert resolve(" TCG ", host).accel == "tcg"
    with pytest.raises(ValueError, match="KUMO_GUEST_ACCEL"):
        resolve("hvf", host)
