"""The GPU heap's allocator choice (iris_core.heap.cuda.choose_allocator) and the processes'
agreement on it, with the driver's answers stubbed: no GPU needed."""

import pytest

from iris_core.errors import IrisError, RankMismatchError
from iris_core.heap import cuda, vmm
from iris_core.heap.rendezvous import DictStore


@pytest.fixture
def offers(monkeypatch):
    """`offers({"vmm", ...})`: the handle kinds every GPU offers, as vmm.supports answers."""

    def set_offered(kinds, gpus=(0, 1, 2, 3)):
        monkeypatch.setattr(vmm, "supports", lambda device, kind: device in gpus and kind in kinds)

    return set_offered


@pytest.mark.parametrize("offered,expected", [({"vmm", "fabric"}, "vmm"), ({"vmm"}, "vmm"), (set(), "malloc")])
def test_auto_exports_through_vmm_where_offered(offers, offered, expected):
    offers(offered)
    assert cuda.choose_allocator("auto", [0], exporting=True) == expected


def test_auto_in_one_process_keeps_cudamalloc_without_asking_the_driver(monkeypatch):
    monkeypatch.setattr(vmm, "supports", lambda device, kind: pytest.fail("asked the driver"))
    assert cuda.choose_allocator("auto", [0, 1], exporting=False) == "malloc"


def test_auto_across_hosts_takes_fabric(offers):
    offers({"vmm", "fabric"})
    assert cuda.choose_allocator("auto", [0], exporting=True, across_hosts=True) == "fabric"
    offers({"vmm"})
    with pytest.raises(IrisError, match="CU_MEM_HANDLE_TYPE_FABRIC.*spans several hosts"):
        cuda.choose_allocator("auto", [0], exporting=True, across_hosts=True)


@pytest.mark.parametrize("requested", ["malloc", "vmm", "fabric"])
def test_explicit_choice_is_kept(offers, requested):
    offers({"vmm", "fabric"})
    assert cuda.choose_allocator(requested, [0, 1], exporting=True) == requested
    assert cuda.choose_allocator(requested, [0, 1], exporting=False) == requested


def test_explicit_vmm_without_driver_support_names_the_attribute(offers):
    offers({"vmm"}, gpus=(0,))
    with pytest.raises(IrisError, match=r"GPU 1 does not offer CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.*"
                                        r"IRIS_HEAP_ALLOCATOR=malloc"):
        cuda.choose_allocator("vmm", [0, 1], exporting=False)


@pytest.mark.parametrize("requested", ["malloc", "vmm"])
def test_one_host_handles_refused_across_hosts(offers, requested):
    offers({"vmm", "fabric"})
    with pytest.raises(IrisError, match=f"'{requested}' reaches the processes of one host only"):
        cuda.choose_allocator(requested, [0], exporting=True, across_hosts=True)


def test_unknown_name():
    with pytest.raises(ValueError, match=r"unknown heap allocator 'cumalloc'.*'auto', 'malloc', 'vmm', 'fabric'"):
        cuda.choose_allocator("cumalloc", [0], exporting=True)


def test_processes_agree():
    store = DictStore()
    store.set("iris/s/heap-allocator/1", b"vmm")
    cuda._agree(store, "s", 0, [1], "vmm", "auto", 1.0)
    assert store.get("iris/s/heap-allocator/0") == b"vmm"


def test_disagreement_names_both_choices():
    store = DictStore()
    store.set("iris/s/heap-allocator/1", b"malloc")
    store.set("iris/s/heap-allocator/2", b"vmm")
    with pytest.raises(RankMismatchError, match=r"rank 0 chose heap allocator 'vmm' \(asked for 'auto'\) but rank 1 "
                                                r"chose 'malloc'.*IRIS_HEAP_ALLOCATOR"):
        cuda._agree(store, "s", 0, [1, 2], "vmm", "auto", 1.0)


def test_vmm_module_imports_without_a_gpu():
    """Nothing of cuda.bindings is touched before a call (the CPU machines have none)."""
    assert set(vmm.KINDS) == {"vmm", "fabric"}
    with pytest.raises(ValueError, match="unknown VMM handle kind"):
        vmm._kind("posix")
