"""Topology parsing on real captures of several machine shapes, and malformed input."""
from pathlib import Path

import pytest

from hwlab.core import topology as T

CAPTURES = Path(T.__file__).parents[1] / "recorded" / "topology"


def load(name):
    return T.parse_topo_matrix((CAPTURES / name).read_text(), source=name)


def test_every_capture_parses_symmetric_with_x_on_diagonal():
    files = sorted(CAPTURES.glob("*.txt"))
    assert len(files) >= 5
    for f in files:
        t = T.parse_topo_matrix(f.read_text(), source=f.name)
        assert t.n_gpus >= 1
        for a in t.gpus + t.nics:
            assert t.links[(a, a)] == "X"
            for b in t.gpus + t.nics:
                assert t.links[(a, b)] == t.links[(b, a)]


def test_dgx1_hybrid_cube_mesh():
    t = load("dgx1_v100_hybrid_cube_mesh.txt")
    assert t.gpu_link_classes() == {"NV1", "NV2", "SYS"}
    assert t.link(0, 3) == "NV2" and t.link(0, 1) == "NV1" and t.link(0, 5) == "SYS"
    assert t.nics == ["mlx5_0"] and t.link("mlx5_0", 2) == "PIX"
    assert t.cpu_affinity["GPU4"] == "12-23,36-47"
    assert t.slowest_link([0, 1, 2, 3]) == "NV1"
    assert t.slowest_link([0, 4, 5]) == "SYS"


def test_nvswitch_box_with_nics_and_nic_legend():
    t = load("b300x8_nvswitch_8nic.txt")
    assert t.gpu_link_classes() == {"NV18"}
    assert len(t.nics) == 8 and t.nic_names["NIC7"] == "mlx5_bond_7"
    assert t.link("GPU0", "NIC0") == "PXB" and t.link("GPU0", "NIC4") == "SYS"
    assert t.numa_groups() == {0: ["GPU0", "GPU1", "GPU2", "GPU3"],
                               1: ["GPU4", "GPU5", "GPU6", "GPU7"]}


def test_two_socket_pcie_servers():
    t = load("rtx4090x8_pcie_2socket.txt")  # tab-separated, cells padded " X "
    assert t.gpu_link_classes() == {"SYS"}
    assert t.link("GPU6", "NIC0") == "PHB" and t.numa_affinity["GPU7"] == 1
    p = load("pcie4_2socket_pix_sys.txt")
    assert p.link(0, 1) == "PIX" and p.link(1, 2) == "SYS"
    assert p.numa_affinity == {"GPU0": 0, "GPU1": 0, "GPU2": 1, "GPU3": 1}


def test_h100_four_socket_and_own_h200_capture_with_ansi():
    t = load("h100x8_nvswitch_4socket.txt")
    assert t.cpu_affinity["GPU4"] == "96-191,288-383" and t.gpu_link_classes() == {"NV18"}
    h = load("h200x1_vm.txt")
    assert "\x1b[" in (CAPTURES / "h200x1_vm.txt").read_text()
    assert h.gpus == ["GPU0"] and h.numa_affinity == {"GPU0": 0} and h.slowest_link([0]) == "X"


def test_link_order_fastest_to_slowest():
    cells = ["SYS", "PIX", "NV4", "NODE", "PHB", "NV18", "PXB", "SOC"]
    assert sorted(cells, key=T.link_rank) == ["NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]
    with pytest.raises(ValueError, match="unknown link class"):
        T.link_rank("FAST")


GOOD = """        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV4     0-15    0
GPU1    NV4      X      0-15    0
"""


def test_old_soc_name_is_sys():
    t = T.parse_topo_matrix(GOOD.replace("NV4", "SOC"))
    assert t.link(0, 1) == "SYS"


@pytest.mark.parametrize("bad,match", [
    (GOOD.replace("GPU1    NV4      X", "GPU1    NV4      Y"), r"line 3: row GPU1, column GPU1: 'Y'"),
    (GOOD.replace("GPU0     X      NV4", "GPU0     X      PIX"), "asymmetric"),
    ("\n".join(GOOD.splitlines()[:2]) + "\n", "rows missing for GPU1"),
    (GOOD.replace("GPU1    NV4      X      0-15    0", "GPU1    NV4"), "line 3: row GPU1 has 1 link cells"),
    (GOOD.replace("GPU1    NV4 ", "GPU9    NV4 "), "line 3: row 'GPU9'"),
    ("Mon Dec 1 nvidia-smi failed\n", "no header line"),
    (GOOD.replace("GPU0     X      NV4", "GPU0    NV4     NV4"), "diagonal"),
])
def test_malformed_tables_name_the_line(bad, match):
    with pytest.raises(T.TopologyParseError, match=match):
        T.parse_topo_matrix(bad)


def test_from_nvml_with_fake_two_gpus():
    import types

    class NotSupported(Exception):
        pass

    buses = ["0000:01:00.0", "0000:02:00.0"]
    m = types.SimpleNamespace(NVML_NVLINK_MAX_LINKS=2)
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=buses[h])
    m.nvmlDeviceGetNvLinkState = lambda h, link: 1
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=buses[1 - h])
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50

    def numa(h):
        raise NotSupported()
    m.nvmlDeviceGetNumaNodeId = numa
    t = T.from_nvml(m)
    assert t.link(0, 1) == "NV2" and t.numa_affinity == {"GPU0": None, "GPU1": None}
    m.nvmlDeviceGetNvLinkState = lambda h, link: (_ for _ in ()).throw(NotSupported())
    assert T.from_nvml(m).link(0, 1) == "SYS"


def test_round_trip_dict():
    t = load("dgx1_v100_hybrid_cube_mesh.txt")
    assert T.Topology.from_dict(t.to_dict()).links == t.links


def test_capture_falls_back_from_unreadable_smi_text_to_nvml_then_absent(monkeypatch, tmp_path):
    """The one topology capture: a saved file wins; nvidia-smi text that does not parse is kept
    with its error and NVML answers instead; with neither the capture says absent."""
    saved = Path(T.__file__).parents[1] / "recorded" / "topology" / "h200x1_vm.txt"
    cap = T.capture(saved)
    assert cap.topo.n_gpus == 1 and cap.text == saved.read_text() and cap.source.startswith("injected")
    bad = tmp_path / "topo.txt"
    bad.write_text("not a matrix\n")
    from hwlab.errors import UserInputError
    with pytest.raises(UserInputError, match="topo.txt"):
        T.capture(bad)
    with pytest.raises(UserInputError, match="does not exist"):
        T.capture(tmp_path / "missing.txt")
    nvml_topo = T.Topology(gpus=["GPU0"], source="nvml")
    monkeypatch.setattr(T, "capture_topo_text", lambda: "garbage\n")
    monkeypatch.setattr(T, "from_nvml", lambda: nvml_topo)
    cap = T.capture()
    assert cap.topo is nvml_topo and cap.source == "nvml" and cap.error and cap.text == "garbage\n"
    monkeypatch.setattr(T, "from_nvml", lambda: None)
    monkeypatch.setattr(T, "capture_topo_text", lambda: None)
    cap = T.capture()
    assert cap.topo is None and cap.source.startswith(T.ABSENT) and cap.error is None
    monkeypatch.setattr(T, "capture_topo_text", lambda: saved.read_text())
    cap = T.capture()
    assert cap.source == T.SMI_SOURCE and cap.topo.n_gpus == 1 and cap.error is None
