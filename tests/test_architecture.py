"""The shape of the code, read from its imports with grimp (the graph import-linter builds
on): no two modules of the apps import each other, deferred imports inside functions
included (a cycle broken only by deferring an import is still a cycle), and the host side
(the agent, the drivers, the host tasks and the wire protocol) imports no Django, so an
agent runs on a host without the control plane's stack."""

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("controlplane", "tenants", "compute", "network", "storage")
HOST_SIDE = (
    "controlplane.agent",
    "compute.drivers",
    "network.drivers",
    "storage.drivers",
    "compute.host_tasks",
    "network.host_tasks",
    "storage.host_tasks",
    "compute.protocol",
    "network.protocol",
    "storage.protocol",
)
CONTROL_PLANE_ONLY = ("django", "rest_framework", "drf_spectacular", "psycopg")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*APPS, include_external_packages=True)


def cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is a set of modules that import one another round a loop."""
    modules = sorted(m for m in graph.modules if m.split(".")[0] in APPS)
    ours = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & ours) for m in modules}
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                child = edges[node][i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_module_of_the_apps_imports_one_that_imports_it_back(graph):
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    fake = grimp.ImportGraph()
    for name in ("compute.a", "compute.b", "compute.c", "network.d"):
        fake.add_module(name)
    fake.add_import(importer="compute.a", imported="compute.b")
    fake.add_import(importer="compute.b", imported="compute.c")
    fake.add_import(importer="compute.c", imported="compute.a")
    fake.add_import(importer="compute.c", imported="network.d")
    assert cycles(fake) == [["compute.a", "compute.b", "compute.c"]]


@pytest.mark.parametrize("package", HOST_SIDE)
def test_the_host_side_imports_no_django(graph, package):
    for external in CONTROL_PLANE_ONLY:
        chains = graph.find_shortest_chains(importer=package, imported=external)
        assert not chains, f"{package} reaches {external}: {sorted(chains)[0]}"


def test_the_agent_and_every_driver_import_where_django_is_not_installed():
    """In a fresh interpreter where importing Django (or DRF) fails, as on a host that has
    only the agent's packages."""
    modules = [
        "controlplane.agent.app",
        "compute.host_tasks",
        "network.host_tasks",
        "storage.host_tasks",
        "compute.drivers.libvirt",
        "compute.drivers.fake",
        "network.drivers.linux",
        "storage.drivers.pools",
        "storage.drivers.nfs",
        "storage.drivers.lustre",
    ]
    script = (
        "import importlib.abc, sys\n"
        "class NoDjango(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {CONTROL_PLANE_ONLY!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoDjango())\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print('imported', len(sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("imported")
