"""Host-side network code: no Django. ``base`` is the contract, ``linux`` the driver,
``netlink`` the one module that writes to the kernel."""
